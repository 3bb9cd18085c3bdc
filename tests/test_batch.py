"""`prompt-r1 batch` and `run_batch` against real HTTP servers on 127.0.0.1: faults, rate limits, kills, resumes,
checkpoints and Ctrl-C. The key, the input file, prices, budgets and pools: tests/test_batch_inputs.py."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from collections import Counter

import pytest
from batch_setup import (
    FAULTS,
    KEY_ENV,
    SECRET,
    cli_args,
    env_config,
    expected_answer,
    line_count,
    served_agent,
)
from helpers import rows_of, spawn_cli, wait_for, write_questions

from prompt_r1.agents.served import ServedAgent
from prompt_r1.cli.main import main
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.core.config import AgentConfig
from prompt_r1.runs.batch import BatchSettings, run_batch
from prompt_r1.testing.servers import Fault, ScriptedServer, echo_environment, max_in_window, relay_agent

pytestmark = pytest.mark.usefixtures("batch_key")  # every run here reads its key (conftest)


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
        proc = spawn_cli(args, tmp_path / "run1.log", env=KEY_ENV)
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
        proc = spawn_cli(
            cli_args(first.base_url, inp, out, "--concurrency", "64", "--checkpoint", str(checkpoint)),
            tmp_path / "run1.log",
            env=KEY_ENV,
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


# ---- interruption -------------------------------------------------------------------------------------------


def test_ctrl_c_stops_writes_a_summary_and_a_rerun_finishes(tmp_path):
    n = 120
    inp = write_questions(tmp_path / "q.jsonl", n)
    out = tmp_path / "r.jsonl"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 0.05}) as server:
        args = cli_args(
            server.base_url, inp, out, "--concurrency", "8", "--log-file", str(tmp_path / "debug.log")
        )
        proc = spawn_cli(args, tmp_path / "run1.log", env=KEY_ENV)
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
        proc = spawn_cli(args, tmp_path / "run1.log", env=KEY_ENV)
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
