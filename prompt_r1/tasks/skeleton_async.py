"""What every task shares under the asynchronous trainer: an environment keyed by the episode's group, the task's
async trainer, and the run that serves its policy with vLLM.

The async worker keeps groups of episodes in flight across steps, so a task's facts are drawn per group, not per
step (door codes: a table per group; hops: a chain table per group; notes: a sheet per group). The worker tags
each episode with its group (`rollout_group` in the run config's metadata); `GroupKeyedEnvironment` gives the
environment that group's facts; the task's worker options give the group's golden answers and the episode's
figures from the same facts (`door_async.door_worker_options`, `hops_async`, `notes_async.GroupSheets`).

    trainer = group_keyed_trainer(config, rows, worker_options, mark=table_mark)  # or system=sheet_of_group
    result = run_async(model, out, configure=..., build=..., measure=..., seed=seed)  # serve, train, stop
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["GroupKeyedEnvironment", "group_keyed_trainer", "run_async"]


class GroupKeyedEnvironment:
    """An environment client whose every request names its episode's group, read from the `rollout_group` the async
    worker puts in the episode's run config: appended to the system message (`mark(group)`: door codes' table
    mark), or as the whole system message (`system(group)`: the notes task's sheet). Calls without a group go
    through unchanged."""

    def __init__(
        self,
        inner: Any,
        mark: Callable[[int], str] | None = None,
        *,
        system: Callable[[int], str] | None = None,
    ) -> None:
        if (mark is None) == (system is None):
            raise TypeError("GroupKeyedEnvironment takes one of mark or system")
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
