"""The environment's response cache (`--env-cache`): an answer paid for once is replayed, never bought again, and a
cache that cannot be trusted is one line before anything is sent. Real scripted servers, real files, real Redis."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess

import pytest
from batch_setup import SECRET, cli_args, search_environment
from helpers import ROOT, cli_command, run_cli, write_questions

from prompt_r1.evaluation.harness import read_predictions
from prompt_r1.testing.scripted import echo_environment, relay_agent
from prompt_r1.testing.servers import ScriptedServer

DETERMINISTIC = ("--env-temperature", "0")


pytestmark = pytest.mark.usefixtures("batch_key")


def env_answer(body: dict) -> str:
    """A priced environment's answer to env-only's request: the question's item, tagged."""
    last = body["messages"][-1]["content"]
    return f"<answer>{last.split('What is ')[1].split('?')[0]}</answer>"


def eval_args(server, inp, out, *extra) -> list[str]:
    return ["eval", "--dataset", str(inp), "--method", "env-only", "--method", "prompt-r1", "--out", str(out),
            "--env-model", "gpt-4o-mini", "--env-base-url", server.base_url, "--env-api-key-env", "BATCH_TEST_KEY",
            "--agent-model", "agent", "--agent-base-url", server.base_url, "--agent-api-key-env", "BATCH_TEST_KEY",
            "--no-progress", "--no-chart", *DETERMINISTIC, *extra]  # fmt: skip


def test_a_second_eval_with_the_cache_sends_no_request_and_predicts_the_same(tmp_path, capsys):
    inp = write_questions(tmp_path / "q.jsonl", 3)
    cache = tmp_path / "env.sqlite"
    with ScriptedServer({"gpt-4o-mini": env_answer, "agent": relay_agent()}) as server:
        assert run_cli(eval_args(server, inp, tmp_path / "first", "--env-cache", cache))[0] == 0
        paid = len(server.requests_for("gpt-4o-mini"))
        assert paid == 3 + 3 * 2  # env-only once a row, prompt-r1 twice an episode
        # A new folder (a new metric, a fixed scorer): every row runs again, and every answer comes from the cache.
        code, _, err = run_cli(eval_args(server, inp, tmp_path / "second", "--env-cache", cache))
        assert code == 0, err
        assert len(server.requests_for("gpt-4o-mini")) == paid  # 0 requests to the environment
    first = {(r["method"], r["id"]): r for r in read_predictions(tmp_path / "first/predictions.jsonl")}
    second = {(r["method"], r["id"]): r for r in read_predictions(tmp_path / "second/predictions.jsonl")}
    assert first.keys() == second.keys() and len(first) == 6
    for key, row in first.items():
        assert second[key]["prediction"] == row["prediction"] and second[key]["status"] == row["status"], key
        assert key[0] == "prompt-r1" or row["cost_usd"] > 0  # the served agent is unpriced
    assert all(r["cost_usd"] == 0 for r in second.values() if r["method"] == "env-only")  # $0 the second time
    line = err.split(f"cache {cache}: ")[1].split("\n")[0]
    assert line.startswith("9 hits (calls saved) · 0 stored · $") and float(line.split("$")[1].split()[0]) > 0


def test_a_second_batch_replays_every_call_and_the_cache_holds_no_key(tmp_path, relay_server):
    inp = write_questions(tmp_path / "q.jsonl", 4)
    cache = tmp_path / "env.sqlite"
    assert (
        run_cli(
            cli_args(relay_server.base_url, inp, tmp_path / "a.jsonl", "--env-cache", cache, *DETERMINISTIC)
        )[0]
        == 0
    )
    paid = len(relay_server.requests_for("env"))
    code, _, err = run_cli(
        cli_args(relay_server.base_url, inp, tmp_path / "b.jsonl", "--env-cache", cache, *DETERMINISTIC)
    )
    assert code == 0, err
    assert len(relay_server.requests_for("env")) == paid == 8
    answers = {path: {r["id"]: r["answer"] for r in map(json.loads, (tmp_path / path).read_text().splitlines())}
               for path in ("a.jsonl", "b.jsonl")}  # fmt: skip
    assert answers["a.jsonl"] == answers["b.jsonl"]
    summary = json.loads((tmp_path / "b.summary.json").read_text())
    assert summary["cache"]["hits"] == 8 and summary["cache"]["stored"] == 0
    assert "8 hits (calls saved)" in err
    for path in (cache, tmp_path / "b.manifest.json"):
        assert SECRET.encode() not in path.read_bytes()


