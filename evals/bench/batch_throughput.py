"""Batch inference benchmark: the issue's four figures, each measured in this one run and printed beside its target.

    python evals/bench/batch_throughput.py                  # the issue's figures, 1,000 episodes (~7 min, 2 cores)
    python evals/bench/batch_throughput.py --episodes 200   # a quicker look (10× that for memory)

The environment and the served agent are a local OpenAI-compatible server (prompt_r1.testing.servers.ScriptedServer) in
a process of its own, so it does not share the client's interpreter. Each episode is two environment calls and
three agent turns (relay_agent). Environment latency is log-normal (heavy-tailed, σ = 1) with the medians below,
scaled down from a real provider's so that 1,000 episodes of every run fit the time; agent turns take 10 ms. The
server enforces its own rate limit and answers 429 with Retry-After beyond it.

[1] throughput / bound, target ≥ 0.90. bound = min(rate ÷ environment calls per episode, concurrency ÷ mean
    episode latency), the issue's definition, one number; the mean episode latency is 2 × the mean environment
    latency the server actually drew in this run + 3 × 10 ms. The run: 64 in flight, the client and the server
    both limited to `--rate` requests/s (over 5 s windows), median environment latency 150 ms, so the rate term
    binds. Also shown: the steady-state ratio (middle 80% of completions: a sliding window lets a first full
    window through at once, and the last episodes finish with nothing behind them) and, with --server-429, the
    same run with the client's limit 5× too high, so the server's 429s with Retry-After do the limiting.
[2] ours / lockstep per turn at the same concurrency (16), target ≥ 2×, both running all episodes against one
    server, median environment latency 100 ms. The lockstep runner is the reference release's rollout loop: a
    batch of `concurrency` episodes advances turn by turn, each turn waiting for its slowest episode. Our run's
    throughput / bound is shown beside it (here the concurrency term binds).
[3] orchestration overhead per environment turn, target ≤ 2 ms: zero-latency server, one episode at a time,
    (`run_batch`'s time − the time of the same HTTP calls made directly, with no graph, runner or output file) ÷
    the environment turns made (2 per episode), in wall time and in client CPU time, median of rotating rounds
    (wall time on a small shared VM drifts by more than the overhead itself). Beside it, as ratios measured in
    this run (target ≤ 1.5×), each side's CPU over the same direct calls: `EpisodeRunner.run` over the bare graph
    (`graph.ainvoke` on the same clients), episode by episode in rotating order; `run_batch` over the bare graph in
    the same rounds; and in process with the same players and no HTTP (prompt_r1.testing.scripted), `run_batch` over the
    bare graph.
[4] peak RSS of a process running 10× the episodes against one running 1× (10,000 vs 1,000 by default), zero
    latency, 64 in flight: target within +100 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_server beside it
from bench_server import AGENT_TURNS, ENV_CALLS, BenchServer, make_clients, write_input  # noqa: E402

AGENT_LATENCY = 0.01  # seconds per served agent turn


# ---- runners --------------------------------------------------------------------------------------------------


async def run_ours(
    base_url: str,
    n: int,
    concurrency: int,
    *,
    rate_limit: int = 10**6,
    period: float = 1.0,
    key: str = "ours",
    clients=None,
) -> dict:
    from prompt_r1.runs.batch import BatchSettings, run_batch

    agent, env = clients or make_clients(
        base_url, rate_limit=rate_limit, period=period, concurrency=concurrency, key=key
    )
    with tempfile.TemporaryDirectory() as tmp:
        inp = write_input(Path(tmp) / "q.jsonl", n)
        cpu = time.process_time()
        summary = await run_batch(
            BatchSettings(inp, Path(tmp) / "r.jsonl", concurrency=concurrency, progress=False),
            agent=agent,
            environment=env,
        )
        cpu = time.process_time() - cpu
        finished = sorted(json.loads(line)["finished_at"] for line in (Path(tmp) / "r.jsonl").open())
    assert summary.statuses.get("answered") == n, summary.statuses
    # Steady state: the middle 80% of completions, leaving out the start (a sliding-window limit lets a first
    # full window through at once) and the tail (the last episodes finishing with nothing behind them).
    lo, hi = finished[n // 10], finished[n - 1 - n // 10]
    steady = (n - 1 - 2 * (n // 10)) / (hi - lo) if hi > lo else float("nan")
    return {
        "seconds": summary.seconds,
        "eps": n / summary.seconds,
        "steady_eps": steady,
        "retries": summary.retries,
        "cpu": cpu,
        # Mean seconds an environment request held its rate slot before being stamped (completion-stamping cost).
        "mean_held": env.limiter.stats.mean_held,
    }


async def _lockstep(agent, env, questions: list[str], concurrency: int) -> int:
    """The reference release's rollout loop: a batch advances turn by turn; every turn waits for all of it."""
    from prompt_r1.agents.base import AgentRequest
    from prompt_r1.core.prompts import agent_messages
    from prompt_r1.core.protocol import parse_agent_output

    answered = 0
    for start in range(0, len(questions), concurrency):
        states = [{"question": q, "turns": []} for q in questions[start : start + concurrency]]
        active = list(range(len(states)))
        while active:
            outputs = await asyncio.gather(
                *[agent.generate(AgentRequest(messages=agent_messages(states[i]))) for i in active]
            )
            prompting = []
            for i, output in zip(active, outputs, strict=True):
                turn = parse_agent_output(output.text).to_record()
                states[i]["turns"].append(turn)
                if turn["kind"] == "prompt":
                    prompting.append(i)
                elif turn["kind"] == "answer":
                    answered += 1
            replies = await asyncio.gather(
                *[
                    env.respond(
                        states[i]["turns"][-1]["prompt"],
                        [(t["prompt"], t["response"]) for t in states[i]["turns"][:-1]],
                    )
                    for i in prompting
                ]
            )
            for i, reply in zip(prompting, replies, strict=True):
                states[i]["turns"][-1].update(response=reply.text, response_source="environment")
            active = prompting
    return answered


