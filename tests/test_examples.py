"""The runnable examples in graphs/ run offline against scripted servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GRAPHS = Path(__file__).resolve().parent.parent / "graphs"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("embed_in_parent.py", "Answer: Arthur's Magazine\nsteps: cleaned, formatted"),
        ("batch_questions.py", "4 episodes in"),
        ("stream_turns.py", "[environment] Response 1: When were"),
    ],
)
def test_example_runs(script, expected):
    done = subprocess.run(
        [sys.executable, str(GRAPHS / script), "--demo"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout
