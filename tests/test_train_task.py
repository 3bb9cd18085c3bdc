"""`prompt-r1 train --task door-codes` and `python training/door_demo.py`: the door-codes task end to end with no
recipe, model or environment of the user's (prompt_r1/cli/train_task.py, prompt_r1/tasks/door_run.py).

The refusals run the real command in this process and come before any agent is built: one line, exit 2, nothing
written. The run itself (a tiny agent built and trained for 20 steps) is marked slow; the README's full demo is
tests/test_docs_examples.py's (slow too).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prompt_r1.cli.main import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def _refused(capsys, argv: list[str]) -> str:
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--task", "nope"], "argument --task: invalid choice: 'nope'"),
        (["--task", "door-codes", "--max_steps", "5"], "must be an integer ≥ 20, got 5"),
        (["--task", "door-codes", "--max_steps", "nan"], "must be an integer ≥ 20, got 'nan'"),
        (["--task=door-codes", "--seed", "-1"], "--seed: must be an integer ≥ 0, got -1"),
        # A recipe's field would be dropped without a word: the task trains with the benchmark's settings.
        (
            ["--task", "door-codes", "--learning_rate", "1e-2"],
            "--task door-codes takes only --max_steps, --output_dir and --seed, not --learning_rate 1e-2",
        ),
        (["--config", "training/configs/tiny-cpu.yaml", "--task", "door-codes"], "not --config"),
    ],
)
def test_a_bad_task_flag_is_one_line_and_nothing_is_built(capsys, tmp_path, monkeypatch, flags, says):
    monkeypatch.chdir(tmp_path)  # the default output folder, were anything written, would land here
    line = _refused(capsys, ["train", *flags])
    assert says in line, line
    assert not list(tmp_path.iterdir())


def test_an_output_dir_that_is_a_file_is_refused_before_the_agent_is_built(capsys, tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("not a folder\n")
    line = _refused(capsys, ["train", "--task", "door-codes", "--output_dir", str(taken)])
    assert line.startswith("prompt-r1: error: ") and str(taken) in line, line
    assert taken.read_text() == "not a folder\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_task_help_names_its_flags_and_defaults(capsys):
    assert cli_main(["train", "--task", "door-codes", "--help"]) == 0
    out = capsys.readouterr().out
    for text in ("--max_steps", "default: 40", "--output_dir", "runs/door-codes", "--seed", "door-codes"):
        assert text in out, out


@pytest.mark.slow
def test_the_demo_builds_trains_and_says_what_it_learned(tmp_path):
    """`python training/door_demo.py` for 20 steps (the fewest that compare two windows of 10): the first line says
    the players are scripted and offline, the build says each stage, a line per step, the figures on disk, and the
    reward line last."""
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(ROOT / "training/door_demo.py"), "--max_steps", "20", "--output_dir", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[0].startswith(
        "door codes: GRPO training offline on this CPU. The agent is a tiny model built here"
    )
    assert any(line.startswith("agent: stage 2 of 2") or "stage 2 of 2" in line for line in lines)
    assert sum(bool(re.match(r"step \d+/20 ", line)) for line in lines) == 20
    assert re.fullmatch(r"reward: first 10 steps [+-]\d\.\d\d -> last 10 steps [+-]\d\.\d\d", lines[-1]), (
        lines[-1]
    )
    figures = json.loads((out / "door_task.json").read_text())
    assert figures["steps"] == 20 and figures["seed"] == 0
    assert (out / "curves.png").is_file() and (out / "model.safetensors").is_file()
    assert json.loads((out / "agent" / "door_build.json").read_text())["seed"] == 0
    manifest = json.loads((out / "manifest.json").read_text())  # as train's, naming the task
    assert manifest["command"] == "train" and manifest["settings"]["measured"]["task"]["name"] == "door-codes"
    assert f"curves: {out / 'curves.png'}" in done.stderr


def test_tiny_demo_is_an_alias_of_the_door_demo(tmp_path):
    """The former README command still works: it says where it went and passes its flags on (here a refused one,
    so that nothing is built)."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "training/tiny_demo.py"),
            "--max_steps",
            "3",
            "--output_dir",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "tiny_demo.py is now door_demo.py: running python training/door_demo.py", lines
    assert "--max_steps/--max-steps: must be an integer ≥ 20, got 3" in lines[1] and len(lines) == 2, lines
    assert not (tmp_path / "o").exists()
