"""The HTTP clients' connection pool (prompt_r1.clients.http_pool): httpcore's rules with linear bookkeeping.
Against a real scripted server on 127.0.0.1: bursts of concurrent calls all answered, connections reused across
bursts, the connection limit kept, and an expired connection never reused."""

from __future__ import annotations

import asyncio

import httpx
from httpcore._async.connection_pool import AsyncPoolRequest

from prompt_r1.clients.http_client import checked_async_client
from prompt_r1.clients.http_pool import LinearPool
from prompt_r1.testing.servers import ScriptedServer

BODY = {"model": "env", "messages": [{"role": "user", "content": "Which name?"}]}


def _counted(client: httpx.AsyncClient) -> dict:
    """Count the connections the client's pool opens, and the most it holds at once."""
    pool = client._transport._pool
    assert isinstance(pool, LinearPool)
    seen = {"opened": 0, "most": 0}
    create = pool.create_connection

    def counting(origin):
        seen["opened"] += 1
        seen["most"] = max(seen["most"], len(pool._connections) + 1)
        return create(origin)

    pool.create_connection = counting
    return seen


async def _burst(client: httpx.AsyncClient, url: str, n: int) -> list[int]:
    replies = await asyncio.gather(*(client.post(f"{url}/chat/completions", json=BODY) for _ in range(n)))
    return [r.status_code for r in replies]


def test_bursts_are_answered_and_the_next_burst_reuses_the_connections(monkeypatch):
    # Each idle connection goes to one request of the second burst: httpcore's rule gave it to every request queued
    # before the first one started on it, and all but one then failed (ConnectionNotAvailable) and queued again.
    cleared = []
    clear = AsyncPoolRequest.clear_connection
    with ScriptedServer({"env": lambda body: "Ada"}, latency=0.05) as server:

        async def run() -> tuple[list[int], dict, int]:
            async with checked_async_client(10.0) as client:
                seen = _counted(client)
                first = await _burst(client, server.base_url, 40)
                opened = seen["opened"]
                monkeypatch.setattr(
                    AsyncPoolRequest, "clear_connection", lambda r: (cleared.append(r), clear(r))
                )
                second = await _burst(client, server.base_url, 40)
                return first + second, seen, opened

        statuses, seen, opened = asyncio.run(run())
    assert statuses == [200] * 80
    assert opened == 40 and seen["opened"] == 40  # the second burst opened none: all 40 were kept alive
    assert cleared == []


def test_the_connection_limit_is_kept_and_expired_connections_are_not_reused():
    with ScriptedServer({"env": lambda body: "Ada"}, latency=0.02) as server:

        async def run() -> tuple[list[int], dict, int]:
            limits = httpx.Limits(max_connections=3, keepalive_expiry=0.05)
            async with checked_async_client(10.0, limits=limits) as client:
                seen = _counted(client)
                statuses = await _burst(client, server.base_url, 10)  # queued behind 3 connections
                opened = seen["opened"]
                await asyncio.sleep(0.6)  # past the keep-alive, and past a sweep
                statuses += await _burst(client, server.base_url, 1)
                return statuses, seen, opened

        statuses, seen, opened = asyncio.run(run())
    assert statuses == [200] * 11
    assert opened == 3 and seen["most"] <= 3
    assert seen["opened"] == 4  # the expired connections were closed, a new one opened
