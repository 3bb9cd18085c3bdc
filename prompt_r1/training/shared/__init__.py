"""What both GRPO trainers use: the Prompt-R1 fields of their configs, the checks, the data, the reward, LoRA, the
trajectories of episodes, the progress lines, the graceful stop, resuming, and the environment's bill.

- `config`: the fields both configs share (agent, data, loop, environment `env_*`, reward, prices) and their
  checks; `checks`: every number in range, the output folder usable, checked when a config is built.
- `rows`, `rewards`, `lora`: the training rows, the reward functions, the LoRA adapter (and `merge_adapter`).
- `trajectories`: `Trajectories`, episodes as TRL's token-exact trajectories; `question_of`.
- `progress`: a line per step and the curves; `graceful_stop`: Ctrl-C or SIGTERM ends with a checkpoint;
  `resume`: a damaged checkpoint refused before anything loads.
- `ledger`, `spend`: every environment call recorded and never paid twice; the cost per step and the caps
  (used by the synchronous trainer today).
- `vllm_reload`: the vLLM server's worker extension that reloads trained weights from a file (both trainers,
  without CUDA).

Where a change goes:
- add an option both trainers honour: a field in `config.py` `PromptR1Fields` (with help and a check), read in
  both builders; an environment setting is added to `prompt_r1.core.config.EnvironmentConfig` and reaches
  both as `env_<name>` by itself.
- add a reward: `prompt_r1/scoring/rewards.py`, then list it in `rewards.py`.
- add a progress figure: `progress.py` (its line and its curves read the trainer's logs).

May import the layers below training; never `prompt_r1.training.sync` or `prompt_r1.training.asynchronous`.
"""
