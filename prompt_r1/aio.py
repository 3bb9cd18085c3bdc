"""Running the async loop from synchronous code.

Sync callers (`graph.invoke`, TRL's synchronous `rollout_func`, scripts) submit coroutines to one persistent
event loop in a daemon thread, rather than starting a fresh loop per call: network clients, rate limiters and the
local agent's batcher then live on one loop for the life of the process, and concurrent sync callers share them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["background_loop", "run_sync"]

T = TypeVar("T")
_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """The process-wide event loop thread, started on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="prompt-r1-loop", daemon=True).start()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the background loop and wait for its result (safe inside a running event loop too)."""
    loop = background_loop()
    try:
        if asyncio.get_running_loop() is loop:
            raise RuntimeError("run_sync called from the background loop itself; await the coroutine instead")
    except RuntimeError as exc:
        if "background loop" in str(exc):
            coro.close()
            raise
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