async def run_lockstep(base_url: str, n: int, concurrency: int) -> dict:
    agent, env = make_clients(base_url, rate_limit=10**6, period=1.0, concurrency=concurrency, key="lockstep")
    questions = [f"What is item {i}?" for i in range(n)]
    started = time.monotonic()
    answered = await _lockstep(agent, env, questions, concurrency)
    seconds = time.monotonic() - started
    assert answered == n
    return {"seconds": seconds, "eps": n / seconds, "episodes": n}


async def _direct(agent, env, questions: list[str]) -> None:
    """The same calls as an episode, made one after another with no graph, runner or output."""
    from prompt_r1.agents.base import AgentRequest
    from prompt_r1.core.prompts import agent_messages
    from prompt_r1.core.protocol import parse_agent_output

    for question in questions:
        state = {"question": question, "turns": []}
        while True:
            output = await agent.generate(AgentRequest(messages=agent_messages(state)))
            turn = parse_agent_output(output.text).to_record()
            state["turns"].append(turn)
            if turn["kind"] != "prompt":
                break
            history = [(t["prompt"], t["response"]) for t in state["turns"][:-1]]
            reply = await env.respond(turn["prompt"], history)
            turn.update(response=reply.text, response_source="environment")


async def run_direct(base_url: str, n: int, clients=None) -> dict:
    agent, env = clients or make_clients(base_url, rate_limit=10**6, period=1.0, concurrency=1, key="direct")
    questions = [f"What is item {i}?" for i in range(n)]
    started, cpu = time.monotonic(), time.process_time()
    await _direct(agent, env, questions)
    return {"seconds": time.monotonic() - started, "cpu": time.process_time() - cpu}


async def interleaved_ms_per_env_turn(clients, n: int) -> dict[str, float]:
    """CPU per environment turn of one episode made three ways over the same HTTP clients: the calls made directly
    (no graph), the bare graph (`graph.ainvoke`), and `EpisodeRunner.run`; episode by episode, the order rotating,
    so that the machine's drift lands on every side alike."""
    from prompt_r1.loop.graph import build_graph
    from prompt_r1.runs.episode import EpisodeRunner

    agent, env = clients
    runner = EpisodeRunner(agent, env)
    graph = build_graph(agent, env)
    spent = {"direct": 0.0, "graph": 0.0, "runner": 0.0}
    order = list(spent)
    for i in range(n):
        question = f"What is item {i}?"
        for name in order[i % 3 :] + order[: i % 3]:
            started = time.process_time()
            if name == "runner":
                episode = await runner.run(question, id=f"i{i}")
                assert episode.status == "answered", episode
            elif name == "graph":
                state = await graph.ainvoke({"question": question})
                assert state["status"] == "answered", state
            else:
                await _direct(agent, env, [question])
            spent[name] += time.process_time() - started
    return {name: seconds / (n * ENV_CALLS) * 1000 for name, seconds in spent.items()}


async def run_graph(base_url: str, n: int, clients) -> dict:
    """The bare graph over the same clients, one episode at a time, no runner and no output."""
    from prompt_r1.loop.graph import build_graph

    graph = build_graph(*clients)
    started, cpu = time.monotonic(), time.process_time()
    for i in range(n):
        await graph.ainvoke({"question": f"What is item {i}?"})
    return {"seconds": time.monotonic() - started, "cpu": time.process_time() - cpu}


