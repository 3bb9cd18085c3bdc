"""The door-codes task (`prompt_r1.tasks.door_codes`) under the asynchronous trainer: a table per group of episodes.

The synchronous rollout redraws the task's table at every step (`DoorRollout`). The asynchronous worker keeps
groups in flight across steps, so there each group plays a table of its own, drawn from the run's seed and the
group's index (`DoorTable.group_codes`):
- the worker tags each episode with its group (`rollout_group` in the run config's metadata);
- `GroupKeyedEnvironment` names that group in the system message of every environment request (`table_mark`),
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

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prompt_r1.tasks.door_codes import DoorTable, named_doors, table_mark
from prompt_r1.tasks.door_training import DOOR_METRICS, door_figures

__all__ = [
    "GroupKeyedEnvironment",
    "door_async_trainer",
    "door_worker_options",
    "group_keyed_trainer",
    "evaluate",
    "run_async",
    "train_async",
]


class GroupKeyedEnvironment:
    """An environment client whose every request names its episode's group in the system message (`mark(group)`:
    the task's table mark, door codes' `table_mark` by default), read from the `rollout_group` the async worker
    puts in the episode's run config; or, with `system`, whose system message is the group's own (`system(group)`:
    the notes task's sheet). Calls without a group go through unchanged."""

    def __init__(
        self,
        inner: Any,
        mark: Callable[[int], str] = table_mark,
        *,
        system: Callable[[int], str] | None = None,
    ) -> None:
        self.inner = inner
        self.mark = mark
        self.system = system

    def __getattr__(self, name: str) -> Any:  # the client's meters and settings (its model, for the price)
        return getattr(self.inner, name)

    async def respond(
        self,
        prompt: str,
        history: Sequence[tuple[str, str]] = (),
        *,
        run_config: Any = None,
        system_prompt: str | None = None,
    ) -> Any:
        group = ((run_config or {}).get("metadata") or {}).get("rollout_group")
        if group is not None and self.system is not None:
            system_prompt = self.system(int(group))
        elif group is not None:
            system_prompt = f"{system_prompt or self.inner.system_prompt}\n{self.mark(int(group))}"
        extra = {} if system_prompt is None else {"system_prompt": system_prompt}
        return await self.inner.respond(prompt, history, run_config=run_config, **extra)


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


def group_keyed_trainer(
    config: Any, rows: list[dict[str, Any]], worker_options: dict[str, Any], **keyed: Any
) -> Any:
    """A task's async trainer: `config`'s environment, each request keyed by its episode's group
    (`GroupKeyedEnvironment(..., **keyed)`: `mark` or `system`), and the task's `worker_options`."""
    from prompt_r1.training.asynchronous.trainer import build_async_trainer

    environment = GroupKeyedEnvironment(config.environment_client(), **keyed)
    return build_async_trainer(
        config, environment=environment, train_rows=rows, worker_options=worker_options
    )


def door_async_trainer(config: Any, table: DoorTable, rows: list[dict[str, Any]]) -> Any:
    """The async trainer of `config` (`grpo_config(..., async_grpo=True, vllm_server_base_url=...)`) on the task,
    its environment the scripted server at `config.env_base_url` answering from `table` (`door_environment`)."""
    return group_keyed_trainer(config, rows, door_worker_options(table))


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


def run_async(
    model: str | Path,
    output_dir: str | Path,
    *,
    configure: Callable[..., Any],
    build: Callable[[Any], Any],
    measure: Callable[[str | Path], Any] | None,
    seed: int,
    launch: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """A task's async training run: `measure(model)` before, the async trainer of `build(configure(**settings))`
    trained with the policy served by a `vllm serve` of its own (seeded with `seed`, always stopped at the end),
    then `measure` of the trained agent (`measure` None: neither, for a task that measures elsewhere). `configure`
    gets `settings` with `async_grpo` and the server's address (it builds the async trainer's config).
    `launch(keywords, final)`, for a run across processes, trains instead of this process: each rank builds the
    config from `configure`'s `keywords` (a config is built once per process), and the model goes to `final`; it
    returns `log_history` and `seconds`. Returns the trainer's `log_history`, the figures before and after, the
    training's seconds, the config, the stopped server's exit code, and the trainer (None with `launch`)."""
    import time

    from prompt_r1.testing.vllm_process import start_vllm_server, stop_vllm_server

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    before = measure(model) if measure is not None else None
    trainer = None
    root, server = start_vllm_server(model, output_dir / "vllm.log", seed=seed)
    try:
        keywords = {
            **{"seed": seed, "data_seed": seed, "bf16": False, **settings},
            "async_grpo": True,
            "vllm_server_base_url": root,
        }
        config = configure(**keywords)
        if launch is not None:
            run = launch(keywords, output_dir / "final")
            log_history, seconds = run["log_history"], run["seconds"]
        else:
            trainer = build(config)
            started = time.monotonic()
            trainer.train()
            seconds = time.monotonic() - started
            trainer.save_model(str(output_dir / "final"))
            log_history = trainer.state.log_history
    finally:
        stop_vllm_server(server)  # with its engine and worker
    after = measure(output_dir / "final") if measure is not None else None
    return {
        "log_history": log_history,
        "before": before,
        "after": after,
        "seconds": seconds,
        "config": config,
        "server_returncode": server.returncode,
        "trainer": trainer,
    }
