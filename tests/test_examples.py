"""The runnable examples in graphs/ and evals/ run offline against scripted servers."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_script

GRAPHS = Path(__file__).resolve().parent.parent / "graphs"


# Each runs as README.md's and graphs/README.md's tours write it (`python graphs/SCRIPT --demo FLAGS`): those blocks
# name this test as the one that runs them, so a flag added there must be added here.
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("embed_in_parent.py", ["Answer: Arthur's Magazine\nsteps: cleaned, formatted"]),
        ("batch_questions.py --concurrency 4", ["4 episodes in"]),
        ("stream_turns.py", ["turn 1  response:  Response 1: When were"]),
        (
            "chat_model_demo.py",
            [
                "chain: Arthur's Magazine\nagent: Arthur's Magazine\nturn 1  think:     Compare founding years.\n",
                "turn 2  answer:    Arthur's Magazine\nend     answered after 2 turn(s)",
                "\nstreamed answer: Arthur's Magazine\n",
            ],
        ),
        (
            "serve_demo.py",
            [
                "answer: Arthur's Magazine  (answered, 2 turns, ",
                "streamed:\nturn 1  think:     Compare founding years.\n",
                "end     answered after 2 turn(s) · answer: Arthur's Magazine\nstreamed answer: Arthur's Magazine\n",
            ],
        ),
    ],
)
def test_example_runs(script, expected):
    script, *flags = script.split()
    done = subprocess.run(
        [sys.executable, str(GRAPHS / script), "--demo", *flags], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # The first line says the players are scripted, before any canned answer can pass for a model's.
    first = done.stdout.splitlines()[0]
    assert first.startswith("demo: the agent and the environment are scripted (canned replies served at "
                            "http://127.0.0.1:"), first  # fmt: skip
    for part in expected:
        assert part in done.stdout
    assert "Warning" not in done.stderr, done.stderr


def test_eval_demo_produces_the_table(tmp_path):
    # In this process, through the script's `run(argv)` (its `__main__` only passes that to sys.exit): a process of
    # its own would add nothing checked here, only an interpreter's start and imports. An evals/ demo run as a file,
    # importing demo_eval beside it, is test_the_comparison_demo_runs_every_method_against_two_environments.
    demo = load_script(GRAPHS.parent / "evals" / "demo_eval.py", "demo_eval")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = demo.run(["--limit", "2", "--out", str(tmp_path / "demo")])
    stdout = out.getvalue()
    assert code == 0, err.getvalue()
    assert stdout.startswith("| Method | HotpotQA EM | HotpotQA F1 | 2WikiMQA EM")
    assert "| Prompt-R1 |" in stdout and "| Env CoT |" in stdout
    assert (tmp_path / "demo" / "chart.png").exists()
    # The scripted agent reads the environment's answer out of its (escaped) reply: a loop that lost it would
    # score nothing, as once went unnoticed here.
    prompt_r1 = next(line for line in stdout.splitlines() if line.startswith("| Prompt-R1 |"))
    assert any(
        float(cell.strip(" *†")) > 0 for cell in prompt_r1.split("|")[2:-1] if cell.strip() not in ("", "–")
    )


def test_the_comparison_demo_runs_every_method_against_two_environments(tmp_path):
    """The paper's comparisons in one command (evals/demo_comparison.py): Prompt-R1, the baselines and the three
    prompt optimisers on the paper-main suite against two scripted environments, with costs and the sweep."""
    script = GRAPHS.parent / "evals" / "demo_comparison.py"
    out = tmp_path / "cmp"
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "--limit",
            "1",
            "--train-rows",
            "1",
            "--budget",
            "3",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # nothing may be written outside --out (TextGrad opens a log on import)
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]
    for env in ("big", "small"):
        table = (out / env / "table.md").read_text()
        for title in ("Prompt-R1", "Env only (w/o agent)", "Env CoT", "OPRO", "GEPA", "TextGrad"):
            assert f"| {title} |" in table, (env, title)
        assert "| Search calls | Search $ |" in table and (out / env / "cost.png").exists()
        for method in ("opro", "gepa", "textgrad"):
            assert len(list((out / env / "optimized" / method).glob("*.json"))) == 8, (env, method)
    sweep = (out / "sweep.md").read_text()
    assert "| big |" in sweep and "| small |" in sweep and sweep in done.stdout
