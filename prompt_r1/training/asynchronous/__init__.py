"""The asynchronous GRPO trainer: TRL's `AsyncGRPOTrainer`, the LangGraph loop as its rollout worker.

- `config`: `PromptR1AsyncGRPOConfig`, TRL's `AsyncGRPOConfig` with the Prompt-R1 fields both trainers share
  (`prompt_r1.training.shared.config`); the settings of the synchronous trainer it does not have are refused in
  one line each, with what to do instead.
- `trainer`: `build_async_trainer`, and the checkpointed place of the worker in the data.
- `worker`: `GraphRolloutWorker`, groups of episodes sampled from a vLLM server while the trainer trains.
- `weight_transfer`: the trained weights to that server after every step (TRL's NCCL client on CUDA, a file
  without it).
- `on_cpu`: what TRL's async trainer assumes of a GPU, replaced so that it trains on CPU.
- `step_times`: where each step's seconds went, for the step lines: the worker's per group, the trainer's per step.

Where a change goes:
- add a trainer option (this trainer only): a field of `PromptR1AsyncGRPOConfig` in `config.py` with its help
  and check, read in `trainer.py` or `worker.py`; a range in `shared/checks.py` `RANGES` if it is a number.
- add a rollout figure (logged per step): the worker's `metrics_queue` measures in `worker.py`, or a task's
  `episode_metrics` worker option (prompt_r1.tasks.door_async).
- add a reward: `prompt_r1/scoring/rewards.py`, listed in `shared/rewards.py` (both trainers score with it).

May import `prompt_r1.training.shared` and the layers below training; never `prompt_r1.training.sync`.
"""
