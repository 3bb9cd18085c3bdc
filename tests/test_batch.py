"""`prompt-r1 batch` and `run_batch` against real HTTP servers on 127.0.0.1: faults, rate limits, kills, resumes,
checkpoints, pools, budgets and the API key."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from prompt_r1.agents.served import ServedAgent
from prompt_r1.cli.main import main
from prompt_r1.clients.costs import PriceTable
from prompt_r1.clients.environment import EnvironmentClient, EnvironmentPool
from prompt_r1.core.config import AgentConfig, EnvironmentConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.runs.batch import BatchSettings, run_batch
from prompt_r1.testing.servers import Fault, ScriptedServer, echo_environment, max_in_window, relay_agent

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-batch-test-5f2c9e71d0"
FAULTS = {"429": 0.10, "500": 0.05, "timeout": 0.02, "drop": 0.01, "malformed": 0.01}


def write_questions(path: Path, n: int, *, start: int = 0) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(start, start + n):
            handle.write(
                json.dumps({"id": f"q{i}", "question": f"What is item {i}?", "answer": f"item {i}"}) + "\n"
            )
    return path


def expected_answer(i: int) -> str:
    """What relay_agent() answers after echo_environment() replied to its second prompt."""
    return f"Response 2: What is item {i}? / part 2"


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def env_config(server: ScriptedServer, **overrides) -> EnvironmentConfig:
    settings = dict(
        model="env",
        base_url=server.base_url,
        api_key_env="BATCH_TEST_KEY",
        rate_limit=1000,
        rate_period=1.0,
        max_in_flight=64,
        timeout=5.0,
        max_retries=10,
        backoff_initial=0.02,
        backoff_max=0.2,
    )
    settings.update(overrides)
    return EnvironmentConfig(**settings)


def served_agent(server: ScriptedServer) -> ServedAgent:
    return ServedAgent(AgentConfig(model="agent", base_url=server.base_url, api_key_env="BATCH_TEST_KEY"))


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("BATCH_TEST_KEY", SECRET)


def cli_args(server_url: str, inp: Path, out: Path, *extra: str) -> list[str]:
    return [
        "batch",
        str(inp),
        "--out",
        str(out),
        "--agent-model",
        "agent",
        "--agent-base-url",
        server_url,
        "--agent-api-key-env",
        "BATCH_TEST_KEY",
        "--env-model",
        "env",
        "--env-base-url",
        server_url,
        "--env-api-key-env",
        "BATCH_TEST_KEY",
        "--env-backoff-initial",
        "0.02",
        "--env-backoff-max",
        "0.2",
        "--no-progress",
        *extra,
    ]


def spawn_batch(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "BATCH_TEST_KEY": SECRET, "PYTHONUNBUFFERED": "1"}
    handle = log.open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "prompt_r1", *args], cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT
    )


def wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


# ---- faults and rate limits ---------------------------------------------------------------------------------


def test_faults_leave_every_answer_as_a_fault_free_run_and_the_rate_limit_holds(tmp_path):
    # 80 environment requests/s: below what this process can drive on a loaded 2-core machine (~120/s with the
    # server in a thread beside it), so the limiter, not the CPU, is what bounds the rate.
    n, limit, period = 150, 40, 0.5
    inp = write_questions(tmp_path / "q.jsonl", n)
    answers = {}
    for label, faults in (("clean", None), ("faulty", FAULTS)):
        with ScriptedServer(
            {"env": echo_environment(), "agent": relay_agent()},
            fault_rates=faults,
            fault_models=["env"],
            # A "timeout" fault answers after 3 s, well past the 2 s client timeout; ordinary replies take
            # milliseconds, so even a loaded 2-core CI machine does not time them out (at 0.5 s it did, and
            # eleven timeouts in a row used up an episode's retries).
            fault_delay=3.0,
            seed=7,
        ) as server:
            environment = EnvironmentClient(
                env_config(server, rate_limit=limit, rate_period=period, timeout=2.0),
                limiter_key=f"env-{label}",
            )
            out = tmp_path / f"{label}.jsonl"
            summary = asyncio.run(
                run_batch(
                    BatchSettings(inp, out, concurrency=48, progress=False),
                    agent=served_agent(server),
                    environment=environment,
                )
            )
            env_requests = server.requests_for("env")
            stats = environment.limiter.stats
        rows = rows_of(out)
        errors = Counter(r["error"] for r in rows if r["status"] != "answered")
        assert summary.complete and summary.written == n, (label, summary.statuses, errors.most_common(3))
        assert sorted(r["id"] for r in rows) == sorted(f"q{i}" for i in range(n))  # each id exactly once
        assert {r["status"] for r in rows} == {"answered"}
        answers[label] = {r["id"]: r["answer"] for r in rows}
        # The server never saw more environment requests in any window than the limit (+5%) ...
        busiest = max_in_window([r.received_at for r in env_requests], period)
        assert busiest <= limit * 1.05
        # ... and the limit was what bound: requests queued for the window, and the busiest window was near full
        # (an upper bound alone would also hold for a runner that never came near the limit).
        assert stats.rate_waited > 0 and busiest >= 0.8 * limit, (busiest, stats)
        if faults:
            kinds = Counter(r.fault for r in env_requests)
            assert all(kinds[k] > 0 for k in FAULTS), kinds  # every injected kind, dropped connections too
            assert summary.retries >= sum(v for k, v in kinds.items() if k)
    assert answers["faulty"] == answers["clean"]
    assert answers["clean"]["q17"] == expected_answer(17)


def test_an_episode_that_keeps_failing_is_recorded_and_the_batch_goes_on(tmp_path):
    inp = write_questions(tmp_path / "q.jsonl", 12)
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        environment = EnvironmentClient(env_config(server, max_retries=1))
        server.inject(*[Fault("500")] * 2, model="env")
        summary = asyncio.run(
            run_batch(
                BatchSettings(inp, tmp_path / "r.jsonl", concurrency=1, progress=False),
                agent=served_agent(server),
                environment=environment,
            )
        )
    rows = rows_of(tmp_path / "r.jsonl")
    failed = [r for r in rows if r["status"] == "environment_error"]
    assert len(failed) == 1 and "500" in failed[0]["error"]
    assert summary.statuses == Counter({"answered": 11, "environment_error": 1})
    assert not summary.complete


def test_max_failures_stops_the_run_cleanly(tmp_path, capsys):
    inp = write_questions(tmp_path / "q.jsonl", 200)
    rejecting = ScriptedServer(
        {"env": echo_environment(), "agent": relay_agent()}, fault_rates={"400": 1.0}, fault_models=["env"]
    )
    with rejecting as server:
        code = main(
            cli_args(server.base_url, inp, tmp_path / "r.jsonl", "--max-failures", "5", "--concurrency", "4")
        )
        env_calls = len(server.requests_for("env"))
    assert code == 1
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["stopped"].startswith("5 failed episodes reached --max-failures 5")
    assert 5 <= summary["failed"] <= 8 and env_calls <= 12  # in-flight episodes were cancelled, not run out
    assert all(r["status"] == "environment_error" for r in rows_of(tmp_path / "r.jsonl"))
    assert "not every episode finished" in capsys.readouterr().err


class BrokenAgent(ServedAgent):
    """A served agent whose node raises something no layer expects (not an AgentError) for some questions."""

    def __init__(self, config: AgentConfig, broken: str) -> None:
        super().__init__(config)
        self.broken = broken

    async def generate(self, request):
        if self.broken in request.messages[0]["content"]:
            raise RuntimeError("unexpected failure inside the agent node")
        return await super().generate(request)


def test_an_unexpected_exception_fails_its_episode_only_and_a_rerun_retries_it(tmp_path):
    inp = write_questions(tmp_path / "q.jsonl", 12)
    out = tmp_path / "r.jsonl"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        env = EnvironmentClient(env_config(server))
        config = AgentConfig(model="agent", base_url=server.base_url, api_key_env="BATCH_TEST_KEY")

        def go(agent, source=inp, dest=out, **kwargs):
            return asyncio.run(
                run_batch(
                    BatchSettings(source, dest, concurrency=4, progress=False, **kwargs),
                    agent=agent,
                    environment=env,
                )
            )

        first = go(BrokenAgent(config, "item 3?"))
        assert first.statuses == Counter({"answered": 11, "internal_error": 1}) and first.failed == 1
        (broken,) = [r for r in rows_of(out) if r["status"] != "answered"]
        assert broken["id"] == "q3" and broken["status"] == "internal_error"
        assert broken["error"].startswith("RuntimeError: unexpected failure inside the agent node (at ")
        second = go(served_agent(server))  # the rerun retries the failed id only
        assert (second.skipped, second.written) == (11, 1) and second.complete
        # Unexpected failures count toward --max-failures like any other.
        more = write_questions(tmp_path / "more.jsonl", 40, start=100)
        stopped = go(BrokenAgent(config, "What is"), more, tmp_path / "more.jsonl.out.jsonl", max_failures=3)
    assert stopped.stopped.startswith("3 failed episodes reached --max-failures 3") and stopped.written < 40
    assert all(r["answer"] == expected_answer(int(r["id"][1:])) for r in rows_of(out))


# ---- resume -------------------------------------------------------------------------------------------------


def test_rerun_skips_finished_retries_failed_and_compacts(tmp_path):
    inp = write_questions(tmp_path / "q.jsonl", 20)
    out = tmp_path / "r.jsonl"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        env = EnvironmentClient(env_config(server, max_retries=0))
        server.inject(*[Fault("400")] * 3, model="env")
        first = asyncio.run(
            run_batch(
                BatchSettings(inp, out, concurrency=1, progress=False),
                agent=served_agent(server),
                environment=env,
            )
        )
        assert first.failed == 3
        calls_before = len(server.requests_for("agent"))
        second = asyncio.run(
            run_batch(
                BatchSettings(inp, out, concurrency=4, progress=False),
                agent=served_agent(server),
                environment=env,
            )
        )
        # Only the 3 failed episodes ran again: 3 agent turns each.
        assert len(server.requests_for("agent")) - calls_before == 9
    assert (second.skipped, second.written, second.failed) == (17, 3, 0)
    rows = rows_of(out)
    assert len(rows) == 20 and len({r["id"] for r in rows}) == 20  # failed rows superseded and compacted away
    assert all(r["answer"] == expected_answer(int(r["id"][1:])) for r in rows)


def test_sigkill_then_resume_ends_with_every_id_exactly_once(tmp_path):
    n = 150
    inp = write_questions(tmp_path / "q.jsonl", n)
    out = tmp_path / "r.jsonl"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 0.05}) as server:
        args = cli_args(server.base_url, inp, out, "--concurrency", "8")
        proc = spawn_batch(args, tmp_path / "run1.log")
        wait_for(lambda: line_count(out) >= 30, what="30 rows")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        killed_at = line_count(out)
        assert 30 <= killed_at < n
        with out.open("ab") as handle:  # a row cut off mid-write, as a kill during write() leaves it
            handle.write(b'{"id": "q149", "status": "answ')
        code = main(args)
    assert code == 0
    ids = [r["id"] for r in rows_of(out)]
    assert sorted(ids) == sorted(f"q{i}" for i in range(n))  # exactly once each, none lost
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["skipped"] == killed_at and summary["written"] == n - killed_at


def test_checkpoint_resumes_killed_episodes_without_repeating_paid_turns(tmp_path):
    """Run 1 is killed while every episode waits on its second environment call; run 2 (another server, same
    checkpoint) must not call the environment for any first turn again."""
    n = 30
    inp = write_questions(tmp_path / "q.jsonl", n)
    out, checkpoint = tmp_path / "r.jsonl", tmp_path / "r.sqlite"

    def second_turn_hangs(body: dict) -> float:
        return 60.0 if sum(m["role"] == "assistant" for m in body["messages"]) else 0.0

    responders = {"env": echo_environment(), "agent": relay_agent()}
    with ScriptedServer(responders, latency={"env": second_turn_hangs}) as first:
        proc = spawn_batch(
            cli_args(first.base_url, inp, out, "--concurrency", "64", "--checkpoint", str(checkpoint)),
            tmp_path / "run1.log",
        )
        second_turns = lambda: [r for r in first.requests_for("env") if len(r.body["messages"]) > 2]  # noqa: E731
        wait_for(lambda: len(second_turns()) == n, what="every episode's second environment call")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert len(first.requests_for("env")) == 2 * n
    assert line_count(out) == 0
    with ScriptedServer(responders) as second:
        code = main(
            cli_args(second.base_url, inp, out, "--concurrency", "64", "--checkpoint", str(checkpoint))
        )
        env_requests = second.requests_for("env")
        agent_requests = second.requests_for("agent")
    assert code == 0
    # No first-turn environment call again: each episode made only the call that had not completed.
    assert len(env_requests) == n and all(len(r.body["messages"]) == 4 for r in env_requests)
    # The agent was asked only for what came after: its final answer.
    assert len(agent_requests) == n
    rows = rows_of(out)
    assert {r["resumed"] for r in rows} == {"interrupted"}
    assert all(r["answer"] == expected_answer(int(r["id"][1:])) for r in rows)
    # Finished episodes' threads are removed; the database stays small.
    with sqlite3.connect(checkpoint) as db:
        assert db.execute("select count(*) from checkpoints").fetchone()[0] == 0


def test_checkpoint_resumes_a_failed_episode_at_the_call_that_failed(tmp_path):
    inp = write_questions(tmp_path / "q.jsonl", 6)
    out, checkpoint = tmp_path / "r.jsonl", tmp_path / "r.sqlite"

    def reject_second_turns(model: str, body: dict) -> Fault | None:
        # A 400 is final: these episodes end as environment_error after one paid environment call each.
        return Fault("400") if model == "env" and len(body["messages"]) > 2 else None

    with ScriptedServer(
        {"env": echo_environment(), "agent": relay_agent()}, fault_rule=reject_second_turns
    ) as server:
        env = EnvironmentClient(env_config(server, max_retries=0))

        def go():
            return asyncio.run(
                run_batch(
                    BatchSettings(inp, out, concurrency=6, checkpoint=checkpoint, progress=False),
                    agent=served_agent(server),
                    environment=env,
                )
            )

        go()
        assert {r["status"] for r in rows_of(out)} == {"environment_error"}
        server.fault_rule = None
        before = len(server.requests_for("env"))
        summary = go()
        retried = server.requests_for("env")[before:]
    assert summary.complete and summary.resumed == 6
    assert len(retried) == 6 and all(len(r.body["messages"]) == 4 for r in retried)
    rows = rows_of(out)
    assert len(rows) == 6 and {r["resumed"] for r in rows} == {"failed_call"}
    assert all(r["answer"] == expected_answer(int(r["id"][1:])) for r in rows)


# ---- interruption, key, input -------------------------------------------------------------------------------


def test_ctrl_c_stops_writes_a_summary_and_a_rerun_finishes(tmp_path):
    n = 120
    inp = write_questions(tmp_path / "q.jsonl", n)
    out = tmp_path / "r.jsonl"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 0.05}) as server:
        args = cli_args(
            server.base_url, inp, out, "--concurrency", "8", "--log-file", str(tmp_path / "debug.log")
        )
        proc = spawn_batch(args, tmp_path / "run1.log")
        wait_for(lambda: line_count(out) >= 20, what="20 rows")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
        printed = (tmp_path / "run1.log").read_text()
        summary = json.loads((tmp_path / "r.summary.json").read_text())
        assert summary["stopped"] == "interrupted (SIGINT)" and "episodes" in printed
        assert line_count(out) == summary["written"] == len(rows_of(out))  # whole lines only
        assert main(args) == 0
    assert sorted(r["id"] for r in rows_of(out)) == sorted(f"q{i}" for i in range(n))
    # The API key appears nowhere: printed output, results, summary, debug log.
    for path in (tmp_path / "run1.log", out, tmp_path / "r.summary.json", tmp_path / "debug.log"):
        assert SECRET not in path.read_text(), path
    assert "HTTP Request: POST" in (tmp_path / "debug.log").read_text()


def test_ctrl_c_with_a_checkpoint_stops_cleanly_wherever_it_lands(tmp_path):
    """With --checkpoint, a worker spends part of each cycle deleting the finished episode's thread (a real
    SQLite write). At 32 workers and zero latency some worker is almost always there when Ctrl-C arrives; the
    stop must still end in the summary and exit 130, not a CancelledError traceback."""
    n = 80
    inp = write_questions(tmp_path / "q.jsonl", n)
    out, checkpoint = tmp_path / "r.jsonl", tmp_path / "r.sqlite"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        args = cli_args(server.base_url, inp, out, "--concurrency", "32", "--checkpoint", str(checkpoint))
        proc = spawn_batch(args, tmp_path / "run1.log")
        wait_for(lambda: line_count(out) >= 10, what="10 rows")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
        printed = (tmp_path / "run1.log").read_text()
        assert code == 130 and "Traceback" not in printed, printed[-2000:]
        summary = json.loads((tmp_path / "r.summary.json").read_text())
        assert summary["stopped"] == "interrupted (SIGINT)" and "episodes" in printed
        assert line_count(out) == summary["written"] == len(rows_of(out)) < n
        assert main(args) == 0
    assert sorted(r["id"] for r in rows_of(out)) == sorted(f"q{i}" for i in range(n))
    with sqlite3.connect(checkpoint) as db:  # every thread, the interrupted ones too, deleted once finished
        assert db.execute("select count(*) from checkpoints").fetchone()[0] == 0


def test_api_key_is_in_no_output_log_or_checkpoint_even_with_faults(tmp_path, capsys):
    inp = write_questions(tmp_path / "q.jsonl", 40)
    out = tmp_path / "r.jsonl"
    server = ScriptedServer(
        {"env": echo_environment(), "agent": relay_agent()},
        fault_rates={**FAULTS, "400": 0.03},
        fault_models=["env"],
        fault_delay=1.0,
    )
    with server:
        main(
            cli_args(
                server.base_url,
                inp,
                out,
                "--env-timeout",
                "0.5",
                "--checkpoint",
                str(tmp_path / "c.sqlite"),
                "--log-file",
                str(tmp_path / "debug.log"),
            )
        )
        assert all(r.headers.get("Authorization") == f"Bearer {SECRET}" for r in server.requests[:5])
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    for path in (out, tmp_path / "r.summary.json", tmp_path / "debug.log", tmp_path / "c.sqlite"):
        assert SECRET.encode() not in path.read_bytes(), path


class EchoingServer(ScriptedServer):
    """A server (or a careless proxy before it) whose error bodies repeat the request's Authorization header:
    fault kinds "echo-401" and "echo-400"."""

    async def _reply(self, request, body, model, route, fault):
        if fault is not None and fault.kind.startswith("echo-"):
            from aiohttp import web

            message = f"invalid request with Authorization: {request.headers.get('Authorization')}"
            error = {"message": message, "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=int(fault.kind.removeprefix("echo-")))
        return await super()._reply(request, body, model, route, fault)


def test_a_key_echoed_in_error_bodies_is_redacted_everywhere(tmp_path, capsys):
    inp = write_questions(tmp_path / "q.jsonl", 12)
    out, checkpoint = tmp_path / "r.jsonl", tmp_path / "c.sqlite"

    def echo_for_some(model: str, body: dict) -> Fault | None:
        question = body["messages"][-1]["content"] if model == "env" else body["messages"][0]["content"]
        if model == "env" and ("item 1?" in question or "item 2?" in question):
            return Fault("echo-401")
        if model == "agent" and "item 3?" in question:  # a served agent's 400 (AgentError)
            return Fault("echo-400")
        return None

    with EchoingServer(
        {"env": echo_environment(), "agent": relay_agent()}, fault_rule=echo_for_some
    ) as server:
        code = main(
            cli_args(server.base_url, inp, out, "--checkpoint", str(checkpoint), "--max-failures", "3")
        )
        assert server.requests[0].headers["Authorization"] == f"Bearer {SECRET}"
    assert code == 1
    captured = capsys.readouterr()
    rows = {r["id"]: r for r in rows_of(out)}
    # The servers did echo the key, and what they said is kept, with the key cut out.
    assert {rows[i]["status"] for i in ("q1", "q2")} == {"environment_error"}
    assert "(401)" in rows["q1"]["error"] and "Authorization: Bearer ***" in rows["q1"]["error"]
    assert rows["q3"]["status"] == "agent_error" and "Authorization: Bearer ***" in rows["q3"]["error"]
    summary = (tmp_path / "r.summary.json").read_text()
    assert "3 failed episodes reached --max-failures 3" in summary
    assert SECRET not in captured.out + captured.err
    for path in (out, tmp_path / "r.summary.json", checkpoint):
        assert SECRET.encode() not in path.read_bytes(), path


def test_duplicate_ids_are_reported_not_merged(tmp_path, capsys):
    inp = tmp_path / "q.jsonl"
    rows = [
        {"id": "a", "question": "First?"},
        {"id": "b", "question": "Second?"},
        {"id": "a", "question": "First?"},
    ]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        assert main(cli_args(server.base_url, inp, tmp_path / "r.jsonl")) == 0
    err = capsys.readouterr().err
    assert "duplicate id 'a' at input row 2: not run again" in err and "1 duplicate ids" in err
    assert [r["question"] for r in rows_of(tmp_path / "r.jsonl") if r["id"] == "a"] == ["First?"]


def test_an_id_repeated_for_another_question_stops_before_anything_runs(tmp_path, capsys):
    inp = tmp_path / "q.jsonl"
    rows = [
        {"id": "a", "question": "First?"},
        {"id": "b", "question": "Second?"},
        {"id": "a", "question": "Other?"},
    ]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        assert main(cli_args(server.base_url, inp, tmp_path / "r.jsonl")) == 2
        assert not server.requests
    err = capsys.readouterr().err
    assert err.strip() == (
        "prompt-r1: error: input row 2: id 'a' repeats row 0 with another question; give each question its own id"
    )
    assert not (tmp_path / "r.jsonl").exists()


def test_an_id_finished_for_another_question_is_reported_not_rerun(tmp_path, capsys):
    inp = tmp_path / "q.jsonl"
    inp.write_text(json.dumps({"id": "a", "question": "First?"}) + "\n")
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        assert main(cli_args(server.base_url, inp, tmp_path / "r.jsonl")) == 0
        inp.write_text(json.dumps({"id": "a", "question": "Changed?"}) + "\n")
        capsys.readouterr()
        assert main(cli_args(server.base_url, inp, tmp_path / "r.jsonl")) == 1
    err = capsys.readouterr().err
    assert "id 'a' was finished in" in err and "for another question" in err
    assert [r["question"] for r in rows_of(tmp_path / "r.jsonl")] == ["First?"]


def test_a_bad_input_row_stops_the_run_before_anything_runs(tmp_path, capsys):
    inp = write_questions(tmp_path / "q.jsonl", 5)
    with inp.open("a") as handle:
        handle.write('{"id": "bad", "question": ""}\n')
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        code = main(cli_args(server.base_url, inp, tmp_path / "r.jsonl", "--concurrency", "2"))
        assert not server.requests
    assert code == 2
    assert "row 5: its question is empty" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


def test_parquet_input_and_bundled_sets_stream(tmp_path):
    pytest.importorskip("pyarrow")
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        assert main(cli_args(server.base_url, "hotpot", tmp_path / "r.jsonl", "--limit", "7")) == 0
    rows = rows_of(tmp_path / "r.jsonl")
    assert len(rows) == 7 and all(r["golden_answers"] and "metrics" in r for r in rows)
    assert {r["id"] for r in rows} == {f"hotpot-{i}" for i in range(7)}


# ---- cost, budget, pools ------------------------------------------------------------------------------------


def test_price_table_and_budget(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("env: {input: 1000, output: 2000}\nagent: {input: 0, output: 0}\n")
    table = PriceTable.load(prices)
    assert table.cost("env", 1000, 500) == pytest.approx(2.0)
    assert table.price("gpt-4o-mini-2024-07-18") == table.price("gpt-4o-mini")  # bundled, by prefix
    assert table.price("gpt-4o-mini-x") is not None and table.price("unknown-model") is None
    inp = write_questions(tmp_path / "q.jsonl", 100)
    out = tmp_path / "r.jsonl"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        code = main(
            cli_args(
                server.base_url, inp, out, "--prices", str(prices), "--budget", "1.0", "--concurrency", "2"
            )
        )
        assert code == 1
        summary = json.loads((tmp_path / "r.summary.json").read_text())
        assert summary["stopped"].startswith("budget of $1 reached")
        assert 1.0 <= summary["usage"]["cost_usd"] < 1.5  # stopped starting episodes once past the budget
        assert summary["written"] < 100
        spent = sum(r["cost_usd"] for r in rows_of(out))
        assert spent == pytest.approx(summary["usage"]["cost_usd"], rel=1e-6)
        assert main(cli_args(server.base_url, inp, out, "--prices", str(prices))) == 0
    assert len(rows_of(out)) == 100


def test_a_budget_with_an_unpriced_model_is_refused_at_start(tmp_path, capsys):
    """Spending on a model without a price would count as $0 and the budget would never stop the run."""
    inp = write_questions(tmp_path / "q.jsonl", 5)
    out = tmp_path / "r.jsonl"
    prices = tmp_path / "prices.yaml"
    responders = {"env": echo_environment(), "agent": relay_agent()}
    with ScriptedServer(responders) as server, ScriptedServer(responders) as other:
        # Neither model priced: both named, and the file to edit is the one given with --prices.
        prices.write_text("gpt-4o-mini: {input: 1, output: 1}\n")
        assert main(cli_args(server.base_url, inp, out, "--budget", "1", "--prices", str(prices))) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("prompt-r1: error: a budget needs a price"), err
        assert "environment model 'env'" in err and "agent model 'agent'" in err
        assert f"add it to {prices} (--prices)" in err
        # The served agent's model priced, the environment's not: only the environment's named.
        prices.write_text("agent: {input: 0, output: 0}\n")
        assert main(cli_args(server.base_url, inp, out, "--budget", "1", "--prices", str(prices))) == 2
        err = capsys.readouterr().err
        assert "environment model 'env'" in err and "agent model" not in err
        # Without --prices: how to pass a price file.
        assert main(cli_args(server.base_url, inp, out, "--budget", "1")) == 2
        assert "pass it with --prices FILE" in capsys.readouterr().err
        pool_prices = tmp_path / "pool-prices.yaml"
        pool_prices.write_text("agent: {input: 0, output: 0}\nenv: {input: 1, output: 1}\n")
        # A pool member whose model has no price is named too.
        pool = tmp_path / "pool.yaml"
        pool.write_text(
            "environments:\n"
            f"  - {{name: priced, base_url: '{server.base_url}'}}\n"
            f"  - {{name: free-ride, model: large, base_url: '{other.base_url}'}}\n"
        )
        args = ["--budget", "1", "--prices", str(pool_prices), "--env-pool", str(pool)]
        assert main(cli_args(server.base_url, inp, out, *args)) == 2
        err = capsys.readouterr().err
        assert "environment model 'large' (pool member free-ride)" in err and "'env' " not in err
        assert server.counts == {} and other.counts == {} and not out.exists()  # refused before any call


def test_bad_price_table_and_pool_files_are_one_line(tmp_path, capsys):
    bad = tmp_path / "p.yaml"
    bad.write_text("env: {input: cheap}\n")
    with pytest.raises(ConfigError, match="the input price .* must be a finite number ≥ 0, got .cheap."):
        PriceTable.load(bad)
    pool = tmp_path / "pool.yaml"
    pool.write_text("environments:\n  - {model: a, wieght: 2}\n")
    with pytest.raises(ConfigError, match="unknown field.*wieght"):
        EnvironmentPool.from_file(pool)
    assert main(["batch", "hotpot", "--out", str(tmp_path / "r.jsonl"), "--env-pool", str(pool)]) == 2


def test_pool_routes_sessions_by_weight_and_falls_back(tmp_path):
    inp = write_questions(tmp_path / "q.jsonl", 200)
    responders = {"env": echo_environment(), "agent": relay_agent()}
    with ScriptedServer(responders) as a, ScriptedServer(responders) as b:
        pool_file = tmp_path / "pool.yaml"
        pool_file.write_text(
            "environments:\n"
            f"  - {{name: big, base_url: '{a.base_url}', weight: 3}}\n"
            f"  - {{name: small, base_url: '{b.base_url}', weight: 1}}\n"
        )
        code = main(cli_args(a.base_url, inp, tmp_path / "r.jsonl", "--env-pool", str(pool_file)))
        assert code == 0
        rows = rows_of(tmp_path / "r.jsonl")
        endpoints = [
            {t["environment_call"]["endpoint"] for t in r["turns"] if t.get("environment_call")} for r in rows
        ]
        assert all(len(e) == 1 for e in endpoints)  # every turn of an episode on one endpoint
        share = sum(e == {"big"} for e in endpoints) / len(rows)
        assert 0.65 <= share <= 0.85
    # Fallback: one member always fails; every episode still finishes, and the failing member is skipped after
    # it trips instead of being asked by every episode.
    with (
        ScriptedServer(responders, fault_rates={"500": 1.0}, fault_models=["env"]) as bad,
        ScriptedServer(responders) as good,
    ):
        members = [
            EnvironmentClient(env_config(bad, max_retries=1)),
            EnvironmentClient(env_config(good)),
        ]
        pool = EnvironmentPool(members, [1, 1], names=["bad", "good"], trip_after=2, cooldown=60)
        summary = asyncio.run(
            run_batch(
                BatchSettings(
                    write_questions(tmp_path / "f.q.jsonl", 60),
                    tmp_path / "f.jsonl",
                    concurrency=4,
                    progress=False,
                ),
                agent=served_agent(good),
                environment=pool,
            )
        )
        assert summary.complete and summary.fallbacks > 0
        assert len(bad.requests_for("env")) <= 2 * (2 + 4)  # trip_after, plus the calls already in flight
    assert all(r["status"] == "answered" for r in rows_of(tmp_path / "f.jsonl"))


def test_the_docs_name_every_batch_flag():
    """Every flag `prompt-r1 batch` takes is on the docs' batch page (its own) or in the `run` page's flag table."""
    import argparse

    from prompt_r1.cli.main import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    section = (ROOT / "docs" / "batch.md").read_text(encoding="utf-8")
    run_page = (ROOT / "docs" / "run.md").read_text(encoding="utf-8")
    run_table = run_page[
        run_page.index("| flag | meaning (default) |") : run_page.index("Exit codes: 0 the episode ran")
    ]
    missing = []
    for action in commands.choices["batch"]._actions:
        for flag in action.option_strings:
            positive = flag.replace("--no-", "--")
            named = f"`{flag}" in section or f"`{flag}`" in run_table or f"`{flag} " in run_table
            if flag != "-h" and flag != "--help" and not named and f"--[no-]{positive[2:]}" not in run_table:
                missing.append(flag)
    assert not missing, missing
