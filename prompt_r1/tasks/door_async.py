"""The door-codes task (`prompt_r1.tasks.door_codes`) under the asynchronous trainer: a table per group of episodes.

The synchronous rollout redraws the task's table at every step (`DoorRollout`). The asynchronous worker keeps
groups in flight across steps, so there each group plays a table of its own, drawn from the run's seed and the
group's index (`DoorTable.group_codes`):
- the worker tags each episode with its group (`rollout_group` in the run config's metadata);
- `GroupKeyedEnvironment` (`prompt_r1.tasks.skeleton_async`) names that group in the system message of every
  environment request (`table_mark`),
  and the scripted environment (`door_environment`) answers from the group's table;
- `door_worker_options` gives the worker the group's golden answers from the same table, and the door figures
  (`door/asked_right`, `door/correct`, `door/correct_from_reply`) of each episode against it, which the trainer
  averages per step as the synchronous rollout logs them.
No policy that ignores the reply does better than a guess (1 in 8): every group's table is drawn afresh.

    with ScriptedServer({"env": door_environment(table)}) as env:
        trainer = door_async_trainer(config, table, rows)     # config: grpo_config(..., async_grpo=True, ...)
        trainer.train()

`evaluate` measures an agent folder (before or after training) with the synchronous rollout's `control`, the
same code on the same held-out table as the synchronous benchmark. Needs the `train`, `dev` and `vllm` extras.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prompt_r1.tasks.door_codes import DoorTable, named_doors, table_mark
from prompt_r1.tasks.door_training import DOOR_METRICS, door_figures
from prompt_r1.tasks.skeleton_async import group_keyed_trainer, run_async

__all__ = [
    "door_async_trainer",
    "door_worker_options",
    "evaluate",
    "train_async",
]


def door_worker_options(table: DoorTable) -> dict[str, Any]:
    """`GraphRolloutWorker` options for the task: each group's golden answers from its own table, and each
    episode's door figures (1.0 or 0.0) against that table."""

    def group_row(group: int, row: dict[str, Any]) -> dict[str, Any]:
        door = named_doors(_question(row))[0]
        return {**row, "golden_answers": [table.group_codes(group)[door]]}

    def episode_metrics(group: int, row: dict[str, Any], episode: Any) -> dict[str, float]:
        figures = door_figures(episode, table.group_codes(group))
        return {name: float(value) for name, value in zip(DOOR_METRICS, figures, strict=True)}

    return {"group_row": group_row, "episode_metrics": episode_metrics}


def _question(row: dict[str, Any]) -> str:
    from prompt_r1.training.shared.trajectories import question_of

    return question_of(row["prompt"])


def door_async_trainer(config: Any, table: DoorTable, rows: list[dict[str, Any]]) -> Any:
    """The async trainer of `config` (`grpo_config(..., async_grpo=True, vllm_server_base_url=...)`) on the task,
    its environment the scripted server at `config.env_base_url` answering from `table` (`door_environment`)."""
    return group_keyed_trainer(config, rows, door_worker_options(table), mark=table_mark)


def evaluate(
    model: str | Path, table: DoorTable, env_base_url: str, output_dir: str | Path, *, seed: int, step: int
) -> dict[str, float]:
    """`control` of the agent at `model`, as the synchronous benchmark evaluates its trainer's policy: the same
    settings (`grpo_config`, `seed`), the same held-out table (`step`) and sampling seeds. The environment at
    `env_base_url` must answer from `table` (`door_environment`)."""
    from prompt_r1.tasks.door_codes import training_rows
    from prompt_r1.tasks.door_training import control, door_trainer, grpo_config

    config = grpo_config(output_dir, model, env_base_url, max_steps=1, seed=seed, data_seed=seed)
    trainer = door_trainer(config, table, training_rows(config.per_device_train_batch_size, seed=seed))
    return control(trainer, trainer.rollout_func, step=step)


def train_async(
    model: str | Path,
    table: DoorTable,
    rows: list[dict[str, Any]],
    env_base_url: str,
    output_dir: str | Path,
    *,
    seed: int,
    held_out_step: int,
    launch: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Train the agent at `model` with the async trainer against the scripted environment at `env_base_url`
    (answering from `table`): `run_async` with the door-codes task's config, trainer and evaluation (`launch`: as
    `run_async`'s, for a run across processes)."""
    from prompt_r1.tasks.door_training import grpo_config

    def measure(agent: str | Path) -> dict[str, float]:
        return evaluate(agent, table, env_base_url, Path(output_dir) / "eval", seed=seed, step=held_out_step)

    return run_async(
        model,
        output_dir,
        configure=lambda **kw: grpo_config(output_dir, model, env_base_url, **kw),
        build=lambda config: door_async_trainer(config, table, rows),
        measure=measure,
        seed=seed,
        launch=launch,
        **settings,
    )
