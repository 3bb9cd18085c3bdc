"""Every output path is checked before anything is written to it: `--out` equal to the input or naming another
file, a torn last row, folders that cannot be written, a read-only or full file system (a real small one), side
files, summaries and checkpoints; one line each, the input untouched. Real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hostile_setup import AGENT_KEY, ENV_KEY, KEY_ENV, run_args

from prompt_r1.cli.main import main
from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    for name, key in KEY_ENV.items():
        monkeypatch.setenv(name, key)


def batch_args(server: ScriptedServer, inp: Path, out: Path, *extra: str) -> list[str]:
    return ["batch", str(inp), "--out", str(out), "--no-progress", *run_args(server)[2:], *extra]


@pytest.fixture
def questions(tmp_path) -> Path:
    path = tmp_path / "q.jsonl"  # no trailing newline: a file a careless --out would lose its last line of
    path.write_text("\n".join(json.dumps({"id": f"q{i}", "question": f"Item {i}?"}) for i in range(3)))
    return path


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("prompt-r1: error: "), err
    return lines[0]


def test_batch_out_equal_to_the_input_is_refused_untouched(questions, capsys):
    before = questions.read_bytes()
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(1)}) as server:
        assert main(batch_args(server, questions, questions)) == 2
        assert not server.requests
    assert "is the input file" in one_error_line(capsys.readouterr().err)
    assert questions.read_bytes() == before


def test_batch_out_naming_another_file_is_refused_untouched(questions, tmp_path, capsys):
    other = tmp_path / "notes.jsonl"
    other.write_text('{"note": "keep me"}\n{"note": "and my last line"}')
    before = other.read_bytes()
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(1)}) as server:
        assert main(batch_args(server, questions, other)) == 2
        assert not server.requests
    assert "line 1 is not a results row" in one_error_line(capsys.readouterr().err)
    assert other.read_bytes() == before


def test_a_torn_row_of_our_own_is_cut_and_a_complete_last_row_kept(questions, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(1)}) as server:
        assert main(batch_args(server, questions, out, "--limit", "2")) == 0
        rows = out.read_text().splitlines()
        out.write_text(rows[0])  # the last row complete, its newline lost
        assert main(batch_args(server, questions, out, "--limit", "2")) == 0
        out.write_text(out.read_text() + '{"id": "q2", "dataset": "q", "ques')  # a row torn mid-write
        assert main(batch_args(server, questions, out)) == 0
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == ["q0", "q1", "q2"]


@pytest.mark.parametrize("where", ["folder", "under-a-file", "a-device"])
def test_batch_out_that_cannot_be_written_is_one_line(where, questions, tmp_path, capsys):
    out = {
        "folder": tmp_path / "dir.jsonl",
        "under-a-file": questions / "r.jsonl",
        "a-device": tmp_path / "null.jsonl",
    }[where]
    if where == "folder":
        out.mkdir()
    if where == "a-device":
        out.symlink_to(os.devnull)
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(1)}) as server:
        code = main(batch_args(server, questions, out))
        assert not server.requests
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and f"--out {out}" in line
    assert {"folder": "is a folder", "under-a-file": "is not a folder", "a-device": "not a regular file"}[
        where
    ] in line


def run_on_a_small_file_system(tmp_path: Path, argv_for, *, read_only: bool) -> tuple[int, str, Path]:
    """Run the CLI in a mount namespace of its own with a 24 KiB tmpfs at MOUNT (read-only, or soon full), as a
    real full disk or read-only mount behaves (as root, a permission bit cannot make a file unwritable)."""
    import shutil
    import subprocess
    import sys

    mount = tmp_path / "small"
    mount.mkdir()
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'mount -t tmpfs tmpfs "{mount}"'], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private namespace here: {probe.stderr.decode().strip()}")
    remount = f' && mount -o remount,ro "{mount}"' if read_only else ""
    script = f'mount -t tmpfs -o size=24k tmpfs "{mount}"{remount} && exec "$@"'
    command = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        sys.executable,
        "-m",
        "prompt_r1",
    ]
    env = {**os.environ, "HOSTILE_AGENT_KEY": AGENT_KEY, "HOSTILE_ENV_KEY": ENV_KEY}
    done = subprocess.run(command + argv_for(mount), capture_output=True, text=True, env=env, timeout=120)
    return done.returncode, done.stderr, mount


@pytest.mark.parametrize("read_only", [True, False])
def test_batch_on_a_read_only_or_full_file_system_is_one_line(read_only, tmp_path):
    inp = tmp_path / "q.jsonl"
    rows = (json.dumps({"id": f"q{i}", "question": f"Item {i}? " + "x" * 400}) + "\n" for i in range(80))
    inp.write_text("".join(rows))
    summary = str(tmp_path / "s.json")
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(1)}) as server:
        code, err, mount = run_on_a_small_file_system(
            tmp_path,
            lambda mount: batch_args(
                server, inp, mount / "r.jsonl", "--summary", summary, "--concurrency", "4"
            ),
            read_only=read_only,
        )
    assert code == 2 and "Traceback" not in err, err
    line = one_error_line("\n".join(x for x in err.splitlines() if x.startswith("prompt-r1: error")))
    assert f"{mount}/r.jsonl" in line
    assert ("Read-only file system" if read_only else "No space left on device") in line


@pytest.mark.parametrize(
    "problem", ["not-a-database", "is-the-input", "summary-is-a-folder", "summary-not-ours"]
)
def test_batch_side_files_are_checked_before_anything_runs(problem, questions, tmp_path, capsys):
    out, extra = tmp_path / "r.jsonl", []
    if problem == "not-a-database":
        checkpoint = tmp_path / "c.sqlite"
        checkpoint.write_text("these are my notes, not a database\n")
        extra, kept = ["--checkpoint", str(checkpoint)], checkpoint
    elif problem == "is-the-input":
        extra, kept = ["--checkpoint", str(questions)], questions
    elif problem == "summary-is-a-folder":
        (tmp_path / "s.json").mkdir()
        extra, kept = ["--summary", str(tmp_path / "s.json")], None
    else:
        (tmp_path / "s.json").write_text("my own file\n")
        extra, kept = ["--summary", str(tmp_path / "s.json")], tmp_path / "s.json"
    before = kept.read_bytes() if kept else None
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(1)}) as server:
        assert main(batch_args(server, questions, out, *extra)) == 2
        assert not server.requests
    line = one_error_line(capsys.readouterr().err)
    expected = {
        "not-a-database": "is not a SQLite database",
        "is-the-input": "is the input file",
        "summary-is-a-folder": "is a folder",
        "summary-not-ours": "is not a summary this command wrote",
    }[problem]
    assert expected in line
    if kept:
        assert kept.read_bytes() == before


def test_an_unwritable_summary_is_refused_before_anything_runs(questions, tmp_path, capsys):
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(1)}) as server:
        code = main(
            batch_args(server, questions, tmp_path / "r.jsonl", "--summary", str(tmp_path / "no" / "s.json"))
        )
        assert not server.requests
    assert code == 2 and "its folder" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", ["eval", "score"])
def test_eval_and_score_out_that_cannot_be_written_is_one_line(command, tmp_path, capsys):
    data = tmp_path / "qs.jsonl"
    data.write_text(
        json.dumps({"id": "1", "question": "Where?", "golden_answers": ["Paris"], "prediction": "Paris"})
        + "\n"
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(1)}) as server:
        if command == "eval":
            args = [
                "eval",
                "--dataset",
                str(data),
                "--out",
                str(blocker),
                "--no-progress",
                *run_args(server)[2:],
            ]
        else:
            args = ["score", str(data), "--out", str(blocker / "sub"), "--no-chart"]
        code = main(args)
    assert code == 2 and str(blocker) in one_error_line(capsys.readouterr().err)
    assert blocker.read_text() == "not a folder\n"


def test_a_checkpoint_on_a_read_only_file_system_is_one_line_before_anything_runs(tmp_path):
    inp = tmp_path / "q.jsonl"
    inp.write_text(json.dumps({"id": "q0", "question": "Item 0?"}) + "\n")
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(1)}) as server:
        code, err, mount = run_on_a_small_file_system(
            tmp_path,
            lambda mount: batch_args(
                server, inp, tmp_path / "r.jsonl", "--checkpoint", str(mount / "c.sqlite")
            ),
            read_only=True,
        )
        assert not server.requests
    assert code == 2 and "Traceback" not in err, err
    line = one_error_line(err)
    assert f"--checkpoint {mount}/c.sqlite" in line and "Read-only file system" in line