def test_sampling_above_zero_is_replayed_only_when_asked(tmp_path, relay_server):
    inp = write_questions(tmp_path / "q.jsonl", 1)
    cache = tmp_path / "env.sqlite"
    code, _, err = run_cli(cli_args(relay_server.base_url, inp, tmp_path / "a.jsonl", "--env-cache", cache))
    assert code == 2 and "temperature is the endpoint's default" in err and "--env-cache-always" in err
    assert relay_server.requests == [] and not (tmp_path / "a.jsonl").exists()
    always = ("--env-cache", cache, "--env-cache-always", "--env-temperature", "0.7")
    assert run_cli(cli_args(relay_server.base_url, inp, tmp_path / "b.jsonl", *always))[0] == 0
    sent = len(relay_server.requests_for("env"))
    assert run_cli(cli_args(relay_server.base_url, inp, tmp_path / "c.jsonl", *always))[0] == 0
    assert len(relay_server.requests_for("env")) == sent


def test_bad_caches_are_one_line_exit_2_nothing_sent_nothing_changed(tmp_path, relay_server):
    inp = write_questions(tmp_path / "q.jsonl", 2)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all" * 100)
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as connection:
        connection.execute("CREATE TABLE t (x)")
    other = tmp_path / "other.sqlite"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as elsewhere:
        assert run_cli(cli_args(elsewhere.base_url, inp, tmp_path / "x.jsonl", "--env-cache", other,
                                *DETERMINISTIC))[0] == 0  # fmt: skip
    cases = {
        tmp_path: "is a folder",
        garbage: "not a readable response cache",
        foreign: "is not a prompt-r1 response cache",
        other: "holds replies of http://127.0.0.1:",
        tmp_path / "empty.sqlite": "is empty",
        "redis://127.0.0.1:1/0": "does not answer",
    }
    (tmp_path / "empty.sqlite").write_bytes(b"")
    for where, why in cases.items():
        before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
        code, _, err = run_cli(cli_args(relay_server.base_url, inp, tmp_path / "r.jsonl", "--env-cache",
                                        where, *DETERMINISTIC))  # fmt: skip
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and why in lines[0], (where, err)
        assert relay_server.requests == [], where
        assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before, where


def run_bound_by_permissions(args: list) -> subprocess.CompletedProcess:
    """`prompt-r1 ARGS` in a process of its own that file permissions bind: run by root (as the tests may be),
    without the capabilities that let root read any file (`setpriv` drops them before the interpreter starts)."""
    command = cli_command(args)
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root reads any file, and there is no setpriv to drop that")
        command = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip


def test_an_unreadable_cache_is_refused_by_batch_and_eval(tmp_path, relay_server):
    inp = write_questions(tmp_path / "q.jsonl", 1)
    cache = tmp_path / "env.sqlite"
    assert (
        run_cli(
            cli_args(relay_server.base_url, inp, tmp_path / "a.jsonl", "--env-cache", cache, *DETERMINISTIC)
        )[0]
        == 0
    )
    sent, held = len(relay_server.requests), cache.read_bytes()
    cache.chmod(0)
    eval_flags = ["eval", "--dataset", inp, "--method", "env-only", "--out", tmp_path / "ev", "--env-model", "env",
                  "--env-base-url", relay_server.base_url, "--env-api-key-env", "BATCH_TEST_KEY",
                  "--no-progress", *DETERMINISTIC]  # fmt: skip
    try:
        for args in (cli_args(relay_server.base_url, inp, tmp_path / "b.jsonl"), eval_flags):
            done = run_bound_by_permissions([*args, "--env-cache", cache])
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1 and "cannot be read and written" in lines[0], (
                done.stderr
            )
    finally:
        cache.chmod(0o644)
    assert len(relay_server.requests) == sent and cache.read_bytes() == held
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "a.manifest.json", "a.summary.json",
                                                          "env.sqlite", "q.jsonl"]  # fmt: skip


