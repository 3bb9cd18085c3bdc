"""Running the async loop from synchronous code, and synchronous code beside the async loop.

Sync callers (`graph.invoke`, TRL's synchronous `rollout_func`, scripts) submit coroutines to one persistent
event loop in a daemon thread, rather than starting a fresh loop per call: network clients, rate limiters and the
local agent's batcher then live on one loop for the life of the process, and concurrent sync callers share them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["PerLoop", "StopWorker", "background_loop", "in_worker_thread", "run_sync"]

T = TypeVar("T")


class PerLoop(Generic[T]):
    """One value per running event loop, made by `factory` on first use in that loop.

    asyncio primitives and async HTTP connections belong to the loop that created them, so an object shared by
    `graph.invoke` (the background loop) and `graph.ainvoke` (the caller's loop) keeps one of each per loop.
    Entries go away with their loop.
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        value = self._values.get(loop)
        if value is None:
            value = self._values[loop] = self._factory()
        return value


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
    # The coroutine runs in a copy of the caller's context, so context variables set by the caller (LangGraph's
    # stream writer and runtime, tracing parents) are seen on the background loop as they would be inline.
    context = contextvars.copy_context()
    result: concurrent.futures.Future = concurrent.futures.Future()

    def start() -> None:
        task = loop.create_task(coro, context=context)

        def settle(done: asyncio.Task) -> None:
            if done.cancelled():
                result.cancel()
            elif done.exception() is not None:
                result.set_exception(done.exception())
            else:
                result.set_result(done.result())

        task.add_done_callback(settle)

    loop.call_soon_threadsafe(start)
    return result.result()


class StopWorker(BaseException):
    """Raised in `in_worker_thread`'s thread once its caller was cancelled: a BaseException, so that a library's
    `except Exception` does not swallow it and the thread unwinds."""


async def in_worker_thread(work: Callable[[Callable[[Coroutine[Any, Any, Any]], Any]], T]) -> T:
    """Run synchronous `work(call)` in a worker thread while this loop stays free; `call(coroutine)` runs a
    coroutine on this loop and returns its result, so a synchronous library (GEPA, TextGrad) can use the loop's
    clients. When the caller is cancelled (Ctrl-C), the thread's next or pending `call` raises `StopWorker`, so
    the thread ends instead of waiting forever on a loop that has stopped."""
    loop = asyncio.get_running_loop()
    stopped = threading.Event()

    def call(coroutine: Coroutine[Any, Any, Any]) -> Any:
        if stopped.is_set():
            coroutine.close()
            raise StopWorker
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        while True:
            try:
                return future.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                if stopped.is_set():
                    future.cancel()
                    raise StopWorker from None

    try:
        return await asyncio.to_thread(work, call)
    except asyncio.CancelledError:
        stopped.set()
        raise
