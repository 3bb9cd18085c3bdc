"""One budget for a run that spans processes and machines: the dollars spent, counted in the shared store
(Redis) that already holds the run's provider limit, so that every process sees one total.

    spend = SharedSpend.connect("redis://127.0.0.1:6379/0", run_key("ray", "/data/results.jsonl"))
    total = await spend.add(0.0021)     # after each paid call: the run's total, every process's calls included
    if await spend.total() >= budget: ...

A `prompt-r1 batch --ray` run counts under a key of its own (one driver: one run); `--shard` runs of one input and
one results file count under a key each derives alike (`run_key`, through prompt_r1.runs.shared_budget's
`shard_spend_key`), so N shards with `--budget 5` spend $5 together.
The count is INCRBYFLOAT, atomic in Redis: two processes adding at once both count. It expires a day after the
last spend, as the limit store's keys expire when unused.
"""

from __future__ import annotations

import hashlib
from typing import Any

from prompt_r1.clients.limit_store import redis_asyncio

__all__ = ["SharedSpend", "run_key"]

KEEP_SECONDS = 86400


def run_key(*parts: str) -> str:
    """The store key of one run's spending, from what names the run (never a secret).

    >>> run_key("questions.jsonl", "results.jsonl") == run_key("questions.jsonl", "results.jsonl")
    True
    """
    digest = hashlib.blake2b("\0".join(parts).encode("utf-8"), digest_size=12).hexdigest()
    return f"prompt-r1:spend:{digest}"


class SharedSpend:
    """A run's dollars in the store (see the module). One per event loop (an asyncio redis client)."""

    def __init__(self, client: Any, key: str) -> None:
        self.client, self.key = client, key
        self.last = 0.0  # the total as of this process's last add or read

    @classmethod
    def connect(cls, url: str, key: str, password: str | None = None, timeout: float = 5.0) -> SharedSpend:
        aioredis = redis_asyncio()
        client = aioredis.from_url(
            url, password=password, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        return cls(client, key)

    async def add(self, dollars: float) -> float:
        """Count `dollars` spent; the run's total after it."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.incrbyfloat(self.key, float(dollars))
            pipe.expire(self.key, KEEP_SECONDS)
            total, _ = await pipe.execute()
        self.last = float(total)
        return self.last

    async def total(self) -> float:
        value = await self.client.get(self.key)
        self.last = float(value) if value is not None else 0.0
        return self.last

    async def reset(self) -> None:
        """Start the count at zero (a run that owns its key, at its start)."""
        await self.client.delete(self.key)
        self.last = 0.0

    async def close(self) -> None:
        await self.client.aclose()
