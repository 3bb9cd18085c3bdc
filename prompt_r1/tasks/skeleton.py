"""What every training task shares: a rollout that draws the task's facts before each step, gives the step's gold
answers to the reward, and logs the task's figures per step.

A task subclasses `TaskRollout` and gives only what is its own:
- `metrics`: the names of its figures (logged as `task/name` in the trainer's metrics, a mean per step);
- `draw(prompts, trainer)`: the step's facts (a table redrawn from the step, the sheets around the questions);
- `golden(facts, episodes)`: each episode's gold answers under those facts;
- `figures(episode, facts)`: the episode's figures, a value per name in `metrics` (None where one does not apply:
  a mean is over the episodes that have it);
- `shape(output)`: optionally, a change to the trajectories (an ablation's mask) before they go to the trainer.

    class DoorRollout(TaskRollout):
        metrics = DOOR_METRICS
        def draw(self, prompts, trainer): return self.table.draw(trainer.state.global_step)
        ...

`task_config(defaults, settings)` is every task's trainer config: the run settings all share (`RUN_DEFAULTS`), the
task's, then the caller's. The door-codes, hops and notes tasks are built on both (`door_training`, `hops_training`,
`notes_training`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from prompt_r1.runs.episode import Episode
from prompt_r1.training.sync.rollout import GraphRollout

__all__ = ["TaskRollout", "log_means", "task_config"]

# What every task's trainer config holds: a line per step, no reporting service, no checkpoints, the CPU.
RUN_DEFAULTS: dict[str, Any] = dict(
    logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0, data_seed=0
)


def task_config(defaults: dict[str, Any], settings: dict[str, Any]) -> Any:
    """A task's trainer config: `RUN_DEFAULTS`, then the task's `defaults`, then the caller's `settings`
    (`async_grpo=True` among them: the async trainer's config). A built-in trained agent as the policy (named, or
    the folder made from it) brings the cap on a turn it was trained with in place of the task's, unless the
    caller names one."""
    from prompt_r1.agents.builtin import trained_turn_tokens
    from prompt_r1.training.run import trainer_config

    merged = {**RUN_DEFAULTS, **defaults, **settings}
    cap = trained_turn_tokens(merged.get("model_name_or_path", ""))
    if cap is not None and "max_turn_tokens" not in settings:
        merged["max_turn_tokens"] = cap
    return trainer_config(**merged)


def log_means(trainer: Any, names: Sequence[str], figures: Sequence[dict[str, float | None]]) -> None:
    """Log each figure's mean over the step's episodes of every process (those it applies to) into the trainer's
    metrics (train or eval, as the model is)."""
    metrics = getattr(trainer, "_metrics", None)
    if metrics is None:
        return
    import torch

    sums = [sum(f[name] or 0.0 for f in figures if f.get(name) is not None) for name in names]
    counts = [float(sum(f.get(name) is not None for f in figures)) for name in names]
    local = torch.tensor(sums + counts, dtype=torch.float64, device=trainer.accelerator.device)
    total = (
        trainer.accelerator.reduce(local, reduction="sum") if trainer.accelerator.num_processes > 1 else local
    )
    values = total.tolist()
    mode = "train" if trainer.model.training else "eval"
    n = len(names)
    for name, value, count in zip(names, values[:n], values[n:], strict=True):
        metrics[mode][name].append(value / count if count else math.nan)


class TaskRollout(GraphRollout):
    """`GraphRollout` for a task whose facts are drawn before each step (see the module docstring)."""

    metrics: tuple[str, ...] = ()

    def draw(self, prompts: list[Any], trainer: Any) -> Any:
        raise NotImplementedError

    def golden(self, facts: Any, episodes: list[Episode]) -> list[list[str]]:
        raise NotImplementedError

    def figures(self, episode: Episode, facts: Any) -> dict[str, float | None]:
        raise NotImplementedError

    def shape(self, output: dict[str, list]) -> dict[str, list]:
        return output

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        facts = self.draw(prompts, trainer)
        output = super().__call__(prompts, trainer)
        output["golden_answers"] = self.golden(facts, self.last_results)
        log_means(trainer, self.metrics, [self.figures(e, facts) for e in self.last_results])
        return self.shape(output)