async def in_process_ms_per_env_turn(n: int = 300, rounds: int = 5) -> dict[str, float]:
    """CPU per environment turn with in-process players (prompt_r1.testing.scripted: the same relay agent and echo
    environment as the server plays, no HTTP at all), free of network noise: the bare graph (`ainvoke` in a
    loop), the episode runner (`EpisodeRunner.run`), and the whole batch surface (`run_batch`: runner, worker
    pool, results file, metering), in alternating rounds; medians."""
    from prompt_r1.loop.graph import build_graph
    from prompt_r1.runs.batch import BatchSettings, run_batch
    from prompt_r1.runs.episode import EpisodeRunner
    from prompt_r1.testing.scripted import ScriptedAgent, ScriptedEnvironment, echo_environment, relay_agent

    def players():
        return ScriptedAgent(relay_agent(prompts=ENV_CALLS)), ScriptedEnvironment(echo_environment())

    questions = [f"What is item {i}?" for i in range(n)]

    async def bare() -> None:
        graph = build_graph(*players())
        for question in questions:
            await graph.ainvoke({"question": question})

    async def runner() -> None:
        run = EpisodeRunner(*players())
        for i, question in enumerate(questions):
            await run.run(question, id=f"q{i}")

    async def batch() -> None:
        agent, env = players()
        with tempfile.TemporaryDirectory() as tmp:
            inp = write_input(Path(tmp) / "q.jsonl", n)
            await run_batch(
                BatchSettings(inp, Path(tmp) / "r.jsonl", concurrency=1, progress=False),
                agent=agent,
                environment=env,
            )

    samples: dict[str, list[float]] = {"graph": [], "runner": [], "batch": []}
    kinds = {"graph": bare, "runner": runner, "batch": batch}
    for r in range(rounds + 1):
        for name in list(kinds) if r % 2 == 0 else list(kinds)[::-1]:
            gc.collect()
            started = time.process_time()
            await kinds[name]()
            if r:  # the first round warms up
                samples[name].append((time.process_time() - started) / (n * ENV_CALLS) * 1000)
    return {name: statistics.median(values) for name, values in samples.items()}


