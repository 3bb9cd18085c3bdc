"""The synchronous GRPO trainer: TRL's `GRPOTrainer` with the LangGraph loop as its `rollout_func`.

- `config`: `PromptR1GRPOConfig`, TRL's `GRPOConfig` with the Prompt-R1 fields both trainers share
  (`prompt_r1.training.shared.config`) and this trainer's own (the spend cap, the call ledger, reproducible
  rollouts, the vLLM sync check).
- `trainer`: `build_trainer`, the trainer with the rollout, the reward, the spend cap and the progress lines.
- `rollout`: `GraphRollout`, one episode of the loop per prompt, sampled with the trainer's own policy (`policy`:
  the model itself, TRL's colocated vLLM engine or its vLLM server).
- `weight_sync`: the trained weights into that vLLM engine or server when TRL's own sync cannot (no CUDA).

Where a change goes:
- add a trainer option (this trainer only): a field of `PromptR1GRPOConfig` in `config.py` with its help and its
  check in `__post_init__`, read where it acts (`trainer.py`, `rollout.py`); a range in `shared/checks.py`
  `RANGES` if it is a number. It is then a flag of `prompt-r1 train` and a recipe key by itself.
- add a rollout figure (logged per step): `rollout.py` `log_episode_metrics`, or a task's rollout subclass.
- add a reward: `prompt_r1/scoring/rewards.py`, listed in `shared/rewards.py` (both trainers score with it).

May import `prompt_r1.training.shared` and the layers below training; never `prompt_r1.training.asynchronous`.
"""
