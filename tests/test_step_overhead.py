"""The benchmark of a GRPO step without the model's math (`evals/bench/step_overhead.py`), at a tiny size: it runs
the two-turn step end to end (canned policy, the scripted environment in its own process) and ends on the line
the issue's target reads. Its figures are the benchmark's; here only their shape."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import ROOT


def test_the_overhead_benchmark_runs_tiny_and_ends_on_its_summary_line():
    run = subprocess.run(
        [sys.executable, str(ROOT / "evals/bench/step_overhead.py"), "--episodes", "2,4", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    number = r"\d+\.\d+"
    assert re.fullmatch(
        rf"overhead: {number} ms per episode-turn at 2, {number} at 4; 4/2 per episode {number}", lines[-1]
    ), lines[-1]
    # Every episode played both turns: 2 and 4 episodes, 4 and 8 episode-turns.
    turns = {
        int(line.split()[0]): int(line.split()[1]) for line in lines if re.match(r"\s+\d+\s+\d+\s", line)
    }
    assert turns == {2: 4, 4: 8}, lines
    # The rollout's breakdown (the trainer's step line): its parts add up to its wall time.
    splits = [line for line in lines if " rollout " in line and " = generate " in line]
    assert len(splits) == 2, lines
    for line in splits:
        found = re.search(
            rf"rollout ({number}) = generate ({number}) \(by turn ({number}(?:, {number})*)\) \+ "
            rf"environment ({number}) \+ loop ({number})",
            line,
        )
        assert found, line
        rollout, generate, environment, loop = (float(found[i]) for i in (1, 2, 4, 5))
        assert generate >= 0 and environment >= 0 and loop > 0
        assert generate + environment + loop == pytest.approx(rollout, abs=0.002), line
        # The generation by turn: the loop's turns, adding up to it (each figure rounded to 1 ms).
        turns = [float(x) for x in found[3].split(", ")]
        assert len(turns) >= 2 and sum(turns) == pytest.approx(generate, abs=0.002 * len(turns)), line
