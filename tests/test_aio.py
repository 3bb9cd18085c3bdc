"""prompt_r1.core.aio: synchronous work beside the event loop (the prompt optimisers' packages run this way)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from prompt_r1.core.aio import StopWorker, in_worker_thread


def test_the_worker_thread_runs_its_coroutines_on_the_callers_loop():
    async def where() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    async def main():
        loop = asyncio.get_running_loop()
        found = await in_worker_thread(lambda call: [call(where()) for _ in range(3)])
        return loop, found

    loop, found = asyncio.run(main())
    assert found == [loop] * 3


def test_a_cancelled_caller_stops_its_worker_thread_instead_of_leaving_it_waiting():
    ended, stopped = threading.Event(), []

    def work(call):
        try:
            call(asyncio.sleep(30))
        except StopWorker:
            stopped.append(True)
            raise
        finally:
            ended.set()

    async def main():
        task = asyncio.create_task(in_worker_thread(work))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        started = time.monotonic()
        while not ended.is_set() and time.monotonic() - started < 5:
            await asyncio.sleep(0.05)  # the loop stays alive: the thread must notice the stop by itself

    asyncio.run(main())
    assert ended.is_set() and stopped == [True]
