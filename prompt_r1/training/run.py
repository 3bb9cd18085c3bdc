"""Running a training to the end, whichever trainer its config is for: `train(config)`, what `prompt-r1 train`
runs; and `trainer_config`, the config of the trainer asked for.

    train(PromptR1GRPOConfig(...))         # the synchronous trainer (prompt_r1.training.sync)
    train(PromptR1AsyncGRPOConfig(...))    # the asynchronous one (prompt_r1.training.asynchronous)
    train(trainer_config(async_grpo=True, output_dir=..., vllm_server_base_url=...))   # the same, by a flag

One run per output folder; a damaged checkpoint refused in one line before anything loads; Ctrl-C or SIGTERM
stops after the step in flight with a checkpoint; the model saved to output_dir at the end. Under `accelerate
launch`, each rank calls `leave_process_group()` before it exits.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from prompt_r1.core.errors import ConfigError

__all__ = ["leave_process_group", "train", "trainer_config"]


def trainer_config(*, async_grpo: bool = False, **values: Any) -> Any:
    """The config of the trainer `async_grpo` names, built (and so checked) from `values`:
    `PromptR1AsyncGRPOConfig` or `PromptR1GRPOConfig`. A key that trainer does not have is one `ConfigError`
    line naming it."""
    if async_grpo:
        from prompt_r1.training.asynchronous.config import PromptR1AsyncGRPOConfig

        return PromptR1AsyncGRPOConfig(**values)
    from prompt_r1.training.sync.config import PromptR1GRPOConfig

    return PromptR1GRPOConfig(**values)


def train(
    config: Any,
    *,
    resume: bool = False,
    allow_changed_settings: bool = False,
    build: Callable[..., Any] | None = None,
    task: dict[str, Any] | None = None,
    **build_kwargs: Any,
) -> Any:
    """Train and save the agent (or its adapter) to `config.output_dir`; `resume` continues from the last checkpoint.
    `build`: the trainer's builder (default: the one the config is for, `build_trainer` or `build_async_trainer`). Ctrl-C or
    SIGTERM stops after the step in flight with a checkpoint of it (`prompt_r1.training.shared.graceful_stop`); the model
    is then not saved to output_dir, and `graceful_stop_of(trainer)` says which signal, step and checkpoint.
    A second run on the same output_dir while this one runs is refused (`OutputError`). The run's manifest is
    written to output_dir (`training.shared.run_manifest`; `task`: a built-in task's settings, which it records in
    place of train_data); a resumed run whose settings differ from it is refused naming them, unless
    `allow_changed_settings`."""
    from prompt_r1.runs.output_lock import hold_output

    # One run per output folder, held to the end: a second is refused before a model loads or a call is paid. The
    # ranks of one run share the folder, so its first process alone holds the lock (a refused rank 0 ends the
    # launch).
    with (
        hold_output(config.output_dir, "output_dir", folder=True)
        if config.process_index == 0
        else nullcontext()
    ):
        return _train(config, resume, build, build_kwargs, allow_changed_settings, task)


def _train(
    config: Any,
    resume: bool,
    build: Callable[..., Any] | None,
    build_kwargs: dict,
    allow_changed: bool = False,
    task: dict[str, Any] | None = None,
) -> Any:
    """`train`, with the output folder held."""
    from transformers.trainer_utils import get_last_checkpoint

    from prompt_r1.training.shared.graceful_stop import GracefulStop

    checkpoint = config.resume_from_checkpoint
    if resume and checkpoint is None:
        if Path(config.output_dir).is_dir():
            checkpoint = get_last_checkpoint(config.output_dir)
        if checkpoint is None:
            raise ConfigError(f"--resume: no checkpoint-* folder in {config.output_dir}")
    if checkpoint is not None:  # a damaged file is one line now, not a traceback once the model has loaded
        from prompt_r1.training.shared.ledger import ledger_path
        from prompt_r1.training.shared.resume import check_ledger_for_resume, check_resume_checkpoint

        check_resume_checkpoint(checkpoint)
        if getattr(config, "call_ledger", False):  # the synchronous trainer's
            check_ledger_for_resume(checkpoint, ledger_path(config.output_dir, config.process_index))
    from prompt_r1.training.shared.run_manifest import train_manifest

    # Before the model loads: a resumed run under other settings is one line, and nothing is written.
    train_manifest(config, resume=checkpoint is not None, allow_changed=allow_changed, task=task)
    trainer = (build or _builder(config))(config, **build_kwargs)
    if checkpoint is not None:
        from prompt_r1.training.shared.spend import check_resumed_ledger

        check_resumed_ledger(trainer, checkpoint)  # fewer calls than the checkpoint logged: one line, no step
    stop = GracefulStop.install(trainer)  # Ctrl-C / SIGTERM: finish the step, save a checkpoint, stop
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    finally:
        stop.uninstall()
    if stop.step is not None:  # the checkpoint is the result; a grace period is no time for a second save
        return trainer
    trainer.save_model(config.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(config.output_dir)
    return trainer


def _builder(config: Any) -> Callable[..., Any]:
    """The builder of the trainer `config` is for (each config class says which, as `async_grpo`)."""
    if getattr(config, "async_grpo", False):
        from prompt_r1.training.asynchronous.trainer import build_async_trainer

        return build_async_trainer
    from prompt_r1.training.sync.trainer import build_trainer

    return build_trainer


def leave_process_group() -> None:
    """Under `accelerate launch` (or any torch process group), wait for every rank, then leave the group, before the
    process exits: a gloo group still alive at interpreter exit can abort a rank ("terminate called without an
    active exception") after the run succeeded, and the launch then fails. Nothing outside a process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