def memory_child(base_url: str, n: int, concurrency: int) -> None:
    asyncio.run(run_ours(base_url, n, concurrency))
    print(json.dumps({"maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def peak_rss(base_url: str, n: int, concurrency: int) -> float:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--memory-child",
            str(n),
            "--base-url",
            base_url,
            "--concurrency",
            str(concurrency),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["maxrss_mb"]


# ---- main -----------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=1000, help="episodes per run of [1]-[3]")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight in [2]")
    parser.add_argument("--rate", type=int, default=40, help="environment requests/s in [1]")
    parser.add_argument("--memory-factor", type=int, default=10)
    parser.add_argument(
        "--server-429",
        action="store_true",
        help="[1] also with the client's limit 5× too high, the server's 429s doing the limiting (+1 min)",
    )
    parser.add_argument("--skip", action="append", default=[], choices=["1", "2", "3", "4"])
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.base_url, args.memory_child, args.concurrency)
        return
    asyncio.run(bench(args))


def mean_episode_latency(env_latency_mean: float) -> float:
    return ENV_CALLS * env_latency_mean + AGENT_TURNS * AGENT_LATENCY


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


async def bench(args) -> None:
    n, c = args.episodes, args.concurrency
    results: dict = {"episodes": n}
    started = time.monotonic()

    if "1" not in args.skip:
        period = 5.0
        limit = args.rate * int(period)
        in_flight = 64
        runs = [("client knows the limit", limit)]
        if args.server_429:
            runs.append(("client limit 5× too high, server 429s with Retry-After", 5 * limit))
        for index, (label, client_limit) in enumerate(runs):
            with BenchServer(
                env_median=0.15, agent_latency=AGENT_LATENCY, server_rate_limit=(limit, period)
            ) as server:
                ours = await run_ours(
                    server.base_url, n, in_flight, rate_limit=client_limit, period=period, key=f"rate-{index}"
                )
                stats = server.stats()
            rate_term = args.rate / ENV_CALLS
            latency = mean_episode_latency(stats["env_latency_mean"])
            concurrency_term = in_flight / latency
            bound = min(rate_term, concurrency_term)
            ratio, steady = ours["eps"] / bound, ours["steady_eps"] / bound
            results[f"1_{'known' if index == 0 else 'server_429'}"] = dict(
                **ours,
                bound=bound,
                rate_term=rate_term,
                concurrency_term=concurrency_term,
                ratio=ratio,
                **stats,
            )
            if index == 0:
                print(
                    f"[1] throughput / bound: {ratio:.3f} over the whole run, {steady:.3f} in steady state "
                    f"(target ≥ 0.90: {verdict(ratio >= 0.90)}, {verdict(steady >= 0.90)}); "
                    f"{ours['eps']:.2f} episodes/s over {n} episodes, bound {bound:.2f} = min(rate {args.rate}/s ÷ "
                    f"{ENV_CALLS} calls = {rate_term:.2f}, concurrency {in_flight} ÷ mean episode latency "
                    f"{latency:.3f} s = {concurrency_term:.2f}); server 429s {stats['rejected_429']}",
                    flush=True,
                )
                # The client's window stamps a request at completion (prompt_r1.clients.ratelimit), so a slot is held for
                # the request's latency plus the period: in the long run it passes limit ÷ (period + mean held).
                stamped = limit / (period + ours["mean_held"]) / ENV_CALLS
                print(
                    f"    the completion-stamped window's long-run ceiling: {stamped:.2f} episodes/s (mean held latency "
                    f"{ours['mean_held'] * 1000:.0f} ms per {period:g} s window); throughput / that "
                    f"{ours['eps'] / stamped:.3f} (a sliding window lets a first full window through at once)",
                    flush=True,
                )
            else:
                print(
                    f"    {label}: throughput / bound {ratio:.3f}, steady state {steady:.3f}; server 429s "
                    f"{stats['rejected_429']}, client retries {ours['retries']}",
                    flush=True,
                )

    if "2" not in args.skip:
        # Two servers with the same seed draw the same latencies in the same order: both runners face the same
        # heavy tail.
        with BenchServer(env_median=0.1, agent_latency=AGENT_LATENCY, seed=1) as server:
            ours = await run_ours(server.base_url, n, c, key="conc")
            ours_stats = server.stats()
        with BenchServer(env_median=0.1, agent_latency=AGENT_LATENCY, seed=1) as server:
            lock = await run_lockstep(server.base_url, n, c)
            lock_stats = server.stats()
        latency = mean_episode_latency(ours_stats["env_latency_mean"])
        bound = c / latency
        speedup = ours["eps"] / lock["eps"]
        results["2_lockstep"] = dict(
            ours=ours, lockstep=lock, speedup=speedup, bound=bound, ours_ratio=ours["eps"] / bound
        )
        print(
            f"[2] ours / lockstep per turn: {speedup:.2f}× (target ≥ 2×: {verdict(speedup >= 2)}); {c} in flight, "
            f"{n} episodes each: ours {ours['eps']:.2f} episodes/s ({ours['seconds']:.1f} s), lockstep "
            f"{lock['eps']:.2f} episodes/s ({lock['seconds']:.1f} s)",
            flush=True,
        )
        print(
            f"    ours / its bound (concurrency {c} ÷ mean episode latency {latency:.3f} s = {bound:.2f}): "
            f"{ours['eps'] / bound:.3f}, steady state {ours['steady_eps'] / bound:.3f}; mean environment latency "
            f"drawn {ours_stats['env_latency_mean'] * 1000:.0f} ms (ours) / "
            f"{lock_stats['env_latency_mean'] * 1000:.0f} ms (lockstep)",
            flush=True,
        )

    if "3" not in args.skip:
        # Alternating rounds, medians: on a small VM the noise in wall time is as large as the overhead and
        # drifts. One episode at a time, so the client's extra CPU is also its extra latency.
        m, rounds = 150, 9
        env_turns = m * ENV_CALLS
        with BenchServer(env_median=None) as server:
            # One set of clients for all: connection set-up is not orchestration.
            clients = make_clients(
                server.base_url, rate_limit=10**6, period=1.0, concurrency=1, key="overhead"
            )
            await run_direct(server.base_url, 20, clients)  # warm-up: connections, imports
            await run_ours(server.base_url, 20, 1, clients=clients)
            await run_graph(server.base_url, 20, clients)
            diffs: dict[str, list[float]] = {"cpu": [], "wall": [], "graph_cpu": []}
            direct_wall = []
            kinds = ("direct", "graph", "ours")
            for r in range(rounds):
                # The three in rotating order, each from a collected heap, so that drift and the garbage one run
                # leaves do not land on the same side every time.
                timed = {}
                for name in kinds[r % 3 :] + kinds[: r % 3]:
                    gc.collect()
                    if name == "direct":
                        timed[name] = await run_direct(server.base_url, m, clients)
                    elif name == "graph":
                        timed[name] = await run_graph(server.base_url, m, clients)
                    else:
                        timed[name] = await run_ours(server.base_url, m, 1, clients=clients)
                direct, ours, graph = timed["direct"], timed["ours"], timed["graph"]
                diffs["cpu"].append((ours["cpu"] - direct["cpu"]) / env_turns * 1000)
                diffs["wall"].append((ours["seconds"] - direct["seconds"]) / env_turns * 1000)
                diffs["graph_cpu"].append((graph["cpu"] - direct["cpu"]) / env_turns * 1000)
                direct_wall.append(direct["seconds"] / env_turns * 1000)
            interleaved = await interleaved_ms_per_env_turn(clients, 2 * m)
        cpu_ms, wall_ms = statistics.median(diffs["cpu"]), statistics.median(diffs["wall"])
        graph_http_ms = statistics.median(diffs["graph_cpu"])
        wall_q, cpu_q = statistics.quantiles(diffs["wall"], n=4), statistics.quantiles(diffs["cpu"], n=4)
        local = await in_process_ms_per_env_turn()
        runner_ms = interleaved["runner"] - interleaved["direct"]
        graph_ms = interleaved["graph"] - interleaved["direct"]
        results["3_overhead_ms_per_env_turn"] = {
            "wall_median": wall_ms,
            "cpu_median": cpu_ms,
            "wall_rounds": diffs["wall"],
            "cpu_rounds": diffs["cpu"],
            "graph_cpu_rounds": diffs["graph_cpu"],
            "graph_over_http_cpu": graph_http_ms,
            "batch_ratio_to_graph": cpu_ms / graph_http_ms,
            "interleaved_cpu": interleaved,
            "runner_ratio_to_graph": runner_ms / graph_ms,
            "in_process_cpu": local,
            "in_process_ratio_to_graph": local["batch"] / local["graph"],
        }
        print(
            f"[3] overhead per environment turn: wall {wall_ms:.2f} ms, CPU {cpu_ms:.2f} ms (target ≤ 2 ms: wall "
            f"{verdict(wall_ms <= 2)}, CPU {verdict(cpu_ms <= 2)}); = (run_batch's time − the same HTTP calls "
            f"made directly) ÷ {env_turns} environment turns ({m} episodes × {ENV_CALLS}), median of {rounds} rounds",
            flush=True,
        )
        print(
            f"    middle half of the rounds: wall {wall_q[0]:.2f}…{wall_q[2]:.2f} ms, CPU {cpu_q[0]:.2f}…{cpu_q[2]:.2f} "
            f"ms; the direct calls themselves take {statistics.median(direct_wall):.2f} ms wall per environment "
            f"turn (with 1.5 agent turns each)",
            flush=True,
        )
        print(
            f"    the runner's cost over the bare graph's, both over the same HTTP calls (target ≤ 1.5×): "
            f"EpisodeRunner.run {runner_ms:.2f} ms CPU per environment turn over the direct calls, the bare graph "
            f"{graph_ms:.2f} ms: {runner_ms / graph_ms:.2f}× ({verdict(runner_ms / graph_ms <= 1.5)}; episode by "
            f"episode, rotating); run_batch (runner, pool, results file, metering) {cpu_ms:.2f} ms against the bare "
            f"graph's {graph_http_ms:.2f} ms in the same rounds: {cpu_ms / graph_http_ms:.2f}× "
            f"({verdict(cpu_ms / graph_http_ms <= 1.5)})",
            flush=True,
        )
        print(
            f"    in process, no HTTP (prompt_r1.testing.scripted players): graph {local['graph']:.2f}, EpisodeRunner.run "
            f"{local['runner']:.2f}, run_batch {local['batch']:.2f} ms CPU per environment turn: run_batch over the "
            f"graph {local['batch'] / local['graph']:.2f}× ({verdict(local['batch'] / local['graph'] <= 1.5)})",
            flush=True,
        )

    if "4" not in args.skip:
        with BenchServer(env_median=None) as server:
            small = peak_rss(server.base_url, n, 64)
            large = peak_rss(server.base_url, n * args.memory_factor, 64)
        results["4_memory_mb"] = {"small": small, "large": large, "growth": large - small}
        print(
            f"[4] peak RSS growth: +{large - small:.0f} MB (target ≤ +100 MB: {verdict(large - small <= 100)}); "
            f"{n} episodes {small:.0f} MB, {n * args.memory_factor} episodes {large:.0f} MB",
            flush=True,
        )
    results["seconds"] = time.monotonic() - started
    print(f"(benchmark time {results['seconds'] / 60:.1f} min)")
    print(json.dumps(results, indent=2, default=float))


if __name__ == "__main__":
    main()
