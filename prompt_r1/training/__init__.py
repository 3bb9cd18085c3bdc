"""GRPO training of the agent: the LangGraph loop as TRL's rollout generator (needs the `train` extra).

- `GraphRollout`: a `rollout_func` for `trl.GRPOTrainer`, one episode per prompt, token-exact trajectories.
- `PromptR1GRPOConfig`: `GRPOConfig` plus the agent, data, loop, environment and reward settings.
- `build_trainer`, `train`, `merge_adapter`: what `prompt-r1 train` and `prompt-r1 merge` run; `checks`: a
  recipe's whole configuration checked before any model loads.
- `ledger`, `spend`: every environment call of a rollout recorded and never paid twice on resume; the cost per step
  and the `max_env_cost` / `max_env_calls` caps.
- `build_async_trainer` (`async_grpo: true`, `--async`): TRL's AsyncGRPOTrainer with the loop as its rollout
  worker (`async_worker`), its weights synced to the vLLM server (`weight_transfer`), on CPU too (`async_cpu`).

May import: runs, loop, agents, clients, data, scoring, core. Never evaluation, integrations, cli or testing; and
no inference layer imports training.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "GraphRollout",
    "PromptR1GRPOConfig",
    "build_async_trainer",
    "build_trainer",
    "merge_adapter",
    "train",
]

_WHERE = {
    "GraphRollout": "prompt_r1.training.rollout",
    "PromptR1GRPOConfig": "prompt_r1.training.config",
    "build_async_trainer": "prompt_r1.training.async_trainer",
    "build_trainer": "prompt_r1.training.trainer",
    "merge_adapter": "prompt_r1.training.trainer",
    "train": "prompt_r1.training.trainer",
}


def __getattr__(name: str) -> Any:  # heavy imports (trl, torch) only when asked for
    if name not in _WHERE:
        raise AttributeError(f"module 'prompt_r1.training' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
