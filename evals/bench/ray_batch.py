"""`batch --ray` benchmark: the same 1,000 questions at one provider limit, run by a local batch and by Ray with 2
and 4 actors on 2 nodes, side by side in one run.

    python evals/bench/ray_batch.py                   # 1,000 questions, each row ~30-60 s on 2 idle cores
    python evals/bench/ray_batch.py --questions 300   # shorter

The provider is a scripted OpenAI-compatible server on 127.0.0.1 (prompt_r1.testing.servers.ScriptedServer with
prompt_r1.testing.rate_limit_simulator.ProviderLimit) that enforces REQUESTS per PERIOD on the environment model
and answers 429 beyond it. Each episode makes one environment call (0.1 s) between two agent turns (0.05 s each);
every run has 16 episodes in flight, more than the limit needs. The Ray rows run on Ray's own multi-node harness
(`ray.cluster_utils.Cluster`: a head with no CPU for actors and two worker nodes of 2 CPUs each), the actors
spread over both nodes (2 actors of 2 CPUs, or 4 of 1), sharing the limit through a real redis-server.

Printed per row:
- occupancy: how full the provider's windows were while the run was at work (`ProviderLimit.occupancy`, from
  one period after its first request to its last): 1.0 is the whole limit used;
- wall: the command's whole time, start to exit (Ray's start-up included), and its ratio to the local run's;
- start-up: Ray's share of it (joining the cluster, starting the store and the actors, from the summary);
- 429s: the provider's refusals.

Target (the issue's): every row's occupancy >= 0.90, as local batch reaches.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prompt_r1.testing.rate_limit_simulator import ProviderLimit
from prompt_r1.testing.redis_server import RedisServer
from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent

REQUESTS, PERIOD = 40, 2.0  # the provider's limit: 20 requests/s
ENV_LATENCY, AGENT_LATENCY, CONCURRENCY = 0.1, 0.05, 16


def _input(folder: Path, rows: int) -> Path:
    path = folder / "questions.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": f"What is item {i}?"}) + "\n" for i in range(rows))
    )
    return path


def _row(name: str, questions: Path, folder: Path, ray: list[str], store: str | None) -> dict:
    limit = ProviderLimit(REQUESTS, None, PERIOD)
    players = {"env": echo_environment(), "agent": relay_agent(prompts=1)}
    out = folder / f"{name.replace(' ', '_')}.jsonl"
    with ScriptedServer(
        players, latency={"env": ENV_LATENCY, "agent": AGENT_LATENCY}, provider_limit=limit,
        rate_limited_models=["env"], record=False,
    ) as server:  # fmt: skip
        cmd = [sys.executable, "-m", "prompt_r1", "batch", str(questions), "--out", str(out), "--no-progress",
               "--concurrency", str(CONCURRENCY), "--env-model", "env", "--env-base-url", server.base_url,
               "--agent-model", "agent", "--agent-base-url", server.base_url, "--env-rate-limit", str(REQUESTS),
               "--env-rate-period", str(PERIOD), "--env-max-in-flight", "64",
               *(["--env-rate-store", store] if store else []), *ray]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
        times = sorted(t for t, _, _ in limit.accepted)
        occupancy = limit.occupancy(times[0] + PERIOD, times[-1])[0]
    summary = json.loads(out.with_name(out.stem + ".summary.json").read_text())
    return {
        "row": name,
        "occupancy": occupancy,
        "wall_s": wall,
        "start_s": (summary.get("ray") or {}).get("start_seconds", 0.0),
        "written": summary["written"],
        "429s": limit.rejected,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=1000, help="questions per row (default 1000)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    import logging

    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    from ray.cluster_utils import Cluster

    print(
        f"provider: {REQUESTS} requests per {PERIOD:g} s; {args.questions} questions, one environment call each; "
        f"{CONCURRENCY} episodes in flight; cores on this machine: {os.cpu_count()}, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print(
        f"{'row':<16} {'occupancy':>9} {'wall s':>7} {'× local':>8} {'start-up s':>10} {'429s':>5}",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as redis:
        folder = Path(tmp)
        questions = _input(folder, args.questions)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        try:
            for _ in range(2):
                cluster.add_node(num_cpus=2)
            cluster.wait_for_nodes()
            plan = [
                ("local", [], None),
                ("ray 2 actors", ["--ray", cluster.address, "--ray-actors", "2", "--ray-actor-cpus", "2"], redis.url),
                ("ray 4 actors", ["--ray", cluster.address, "--ray-actors", "4", "--ray-actor-cpus", "1"], redis.url),
            ]  # fmt: skip
            for name, ray, store in plan:
                row = _row(name, questions, folder, ray, store)
                row["wall_ratio"] = row["wall_s"] / rows[0]["wall_s"] if rows else 1.0
                rows.append(row)
                print(_render(row), flush=True)
        finally:
            cluster.shutdown()
    print(f"load after: {os.getloadavg()[0]:.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


def _render(row: dict) -> str:
    target = "met" if row["occupancy"] >= 0.90 else "MISSED"
    return (
        f"{row['row']:<16} {row['occupancy']:>9.2f} {row['wall_s']:>7.1f} {row['wall_ratio']:>7.2f}× "
        f"{row['start_s']:>10.1f} {row['429s']:>5}  ≥ 0.90: {target}"
    )


if __name__ == "__main__":
    main()
