"""The benchmarks' server and clients: a local OpenAI-compatible server (prompt_r1.testing.servers.ScriptedServer)
in a process of its own, so that it does not share the client's interpreter, with log-normal (heavy-tailed)
environment latency and an optional server-side rate limit answering 429 with Retry-After; the question files
the batch runner reads; the environment and served-agent clients that talk to it (evals/bench/batch_throughput.py)."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
from pathlib import Path

ENV_CALLS, AGENT_TURNS = 2, 3  # per episode, with relay_agent(prompts=2)


# ---- the server process ---------------------------------------------------------------------------------------


def _serve(conn, spec: dict) -> None:
    import random

    from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent

    rng = random.Random(spec["seed"])
    mu, sigma, cap = spec["env_mu"], spec["env_sigma"], spec["env_cap"]

    drawn = [0.0, 0]  # sum and count of the environment latencies served (for the bound's mean latency)

    def env_latency() -> float:
        if mu is None:
            return 0.0
        latency = min(cap, rng.lognormvariate(mu, sigma))
        drawn[0] += latency
        drawn[1] += 1
        return latency

    server = ScriptedServer(
        {"env": echo_environment(), "agent": relay_agent()},
        latency={"env": env_latency, "agent": spec["agent_latency"]},
        server_rate_limit=spec["server_rate_limit"],
        rate_limited_models=["env"],
        record=False,
    )
    server.start()
    conn.send(server.port)
    conn.recv()  # stop
    conn.send(
        {
            "counts": dict(server.counts),
            "rejected_429": server.rejected_by_rate_limit,
            "env_latency_mean": drawn[0] / drawn[1] if drawn[1] else 0.0,
        }
    )
    server.stop()


class BenchServer:
    def __init__(
        self,
        *,
        env_median: float | None,
        env_sigma: float = 1.0,
        env_cap: float = 10.0,
        agent_latency: float = 0.0,
        server_rate_limit: tuple[int, float] | None = None,
        seed: int = 0,
    ):
        self.spec = dict(
            env_mu=math.log(env_median) if env_median else None,
            env_sigma=env_sigma,
            env_cap=env_cap,
            agent_latency=agent_latency,
            server_rate_limit=server_rate_limit,
            seed=seed,
        )

    def __enter__(self) -> BenchServer:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, self.spec), daemon=True)
        self.proc.start()
        self.port = self.conn.recv()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        return self

    def stats(self) -> dict:
        self.conn.send("stop")
        result = self.conn.recv()
        self.proc.join(10)
        return result

    def __exit__(self, *exc) -> None:
        if self.proc.is_alive():
            self.proc.kill()


def write_input(path: Path, n: int) -> Path:
    with path.open("w") as handle:
        for i in range(n):
            handle.write(json.dumps({"id": f"q{i}", "question": f"What is item {i}?"}) + "\n")
    return path


def make_clients(base_url: str, *, rate_limit: int, period: float, concurrency: int, key: str):
    from prompt_r1.agents.served import ServedAgent
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import AgentConfig, EnvironmentConfig

    os.environ["BENCH_KEY"] = "EMPTY"
    env = EnvironmentClient(
        EnvironmentConfig(
            model="env",
            base_url=base_url,
            api_key_env="BENCH_KEY",
            rate_limit=rate_limit,
            rate_period=period,
            max_in_flight=max(concurrency, 1) * ENV_CALLS,
            timeout=60.0,
            max_retries=50,
            backoff_initial=0.05,
            backoff_max=1.0,
        ),
        limiter_key=key,
    )
    agent = ServedAgent(
        AgentConfig(model="agent", base_url=base_url, api_key_env="BENCH_KEY"), max_in_flight=concurrency * 2
    )
    return agent, env
