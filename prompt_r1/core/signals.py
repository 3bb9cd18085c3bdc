"""SIGTERM, what service managers, containers and `kill` send, stops every long-running command as Ctrl-C does.

Python's default leaves SIGTERM to the operating system, which ends the process at once: no rows written for what
was in flight, no summary, no word, exit 143; a server drops its requests mid-answer. `prompt-r1` (cli.main)
installs `sigterm_as_sigint` around each command instead, so SIGTERM takes the road SIGINT takes wherever the
command is: the worker pool's and the server's own handlers (which name the signal they got), asyncio's
(cancel the running task, then KeyboardInterrupt), or a plain KeyboardInterrupt. `received()` then tells the
command which signal it was, to say so and to exit with its code: 130 for SIGINT, 143 for SIGTERM (128 + the
signal's number, as a shell reports a process the signal ended).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["EXIT_CODES", "Terminated", "exit_code", "received", "restoring", "sigterm_as_sigint"]

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}
_received: list[str] = []


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived where no handler of SIGINT's could take it (SIGINT ignored, as in a background job)."""


def received() -> str:
    """The stop signal the command got last: "SIGTERM", else "SIGINT" (Ctrl-C, or none seen)."""
    return _received[-1] if _received else "SIGINT"


def note(name: str) -> None:
    """Record that `name` arrived (the pool's and the server's own handlers call it)."""
    _received.append(name)


def exit_code(name: str | None = None) -> int:
    return EXIT_CODES.get(name or received(), 130)


def _on_sigterm(signum: int, frame: object) -> None:
    note("SIGTERM")
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        raise Terminated
    signal.raise_signal(signal.SIGINT)  # whatever handles Ctrl-C now handles this too


@contextlib.contextmanager
def sigterm_as_sigint() -> Iterator[None]:
    """Within the block (in the main thread only: signals are delivered there), SIGTERM acts as SIGINT."""
    _received.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def restoring(*signums: int) -> Iterator[None]:
    """Put back the handlers of `signums` after the block: asyncio's `remove_signal_handler` resets a signal to
    its default (for SIGTERM: end the process at once) rather than to the handler that was there before."""
    previous = {signum: signal.getsignal(signum) for signum in signums}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)
