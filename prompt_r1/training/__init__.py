"""GRPO training of the agent: the LangGraph loop as TRL's rollout generator (needs the `train` extra).

By concern:
- `sync/`: the synchronous trainer, TRL's `GRPOTrainer` with `GraphRollout` as its `rollout_func`
  (`PromptR1GRPOConfig`, `build_trainer`); its policy, and its weight sync to vLLM.
- `asynchronous/`: the asynchronous trainer, TRL's `AsyncGRPOTrainer` with the loop as its rollout worker
  (`PromptR1AsyncGRPOConfig`, `build_async_trainer`; `async: true`, `--async`); its weight transfer to the vLLM
  server, and what it needs on CPU.
- `shared/`: what both use: the config fields they share and their checks, rows, rewards, LoRA, trajectories,
  progress, graceful stop, resume, the call ledger and the spend cap, the vLLM server's reload extension.
- `run`: `train(config)`, a run to its end with the trainer its config is for; `trainer_config(...)`, the config
  of the trainer asked for.

Where a change goes:

| change | where |
| --- | --- |
| add a trainer option, one trainer | its `sync/config.py` or `asynchronous/config.py`, read in its `trainer.py` |
| add a trainer option, both trainers | `shared/config.py` `PromptR1Fields`, read in both builders |
| add a rollout figure | `sync/rollout.py` `log_episode_metrics`; `asynchronous/worker.py` measures |
| add a reward | `prompt_r1/scoring/rewards.py`, listed in `shared/rewards.py` |
| add a progress figure | `shared/progress.py` |

`sync` and `asynchronous` never import each other; both import `shared`, which imports neither (the import
contract in pyproject.toml). May import: runs, loop, agents, clients, data, scoring, core. Never evaluation,
integrations, cli or testing; and no inference layer imports training.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "GraphRollout",
    "PromptR1AsyncGRPOConfig",
    "PromptR1GRPOConfig",
    "build_async_trainer",
    "build_trainer",
    "merge_adapter",
    "train",
    "trainer_config",
]

_WHERE = {
    "GraphRollout": "prompt_r1.training.sync.rollout",
    "PromptR1AsyncGRPOConfig": "prompt_r1.training.asynchronous.config",
    "PromptR1GRPOConfig": "prompt_r1.training.sync.config",
    "build_async_trainer": "prompt_r1.training.asynchronous.trainer",
    "build_trainer": "prompt_r1.training.sync.trainer",
    "merge_adapter": "prompt_r1.training.shared.lora",
    "train": "prompt_r1.training.run",
    "trainer_config": "prompt_r1.training.run",
}


def __getattr__(name: str) -> Any:  # heavy imports (trl, torch) only when asked for
    if name not in _WHERE:
        raise AttributeError(f"module 'prompt_r1.training' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
