"""One `--env-cache` file shared by several processes (issue 51, item 3): processes creating one new cache at once
keep every paid reply (none lost, none paid twice, no row failed); a cache another process holds busy ("database
is locked") never fails a row whose call was paid; a refused run leaves no empty cache behind; a cache named as one
of the run's own files is refused before anything is made. Real `prompt-r1 batch` processes, a real scripted server
on 127.0.0.1, real SQLite files."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest
from batch_setup import KEY_ENV, cli_args
from helpers import ROOT, cli_command, run_cli, write_questions

from prompt_r1.runs.shards import Shard

pytestmark = pytest.mark.usefixtures("batch_key")

DETERMINISTIC = ("--env-temperature", "0")


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _replies(cache) -> int:
    connection = sqlite3.connect(f"{cache.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return connection.execute("SELECT COUNT(*) FROM replies").fetchone()[0]
    finally:
        connection.close()


def _env_bodies(server) -> list[str]:
    return [json.dumps(r.body["messages"], sort_keys=True) for r in server.requests_for("env")]


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_creating_one_new_cache_at_once_keep_every_reply(tmp_path, relay_server, processes):
    inp, out, cache = (
        write_questions(tmp_path / "q.jsonl", 6 * processes),
        tmp_path / "r.jsonl",
        tmp_path / "c.sqlite",
    )
    env = {**os.environ, **KEY_ENV, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    runs = [
        subprocess.Popen(
            cli_command(
                cli_args(
                    relay_server.base_url,
                    inp,
                    out,
                    "--shard",
                    f"{i}/{processes}",
                    "--env-cache",
                    cache,
                    "--concurrency",
                    "4",
                    *DETERMINISTIC,
                )
            ),  # fmt: skip
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(1, processes + 1)
    ]
    results = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    assert all(code == 0 for code, _, _ in results), [err[-2000:] for _, _, err in results]
    rows = [row for i in range(1, processes + 1) for row in _rows(Shard(i, processes).path(out))]
    assert len(rows) == 6 * processes and {r["status"] for r in rows} == {"answered"}  # 0 rows failed
    paid = _env_bodies(relay_server)
    assert len(paid) == len(set(paid)) == 2 * 6 * processes  # 0 calls paid twice (two calls an episode)
    assert _replies(cache) == len(paid)  # 0 replies lost
    assert not [p.name for p in tmp_path.iterdir() if ".creating" in p.name]
    # Every reply replays: the whole input again, into another file, pays for nothing.
    code, _, err = run_cli(cli_args(relay_server.base_url, inp, tmp_path / "again.jsonl", "--env-cache", cache,
                                    *DETERMINISTIC))  # fmt: skip
    assert code == 0, err
    assert len(_env_bodies(relay_server)) == len(paid)


HOLD = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")  # the write lock: every other writer is told "database is locked"
print("held", flush=True)
time.sleep(float(sys.argv[2]))
connection.execute("ROLLBACK")
"""


def test_a_busy_cache_never_fails_a_row_whose_call_was_paid(tmp_path, relay_server):
    cache = tmp_path / "c.sqlite"
    first = cli_args(relay_server.base_url, write_questions(tmp_path / "a.jsonl", 1), tmp_path / "a-out.jsonl",
                     "--env-cache", cache, *DETERMINISTIC)  # fmt: skip
    assert run_cli(first)[0] == 0 and _replies(cache) == 2
    # Another process holds the file's write lock longer than SQLite's own wait (5 s before the fix).
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(cache), "7"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        out = tmp_path / "b-out.jsonl"
        code, _, err = run_cli(cli_args(relay_server.base_url, write_questions(tmp_path / "b.jsonl", 3, start=1),
                                        out, "--env-cache", cache, *DETERMINISTIC))  # fmt: skip
    finally:
        holder.wait(timeout=60)
    assert code == 0, err
    assert time.monotonic() - started >= 5  # it did wait for the lock
    assert {r["status"] for r in _rows(out)} == {"answered"} and len(_rows(out)) == 3
    assert _replies(cache) == 2 + 3 * 2  # every paid reply kept once the lock was let go


def test_a_refused_run_leaves_no_cache_behind(tmp_path, relay_server):
    inp, out, cache = write_questions(tmp_path / "q.jsonl", 2), tmp_path / "r.jsonl", tmp_path / "c.sqlite"
    assert run_cli(cli_args(relay_server.base_url, inp, out))[0] == 0
    calls = len(relay_server.requests)
    # Another environment model on the same --out: refused by the manifest, after the cache was opened.
    other = cli_args(relay_server.base_url, inp, out, "--env-cache", cache, *DETERMINISTIC)
    other[other.index("--env-model") + 1] = "env2"
    code, _, err = run_cli(other)
    assert code == 2 and err.count("\n") == 1 and "other settings" in err, err
    assert not cache.exists() and not list(tmp_path.glob("c.sqlite*"))
    assert len(relay_server.requests) == calls


@pytest.mark.parametrize("name", ["r.manifest.json", "r.calls.sqlite", "r.jsonl.lock", "r.summary.json"])
def test_a_cache_named_as_one_of_the_runs_files_is_refused_before_anything_is_made(
    tmp_path, relay_server, name
):
    inp = write_questions(tmp_path / "q.jsonl", 2)
    for extra in ((), ("--dry-run",)):
        args = cli_args(relay_server.base_url, inp, tmp_path / "r.jsonl", "--env-cache", tmp_path / name,
                        *DETERMINISTIC, *extra)  # fmt: skip
        code, _, err = run_cli(args)
        assert code == 2 and err.count("\n") == 1 and "is the " in err and "Traceback" not in err, err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["q.jsonl"] and relay_server.requests == []


KEEP = """
import sys, time
from prompt_r1.clients.response_cache import open_cache
path, start, me = sys.argv[1], float(sys.argv[2]), sys.argv[3]
while time.time() < start:  # every process past its imports, then all at once
    time.sleep(0.001)
cache = open_cache(path, ["http://127.0.0.1:9/v1"])
for k in range(25):
    cache.put(f"{me}-{k}", {"text": f"reply {me}-{k}", "model": "m", "input_tokens": 1, "output_tokens": 1})
print(cache.summary()["stored"], flush=True)
cache.close()
"""


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_opening_one_new_cache_at_the_same_instant_keep_every_reply(tmp_path, processes):
    """The race at its narrowest: processes released at one instant each open the missing cache and keep 25
    replies. Before issue 51 they shared one `.creating` temporary ("readonly database", "disk I/O error")."""
    cache, start = tmp_path / "c.sqlite", time.time() + 8
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [subprocess.Popen([sys.executable, "-c", KEEP, str(cache), str(start), str(i)], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(processes)]  # fmt: skip
    results = [(run.wait(timeout=120), *run.communicate()) for run in runs]
    assert all(code == 0 and out.strip() == "25" for code, out, _ in results), results
    # No temporary left. SQLite's own -wal and -shm may outlive processes that close at the same instant (each
    # sees the other's connection and leaves the clean-up to it; the next open uses them): they are not ours.
    companions = {"c.sqlite-wal", "c.sqlite-shm"}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in companions) == ["c.sqlite"]
    assert _replies(cache) == 25 * processes
