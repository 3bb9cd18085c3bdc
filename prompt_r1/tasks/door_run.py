"""The door-codes task in one command, for watching GRPO teach a tiny agent to use its environment:

    prompt-r1 train --task door-codes [--max_steps N] [--output_dir DIR] [--seed S]
    python training/door_demo.py [the same flags]

`run_door_task` says first that both players are tiny and scripted and that nothing leaves the machine; builds the
agent (`build_door_model`, a line per stage) into OUTPUT_DIR/agent, or reuses the one built there for the same
seed; starts the scripted environment (`door_environment` on a `DoorTable` redrawn every step) on 127.0.0.1;
trains with the learning benchmark's GRPO settings (`door_training.grpo_config`: only the steps and the seed are
the command's) on the synchronous trainer, a line per step, with the run's manifest in OUTPUT_DIR/manifest.json
naming the task; and ends with what was learned, where the curves are,
and, last, one line:

    reward: first 10 steps +0.22 -> last 10 steps +0.61

Needs the `train` and `dev` extras.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prompt_r1.core.errors import ConfigError

__all__ = ["DEFAULT_OUTPUT", "DEFAULT_STEPS", "TASKS", "WINDOW", "run_door_task"]

TASKS = ("door-codes",)
# Enough for the reward to rise on every seed tried (0, 1, 2: +0.27 to +0.45 from the first 10 steps to the last
# 10), within five minutes on 2 CPU cores with the agent's build (docs/train.md has the runs).
DEFAULT_STEPS = 40
DEFAULT_OUTPUT = "runs/door-codes"
WINDOW = 10  # the first and the last this many steps are compared


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_door_task(
    output_dir: str | Path = DEFAULT_OUTPUT,
    *,
    max_steps: int = DEFAULT_STEPS,
    seed: int = 0,
    say: Callable[[str], None] = _stderr,
) -> dict[str, Any]:
    """Build (or reuse) the agent, train it on the door-codes task for `max_steps` steps into `output_dir`, and
    say what it learned. Returns the figures, also written to OUTPUT_DIR/door_task.json: the first and last
    `WINDOW` steps' mean reward, share that asked about the question's door and share answered with the code the
    environment gave for it (`door_training.DOOR_METRICS`), the curves' path, and the seconds spent."""
    if max_steps < 2 * WINDOW:
        raise ConfigError(
            f"--max_steps must be at least {2 * WINDOW} (the first and last {WINDOW} are compared)"
        )
    from prompt_r1.runs.output_lock import hold_output

    # Held from before the agent's build (training takes it again, in this process): a second run on the folder
    # is refused in one line before it builds an agent over this one's.
    with hold_output(output_dir, "--output_dir", folder=True), _quiet_loading():
        return _run(Path(output_dir), max_steps, seed, say)


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """Without transformers' bars for each save and load of the tiny model (a dozen in a build): the stages'
    lines say what happens. The trainer's own step bar is not one of them."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def _run(out: Path, max_steps: int, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
    started = time.monotonic()
    say(
        "door codes: GRPO training offline on this CPU. The agent is a tiny model built here from scratch and the "
        "environment a scripted server on 127.0.0.1: nothing is downloaded, nothing leaves this machine."
    )
    say(
        "the task: a question asks for one of 24 doors' codes, which only the environment knows and redraws every "
        "step. Reward 1 for asking about the question's door and answering with the code it replies, 0 for a "
        "well-formed episode that does not, -0.4 for answering without asking."
    )
    model = _agent(out / "agent", seed, say)

    from prompt_r1.tasks.door_codes import DoorTable, door_environment, training_rows
    from prompt_r1.tasks.door_training import DOOR_METRICS, door_trainer, grpo_config
    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.training.run import train
    from prompt_r1.training.shared.progress import CURVES, draw_curves, step_series

    table = DoorTable(seed)
    with ScriptedServer({"env": door_environment(table)}, record=False) as server:
        config = grpo_config(out, model, server.base_url, max_steps=max_steps, seed=seed, data_seed=seed)
        batch, group = config.per_device_train_batch_size, config.num_generations
        rows = training_rows(max_steps * batch // group + batch, seed=seed)
        say(
            f"training: {max_steps} steps of {batch} episodes ({batch // group} questions, {group} tries each), "
            f"the scripted environment at {server.base_url}; a line per step"
        )
        trained = time.monotonic()
        # The manifest (output_dir/manifest.json, as `train` writes) names the task: its rows and its scripted
        # environment, not the config's train_data, are what the agent learned from.
        task = {
            "name": "door-codes",
            "rows": len(rows),
            "environment": "scripted door table",
            "table_seed": seed,
        }
        trainer = train(config, build=lambda c: door_trainer(c, table, rows), task=task)
        seconds = time.monotonic() - trained
    series = step_series(trainer.state.log_history, extra=DOOR_METRICS)
    curves = draw_curves(
        [series],
        out / "curves.png",
        title=f"door codes, seed {seed}",
        curves=(*CURVES, ("correct from the reply", "door/correct_from_reply")),
    )

    def ends(key: str) -> tuple[float, float]:
        values = series[key]
        return statistics.fmean(values[:WINDOW]), statistics.fmean(values[-WINDOW:])

    figures = {
        "seed": seed,
        "steps": max_steps,
        "reward": ends("reward"),
        "asked_right": ends("door/asked_right"),
        "from_reply": ends("door/correct_from_reply"),
        "curves": str(curves) if curves else None,
        "train_seconds": seconds,
        "seconds": time.monotonic() - started,
    }
    (out / "door_task.json").write_text(json.dumps(figures, indent=1) + "\n")
    (a0, a1), (c0, c1), (r0, r1) = figures["asked_right"], figures["from_reply"], figures["reward"]
    say(
        f"learned, first {WINDOW} steps -> last {WINDOW}: asked about the question's door {a0:.0%} -> {a1:.0%} of "
        f"episodes; answered with the code the environment gave for it {c0:.0%} -> {c1:.0%} (a guess is right 12%)"
    )
    if r1 <= r0:
        say(f"the reward did not rise on seed {seed} in {max_steps} steps: try more steps (--max_steps)")
    where = (
        f"curves: {curves}" if curves else "curves not drawn: matplotlib is not installed (the train extra)"
    )
    say(f"{where}; the trained agent: {out}; {figures['seconds']:.0f} s in all, {seconds:.0f} s training")
    say(f"reward: first {WINDOW} steps {r0:+.2f} -> last {WINDOW} steps {r1:+.2f}")
    return figures


def _agent(path: Path, seed: int, say: Callable[[str], None]) -> Path:
    """The seed's agent at `path`: the one built there before for `seed`, or a new one."""
    from prompt_r1.tasks.door_codes import build_door_model

    marker = path / "door_build.json"  # written last by the build: a half-built agent is rebuilt
    if marker.is_file() and json.loads(marker.read_text()).get("seed") == seed:
        say(f"agent: the one built before in {path} (seed {seed}); delete that folder to build it again")
        return path
    say(f"agent: building it in {path} (about two minutes on 2 cores), a line per stage")
    return build_door_model(path, seed=seed, say=say)