def test_a_damaged_reply_is_never_replayed(tmp_path, relay_server):
    inp = write_questions(tmp_path / "q.jsonl", 2)
    cache = tmp_path / "env.sqlite"
    assert (
        run_cli(
            cli_args(relay_server.base_url, inp, tmp_path / "a.jsonl", "--env-cache", cache, *DETERMINISTIC)
        )[0]
        == 0
    )
    with sqlite3.connect(
        cache
    ) as connection:  # one reply's text changed on disk, its checksum left as it was
        key, reply = connection.execute("SELECT key, reply FROM replies LIMIT 1").fetchone()
        changed = json.dumps({**json.loads(reply), "text": "a wrong answer"})
        connection.execute("UPDATE replies SET reply = ? WHERE key = ?", (changed, key))
    code, _, err = run_cli(
        cli_args(relay_server.base_url, inp, tmp_path / "b.jsonl", "--env-cache", cache, *DETERMINISTIC)
    )
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        f"prompt-r1: error: --env-cache {cache}: a stored"
    )
    rows = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert all("a wrong answer" not in json.dumps(row) for row in rows)
    assert sum(row["status"] == "internal_error" for row in rows) == 1


def test_the_cache_in_the_stores_redis(tmp_path, relay_server):
    from prompt_r1.testing.redis_server import RedisServer, redis_server_binary

    if redis_server_binary() is None:
        pytest.skip("no redis-server on this machine")
    inp = write_questions(tmp_path / "q.jsonl", 3)
    with RedisServer() as redis:
        flags = ("--env-cache", redis.url, *DETERMINISTIC)
        assert run_cli(cli_args(relay_server.base_url, inp, tmp_path / "a.jsonl", *flags))[0] == 0
        paid = len(relay_server.requests_for("env"))
        code, _, err = run_cli(cli_args(relay_server.base_url, inp, tmp_path / "b.jsonl", *flags))
        assert code == 0 and len(relay_server.requests_for("env")) == paid == 6 and "6 hits" in err


def bad_caches(tmp_path, other_endpoint_cache) -> dict:
    """A cache path of each kind a run refuses, and the words of its one line."""
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all" * 100)
    (tmp_path / "empty.sqlite").write_bytes(b"")
    return {
        tmp_path: "is a folder",
        garbage: "not a readable response cache",
        other_endpoint_cache: "holds replies of http://127.0.0.1:",
        tmp_path / "empty.sqlite": "is empty",
    }


def test_bad_caches_are_one_line_for_eval_and_its_dry_run_too(tmp_path):
    """The Bad-input list through `eval` (and both commands' --dry-run, which reads the cache it would use):
    one line, exit 2, nothing sent, no file made or changed, in the folder or beside it."""
    inp = write_questions(tmp_path / "q.jsonl", 2)
    other = tmp_path / "other.sqlite"
    with ScriptedServer({"gpt-4o-mini": env_answer, "agent": relay_agent()}) as elsewhere:
        assert run_cli(eval_args(elsewhere, inp, tmp_path / "first", "--env-cache", other))[0] == 0
    out = tmp_path / "ev"
    with ScriptedServer({"gpt-4o-mini": env_answer, "agent": relay_agent()}) as server:
        for where, why in bad_caches(tmp_path, other).items():
            before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
            for dry in ([], ["--dry-run"]):
                code, _, err = run_cli(eval_args(server, inp, out, "--env-cache", where, *dry))
                lines = [line for line in err.splitlines() if line.strip()]
                assert code == 2 and len(lines) == 1 and why in lines[0], (where, dry, err)
            code, _, err = run_cli(cli_args(server.base_url, inp, tmp_path / "r.jsonl", "--env-cache", where,
                                            *DETERMINISTIC, "--dry-run"))  # fmt: skip
            assert code == 2 and len(err.strip().splitlines()) == 1 and why in err, (where, err)
            assert server.requests == [], where
            assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before, where
            assert not out.exists(), where


