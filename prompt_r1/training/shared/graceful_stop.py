"""Ctrl-C or SIGTERM during training: finish the step in flight, save a checkpoint, stop.

A cluster that preempts a job, a container being stopped, `kill`: each sends SIGTERM and, a grace period later,
SIGKILL. Stopping at once would lose every step since the last scheduled checkpoint. So the first SIGTERM or
SIGINT only asks the trainer to stop at the end of the step it is in: that step finishes, a checkpoint of it is
saved (whatever `save_strategy` says), and the command exits 143 (130 for Ctrl-C) saying where the checkpoint is;
`--resume` goes on from it. A second signal stops at once, as before (the call ledger still spares the calls the
step had paid for).

Under `accelerate launch` every rank gets the signal from the launcher, not necessarily at the same moment; the
ranks agree at each step's end (the largest of their flags, over the process group), so all of them save the same
step and stop together.

    stop = GracefulStop.install(trainer)   # in the main thread, around trainer.train()
    try:
        trainer.train()
    finally:
        stop.uninstall()
    stop.signal, stop.step                 # "SIGTERM", 12: stopped after step 12 (None: it ran to its end)
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from transformers import TrainerCallback

from prompt_r1.core import signals

__all__ = ["GracefulStop", "graceful_stop_of"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop(TrainerCallback):
    """See the module docstring. `signal`: the name of the first signal that arrived (None: none); `step`: the step
    after which training stopped for it (None: it ran to its end); `checkpoint`: the folder saved then."""

    def __init__(self, stream: Any = None) -> None:
        self.signal: str | None = None
        self.step: int | None = None
        self.checkpoint: str | None = None
        self.stream = stream
        self._previous: dict[int, Any] = {}

    @classmethod
    def install(cls, trainer: Any, stream: Any = None) -> GracefulStop:
        stop = cls(stream)
        trainer.add_callback(stop)
        if (
            threading.current_thread() is threading.main_thread()
        ):  # signal handlers live in the main thread only
            for signum in _SIGNALS:
                stop._previous[signum] = signal.signal(signum, stop._on_signal)
        return stop

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        signals.note(name)
        if self.signal is not None:  # the second one: stop now
            raise KeyboardInterrupt
        self.signal = name
        print(
            f"prompt-r1: {name}: finishing this step and saving a checkpoint, then stopping; send it again to stop "
            "at once",
            file=self.stream or sys.stderr,
            flush=True,
        )

    def on_step_end(self, args, state, control, **kwargs):
        if not _any_rank(self.signal is not None, args):
            return
        if state.global_step >= state.max_steps:  # that was the last step: the run ends and saves as usual
            print(f"prompt-r1: {self.signal or 'the signal'} came with the last step: finishing the run",
                  file=self.stream or sys.stderr, flush=True)  # fmt: skip
            return
        self.step = state.global_step
        # Another rank's signal, when none arrived here: the launcher sends every rank the same one.
        self.signal = self.signal or "SIGTERM"
        control.should_save = True
        control.should_training_stop = True
        # No evaluation inside a grace period; and under save_strategy "best" an evaluation decides whether to
        # save, which could leave the stop with no checkpoint at all.
        control.should_evaluate = False

    def on_save(self, args, state, control, **kwargs):
        if self.step is not None:
            self.checkpoint = f"{args.output_dir}/checkpoint-{state.global_step}"


def _any_rank(flag: bool, args: Any) -> bool:
    """True when `flag` holds on any rank of the process group (all ranks call this at every step's end)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    import torch

    device = "cpu" if dist.get_backend() == "gloo" else args.device
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def graceful_stop_of(trainer: Any) -> GracefulStop | None:
    """The trainer's `GracefulStop` when a signal stopped its run, else None."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, GracefulStop) and callback.step is not None:
            return callback
    return None
