"""One writer per output: a second `prompt-r1 batch` (or eval, or train) on an output another run is writing is
refused in one line naming the output and the holder, exit 2, before it calls anything; a writer killed with
SIGKILL leaves no lock behind; shards, each writing its own file, run side by side.

Real `prompt-r1` processes, a real SIGKILL, and a scripted OpenAI-compatible server on 127.0.0.1 that tells the
runs apart by their API keys.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import ROOT, spawn_cli, wait_for, write_questions

from prompt_r1.cli.main import main
from prompt_r1.core.errors import OutputError
from prompt_r1.runs.output_lock import hold_output, lock_path
from prompt_r1.runs.shards import Shard
from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent

FIRST_KEY, SECOND_KEY = "key-of-the-first-run", "key-of-the-second-run"


def _spawn(args: list[str], log: Path, key: str) -> subprocess.Popen:
    return spawn_cli(args, log, env={"ONE_WRITER_KEY": key})


def _endpoints(server: ScriptedServer) -> list[str]:
    return ["--agent-model", "agent", "--agent-base-url", server.base_url, "--agent-api-key-env", "ONE_WRITER_KEY",
            "--env-model", "env", "--env-base-url", server.base_url, "--env-api-key-env", "ONE_WRITER_KEY",
            "--no-progress"]  # fmt: skip


def _holds(lock: Path, pid: int) -> bool:
    try:
        return lock.read_text().startswith(f"pid {pid} ")
    except FileNotFoundError:
        return False


def _finish(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _sent_with(server: ScriptedServer, key: str) -> list:
    return [r for r in server.requests if key in str(r.headers.get("Authorization", ""))]


def test_a_second_batch_on_the_same_out_is_refused_and_no_id_is_paid_twice(tmp_path):
    questions, out = write_questions(tmp_path / "q.jsonl", 12), tmp_path / "results.jsonl"
    slow = {"on": True}  # the first run's calls are slow until the second has been refused
    with ScriptedServer(
        {"env": echo_environment(), "agent": relay_agent()},
        latency={"env": lambda: 0.5 if slow["on"] else 0.0},
    ) as server:
        args = ["batch", str(questions), "--out", str(out), "--concurrency", "2", *_endpoints(server)]
        first = _spawn(args, tmp_path / "first.log", FIRST_KEY)
        try:
            wait_for(lambda: _holds(lock_path(out), first.pid), "the first run to hold --out")
            second = _spawn(args, tmp_path / "second.log", SECOND_KEY)
            refused = _finish(second)
            assert first.poll() is None  # the refusal came while the first was writing
        finally:
            slow["on"] = False
            done = _finish(first)
        printed = (tmp_path / "second.log").read_text().strip()
        assert refused == 2 and done == 0, printed
        assert printed.count("\n") == 0 and printed.startswith("prompt-r1: error: --out "), printed
        assert f"{out} is being written by another run (pid {first.pid} on " in printed
        assert _sent_with(server, SECOND_KEY) == []  # the second run called nothing, agent or environment
        bodies = Counter(json.dumps(r.body["messages"]) for r in server.requests_for("env"))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(f"q{i}" for i in range(12))
    assert sum(bodies.values()) == 24 and set(bodies.values()) == {1}  # 12 ids, 2 calls each, each paid once
    assert not lock_path(out).exists()  # removed when the first run ended


def test_a_writer_killed_with_sigkill_leaves_no_lock(tmp_path):
    questions, out = write_questions(tmp_path / "q.jsonl", 12), tmp_path / "results.jsonl"
    slow = {"on": True}
    with ScriptedServer(
        {"env": echo_environment(), "agent": relay_agent()},
        latency={"env": lambda: 0.5 if slow["on"] else 0.0},
    ) as server:
        args = ["batch", str(questions), "--out", str(out), "--concurrency", "2", *_endpoints(server)]
        first = _spawn(args, tmp_path / "first.log", FIRST_KEY)
        try:
            wait_for(
                lambda: _holds(lock_path(out), first.pid) and server.requests_for("env"), "a call in flight"
            )
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        slow["on"] = False
        os.environ["ONE_WRITER_KEY"] = SECOND_KEY
        try:
            assert main(args[:-1]) == 0  # in this process: the kernel let go of the killed run's lock
        finally:
            del os.environ["ONE_WRITER_KEY"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(f"q{i}" for i in range(12))
    assert not lock_path(out).exists()


def _hold_in_another_process(output: Path, tmp_path: Path, *, folder: bool) -> subprocess.Popen:
    """A process holding `output`'s lock until killed, as a run writing it would."""
    code = (
        "import sys, time\nfrom prompt_r1.runs.output_lock import hold_output\n"
        f"with hold_output({str(output)!r}, 'x', folder={folder}):\n    print('held', flush=True)\n    time.sleep(300)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_shards_write_their_own_files_side_by_side(tmp_path):
    questions, out = write_questions(tmp_path / "q.jsonl", 12), tmp_path / "results.jsonl"
    holder = _hold_in_another_process(Shard(1, 2).path(out), tmp_path, folder=False)  # shard 1 is running
    try:
        with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
            os.environ["ONE_WRITER_KEY"] = FIRST_KEY
            try:
                args = ["batch", str(questions), "--out", str(out), *_endpoints(server)]
                assert main([*args, "--shard", "2/2"]) == 0  # shard 2 runs beside it
                assert main([*args, "--shard", "1/2"]) == 2  # shard 1 is the holder's
                assert main(args) == 0  # the unsharded file is another output
            finally:
                del os.environ["ONE_WRITER_KEY"]
    finally:
        holder.kill()
        holder.wait()
    assert Shard(2, 2).path(out).exists() and not Shard(1, 2).path(out).exists()


def test_a_second_eval_on_the_same_folder_is_refused_before_anything_is_written(tmp_path, capsys):
    questions, out = write_questions(tmp_path / "q.jsonl", 12), tmp_path / "eval"
    holder = _hold_in_another_process(out, tmp_path, folder=True)
    try:
        with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
            os.environ["ONE_WRITER_KEY"] = FIRST_KEY
            try:
                code = main(["eval", "--dataset", str(questions), "--method", "env-only", "--out", str(out),
                             "--no-chart", *_endpoints(server)])  # fmt: skip
            finally:
                del os.environ["ONE_WRITER_KEY"]
            assert server.requests == []
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0, err
    assert f"--out {out} is being written by another run (pid {holder.pid} on " in err
    assert [p.name for p in out.iterdir()] == [".prompt-r1.lock"]  # the holder's: nothing of the refused run


def test_the_lock_is_reentrant_in_one_process_and_refuses_another(tmp_path):
    out = tmp_path / "new" / "results.jsonl"
    with (
        hold_output(out, "--out") as lock,
        hold_output(tmp_path / "new" / ".." / "new" / "results.jsonl", "--out"),
    ):
        assert lock.exists() and lock.read_text().startswith(f"pid {os.getpid()} on ")
        code = "from prompt_r1.runs.output_lock import hold_output\n"
        code += f"with hold_output({str(out)!r}, '--out'): pass"
        other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
        assert (
            other.returncode != 0 and "OutputError" in other.stderr and f"pid {os.getpid()}" in other.stderr
        )
    assert not (tmp_path / "new").exists()  # the folder made for the lock, left empty, is gone with it
    with pytest.raises(OutputError, match="cannot write --out"):
        (tmp_path / "file").write_text("")
        with hold_output(tmp_path / "file" / "results.jsonl", "--out"):
            pass