def test_the_dry_run_says_what_the_cache_holds_and_writes_nothing(tmp_path):
    inp = write_questions(tmp_path / "q.jsonl", 3)
    cache = tmp_path / "env.sqlite"
    with ScriptedServer({"gpt-4o-mini": env_answer, "agent": relay_agent()}) as server:
        code, out, err = run_cli(eval_args(server, inp, tmp_path / "a", "--env-cache", cache, "--dry-run"))
        assert code == 0 and f"--env-cache {cache} does not exist yet" in out and not cache.exists(), err
        assert run_cli(eval_args(server, inp, tmp_path / "a", "--env-cache", cache))[0] == 0
        sent, held = len(server.requests), cache.read_bytes()
        code, out, err = run_cli(eval_args(server, inp, tmp_path / "b", "--env-cache", cache, "--dry-run"))
        assert code == 0, err
        assert "holds 9 replies: 3 of the 3 env-only/env-cot calls to run are in it (3 calls, $0.0" in out, (
            out
        )
        assert "are not looked up" in out
        code, out, err = run_cli(cli_args(server.base_url, inp, tmp_path / "r.jsonl", "--env-cache", cache,
                                          *DETERMINISTIC, "--dry-run"))  # fmt: skip
        assert code == 0 and "holds 9 replies; the loop's calls follow the agent's turns" in out, err
        assert len(server.requests) == sent and cache.read_bytes() == held
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "env.sqlite", "q.jsonl"]


def test_a_search_replayed_from_the_cache_costs_nothing_and_spends_no_budget(tmp_path):
    """An OPRO search's task calls go through the run's environment, so through its cache: the second search (a new
    folder) sends none of them, its record and summary say $0, and --budget is not spent by them."""
    import csv

    prices = tmp_path / "prices.yaml"
    prices.write_text("env: {input: 1000, output: 1000}\nrefl: {input: 0, output: 0}\n")
    cache = tmp_path / "env.sqlite"
    with ScriptedServer({"env": search_environment, "refl": search_environment}) as server:

        def args(out, *extra):
            return ["eval", "--dataset", "hotpot", "--method", "opro", "--limit", "2", "--optimizer-train-rows", "2",
                    "--optimizer-budget", "8", "--opro-candidates", "1", "--out", tmp_path / out, "--no-progress",
                    "--no-chart", "--env-model", "env", "--env-base-url", server.base_url, "--env-api-key-env",
                    "BATCH_TEST_KEY", "--reflection-model", "refl", "--prices", prices, "--env-cache", cache,
                    *DETERMINISTIC, *extra]  # fmt: skip

        code, _, err = run_cli(args("a"))
        assert code == 0, err
        paid = len(server.requests_for("env"))
        first = json.loads((tmp_path / "a/optimized/opro/hotpot.json").read_text())
        assert paid > 0 and first["cost_usd"] > 0 and first["calls"]["cached"] == 0
        # Far less than one task call costs: a search whose replayed calls counted would stop at once.
        code, _, err = run_cli(args("b", "--budget", "0.001"))
        assert code == 0, err
        assert len(server.requests_for("env")) == paid  # every task call and row replayed
        assert (
            len(server.requests_for("refl")) > 0
        )  # the optimiser model samples: never replayed, priced $0 here
    second = json.loads((tmp_path / "b/optimized/opro/hotpot.json").read_text())
    assert second["cost_usd"] == 0 and second["calls"]["cached"] == second["metric_calls"] > 0
    assert second["instruction"] == first["instruction"]
    with open(tmp_path / "b/summary.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["search_usd"]) == 0 and float(row["cost_usd"]) == 0 and int(row["search_calls"]) > 0
