"""The rate limiter (prompt_r1.clients.ratelimit): token and request windows, in process."""

from __future__ import annotations

import asyncio
import time

from prompt_r1.clients.ratelimit import EndpointLimiter, TokenWindow
from prompt_r1.testing.servers import max_in_window


def test_token_window_holds_tokens_per_period():
    async def go():
        window = TokenWindow(limit=1000, period=0.4)
        stamps = []

        async def call():
            await window.acquire(300)
            await asyncio.sleep(0.01)
            window.release(300, 250)
            stamps.append((time.monotonic(), 250))

        await asyncio.gather(*[call() for _ in range(20)])
        return stamps

    stamps = asyncio.run(go())
    times = sorted(t for t, _ in stamps)
    # At most 4 calls of 250 tokens complete in any 0.4 s window (1000 tokens), so 20 calls take ≥ 4 windows.
    assert max_in_window(times, 0.4) <= 4
    assert times[-1] - times[0] >= 4 * 0.4 - 0.05


def test_rate_window_serves_waiters_in_order_and_a_cancelled_waiter_passes_its_turn_on():
    async def go():
        limiter = EndpointLimiter(rate_limit=2, period=0.3, max_in_flight=100)
        sent = []

        async def call(i):
            async with limiter.slot():
                sent.append((i, time.monotonic()))
                await asyncio.sleep(0.02)

        tasks = []
        for i in range(8):
            tasks.append(asyncio.create_task(call(i)))
            await asyncio.sleep(0)  # each joins the queue in turn
        # 0 and 1 fill the window; 2 heads the queue and watches it, 3…7 wait behind.
        await asyncio.sleep(0.05)
        tasks[2].cancel()
        tasks[4].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return sent, limiter.stats

    sent, stats = asyncio.run(go())
    assert [i for i, _ in sent] == [0, 1, 3, 5, 6, 7]
    assert max_in_window([t for _, t in sent], 0.3) <= 2
    assert (stats.completed, stats.waiting, stats.in_flight) == (6, 0, 0)


async def test_a_request_adopted_from_elsewhere_counts_in_flight_until_it_completes_then_for_a_window():
    """Both slots of 2 a half-second are held by requests sent elsewhere (a lost shared store's): a new request
    waits for one to complete (0.3 s) and then for its completion stamp to leave the window (0.5 s more)."""
    limiter = EndpointLimiter(2, 0.5, 8)
    limiter.adopt(0)
    limiter.adopt(0)

    async def complete_later() -> None:
        await asyncio.sleep(0.3)
        limiter.complete(0, 0)

    started = time.monotonic()
    task = asyncio.create_task(complete_later())
    async with limiter.slot():
        waited = time.monotonic() - started
    await task
    assert 0.75 < waited < 1.5
