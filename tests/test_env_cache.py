"""The environment's response cache (`--env-cache`): an answer paid for once is replayed, never bought again, and a
cache that cannot be trusted is one line before anything is sent. Real scripted servers, real files, real Redis."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
from batch_setup import KEY_ENV, SECRET, cli_args
from helpers import run_cli, write_questions

from prompt_r1.evaluation.harness import read_predictions
from prompt_r1.testing.scripted import echo_environment, relay_agent
from prompt_r1.testing.servers import ScriptedServer

DETERMINISTIC = ("--env-temperature", "0")


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    for name, value in KEY_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def server():
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as scripted:
        yield scripted


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


def test_a_second_batch_replays_every_call_and_the_cache_holds_no_key(tmp_path, server):
    inp = write_questions(tmp_path / "q.jsonl", 4)
    cache = tmp_path / "env.sqlite"
    assert (
        run_cli(cli_args(server.base_url, inp, tmp_path / "a.jsonl", "--env-cache", cache, *DETERMINISTIC))[0]
        == 0
    )
    paid = len(server.requests_for("env"))
    code, _, err = run_cli(
        cli_args(server.base_url, inp, tmp_path / "b.jsonl", "--env-cache", cache, *DETERMINISTIC)
    )
    assert code == 0, err
    assert len(server.requests_for("env")) == paid == 8
    answers = {path: {r["id"]: r["answer"] for r in map(json.loads, (tmp_path / path).read_text().splitlines())}
               for path in ("a.jsonl", "b.jsonl")}  # fmt: skip
    assert answers["a.jsonl"] == answers["b.jsonl"]
    summary = json.loads((tmp_path / "b.summary.json").read_text())
    assert summary["cache"]["hits"] == 8 and summary["cache"]["stored"] == 0
    assert "8 hits (calls saved)" in err
    for path in (cache, tmp_path / "b.manifest.json"):
        assert SECRET.encode() not in path.read_bytes()


def test_sampling_above_zero_is_replayed_only_when_asked(tmp_path, server):
    inp = write_questions(tmp_path / "q.jsonl", 1)
    cache = tmp_path / "env.sqlite"
    code, _, err = run_cli(cli_args(server.base_url, inp, tmp_path / "a.jsonl", "--env-cache", cache))
    assert code == 2 and "temperature is the endpoint's default" in err and "--env-cache-always" in err
    assert server.requests == [] and not (tmp_path / "a.jsonl").exists()
    always = ("--env-cache", cache, "--env-cache-always", "--env-temperature", "0.7")
    assert run_cli(cli_args(server.base_url, inp, tmp_path / "b.jsonl", *always))[0] == 0
    sent = len(server.requests_for("env"))
    assert run_cli(cli_args(server.base_url, inp, tmp_path / "c.jsonl", *always))[0] == 0
    assert len(server.requests_for("env")) == sent


def test_bad_caches_are_one_line_exit_2_nothing_sent_nothing_changed(tmp_path, server):
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
        code, _, err = run_cli(cli_args(server.base_url, inp, tmp_path / "r.jsonl", "--env-cache", where,
                                        *DETERMINISTIC))  # fmt: skip
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and why in lines[0], (where, err)
        assert server.requests == [], where
        assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before, where


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_cache_is_refused(tmp_path, server):
    inp = write_questions(tmp_path / "q.jsonl", 1)
    cache = tmp_path / "env.sqlite"
    assert (
        run_cli(cli_args(server.base_url, inp, tmp_path / "a.jsonl", "--env-cache", cache, *DETERMINISTIC))[0]
        == 0
    )
    cache.chmod(0)
    try:
        code, _, err = run_cli(cli_args(server.base_url, inp, tmp_path / "b.jsonl", "--env-cache", cache,
                                        *DETERMINISTIC))  # fmt: skip
    finally:
        cache.chmod(0o644)
    assert code == 2 and "cannot be read and written" in err


def test_a_damaged_reply_is_never_replayed(tmp_path, server):
    inp = write_questions(tmp_path / "q.jsonl", 2)
    cache = tmp_path / "env.sqlite"
    assert (
        run_cli(cli_args(server.base_url, inp, tmp_path / "a.jsonl", "--env-cache", cache, *DETERMINISTIC))[0]
        == 0
    )
    with sqlite3.connect(
        cache
    ) as connection:  # one reply's text changed on disk, its checksum left as it was
        key, reply = connection.execute("SELECT key, reply FROM replies LIMIT 1").fetchone()
        changed = json.dumps({**json.loads(reply), "text": "a wrong answer"})
        connection.execute("UPDATE replies SET reply = ? WHERE key = ?", (changed, key))
    code, _, err = run_cli(
        cli_args(server.base_url, inp, tmp_path / "b.jsonl", "--env-cache", cache, *DETERMINISTIC)
    )
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        f"prompt-r1: error: --env-cache {cache}: a stored"
    )
    rows = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert all("a wrong answer" not in json.dumps(row) for row in rows)
    assert sum(row["status"] == "internal_error" for row in rows) == 1


def test_the_cache_in_the_stores_redis(tmp_path, server):
    from prompt_r1.testing.redis_server import RedisServer, redis_server_binary

    if redis_server_binary() is None:
        pytest.skip("no redis-server on this machine")
    inp = write_questions(tmp_path / "q.jsonl", 3)
    with RedisServer() as redis:
        flags = ("--env-cache", redis.url, *DETERMINISTIC)
        assert run_cli(cli_args(server.base_url, inp, tmp_path / "a.jsonl", *flags))[0] == 0
        paid = len(server.requests_for("env"))
        code, _, err = run_cli(cli_args(server.base_url, inp, tmp_path / "b.jsonl", *flags))
        assert code == 0 and len(server.requests_for("env")) == paid == 6 and "6 hits" in err
