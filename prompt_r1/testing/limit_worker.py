"""A process that calls one environment endpoint many times through `EnvironmentClient`, for the tests of limits
shared across processes (several of these run at once against one scripted provider and one store).

    python -m prompt_r1.testing.limit_worker --base-url URL --model env --store redis://127.0.0.1:6379/0 \\
        --rate-limit 10 --period 1 --calls 20 --concurrency 4 --out result.json

It writes `--out` when done: calls that succeeded and failed, retries, each call's start and end (Unix time),
and whether the store was lost and rejoined.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time

from prompt_r1.core.urls import MEMORY_STORE


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default="env")
    parser.add_argument("--store", default=MEMORY_STORE)
    parser.add_argument("--rate-limit", type=int, required=True)
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--max-in-flight", type=int, default=32)
    parser.add_argument("--token-limit", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lease", type=float, help="seconds a lease lives without renewal")
    parser.add_argument("--max-retries", type=int, default=8)
    parser.add_argument("--tag", default="w")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    from prompt_r1.clients import shared_limit
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import EnvironmentConfig

    if args.lease:
        shared_limit.LEASE_SECONDS = args.lease
    config = EnvironmentConfig(
        model=args.model,
        base_url=args.base_url,
        api_key_env="PROMPT_R1_TEST_KEY",
        rate_limit=args.rate_limit,
        rate_period=args.period,
        max_in_flight=args.max_in_flight,
        token_limit=args.token_limit,
        max_tokens=args.max_tokens,
        rate_store=args.store,
        max_retries=args.max_retries,
        backoff_initial=0.2,
        timeout=120.0,
    )
    client = EnvironmentClient(config)
    calls: list[dict] = []

    async def run() -> None:
        queue = list(range(args.calls))

        async def worker() -> None:
            while queue:
                n = queue.pop(0)
                started = time.time()
                try:
                    reply = await client.respond(f"{args.tag} call {n}: say something short")
                    calls.append({"n": n, "start": started, "end": time.time(), "attempts": reply.attempts})
                except Exception as exc:  # reported, not raised: the test reads every outcome
                    calls.append({"n": n, "start": started, "end": time.time(), "error": type(exc).__name__})

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))

    asyncio.run(run())
    limiter = client.limiter
    result = {
        "ok": sum("error" not in c for c in calls),
        "failed": sum("error" in c for c in calls),
        "retries": client.retries,
        "calls": calls,
        "losses": getattr(limiter, "losses", 0),
        "store_lost_at_end": getattr(limiter, "store_lost", False),
    }
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
