"""The hops task (`prompt_r1.tasks.hops`) under the asynchronous trainer: a table per group of episodes.

As for door codes (`prompt_r1.tasks.door_async`), groups run across steps, so each plays a table of its own
(`HopsTable.group_table`, from the run's seed and the group's index): the worker tags each episode with its group,
`GroupKeyedEnvironment` names it in every request's system message (`hops.table_mark`), the scripted environment
answers from that table, and `hops_worker_options` gives the group's golden answers and each episode's chain
figures from the same one. `train_async` runs the seed's agent through `run_async` and evaluates it before and
after with the synchronous `control`. Needs the `train`, `dev` and `vllm` extras.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from prompt_r1.tasks.hops import HopsTable, named, table_mark
from prompt_r1.tasks.hops_training import hops_figures
from prompt_r1.tasks.skeleton_async import group_keyed_trainer, run_async

__all__ = ["evaluate", "hops_async_trainer", "hops_worker_options", "train_async"]


def hops_worker_options(table: HopsTable) -> dict[str, Any]:
    """`GraphRolloutWorker` options: each group's golden answers from its own table, and each episode's chain
    figures against it (NaN where a figure does not apply: the trainer averages over the samples that have one)."""
    from prompt_r1.training.shared.trajectories import question_of

    def group_row(group: int, row: dict[str, Any]) -> dict[str, Any]:
        start = named(question_of(row["prompt"]))[0]
        return {**row, "golden_answers": [table.group_table(group).answer(start)]}

    def episode_metrics(group: int, row: dict[str, Any], episode: Any) -> dict[str, float]:
        figures = hops_figures(episode, table.group_table(group))
        return {name: math.nan if value is None else value for name, value in figures.items()}

    return {"group_row": group_row, "episode_metrics": episode_metrics}


def hops_async_trainer(config: Any, table: HopsTable, rows: list[dict[str, Any]]) -> Any:
    """The async trainer of `config` on the task, its environment the scripted server at `config.env_base_url`
    answering from `table` (`hops_environment`)."""
    return group_keyed_trainer(config, rows, hops_worker_options(table), mark=table_mark)


def evaluate(
    model: str | Path, table: HopsTable, env_base_url: str, output_dir: str | Path, *, seed: int, step: int
) -> dict[str, Any]:
    """`control` and `first_call_logprob` of the agent at `model`, as the synchronous benchmark measures its
    policy: the same settings, held-out table (`step`) and sampling seeds."""
    from prompt_r1.tasks.hops import training_rows
    from prompt_r1.tasks.hops_training import control, first_call_logprob, grpo_config, hops_trainer

    config = grpo_config(output_dir, model, env_base_url, max_steps=1, seed=seed, data_seed=seed)
    trainer = hops_trainer(config, table, training_rows(config.per_device_train_batch_size, seed=seed))
    return {
        **control(trainer, trainer.rollout_func, step=step),
        "first_call_logprob": first_call_logprob(trainer),
    }


def train_async(
    model: str | Path,
    table: HopsTable,
    rows: list[dict[str, Any]],
    env_base_url: str,
    output_dir: str | Path,
    *,
    seed: int,
    held_out_step: int,
    **settings: Any,
) -> dict[str, Any]:
    """`run_async` on the hops task (see `prompt_r1.tasks.skeleton_async.run_async` for what it returns)."""
    from prompt_r1.tasks.hops_training import grpo_config

    def measure(agent: str | Path) -> dict[str, Any]:
        return evaluate(agent, table, env_base_url, Path(output_dir) / "eval", seed=seed, step=held_out_step)

    return run_async(
        model,
        output_dir,
        configure=lambda **kw: grpo_config(output_dir, model, env_base_url, **kw),
        build=lambda config: hops_async_trainer(config, table, rows),
        measure=measure,
        seed=seed,
        **settings,
    )
