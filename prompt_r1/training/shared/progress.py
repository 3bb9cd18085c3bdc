"""Training you can watch: one line per step on stderr, and the curves drawn into the output folder at the end.

`StepLines` prints, on the main process, the step's mean reward with its format and answer parts, the episodes'
turns, environment calls and agent tokens, the time per step and where it went (`breakdown`), from the metrics TRL
logs each step (logging_steps 1 gives a line per step). `CurvesPNG` draws `curves.png` from the trainer's log
history when training ends.
`draw_curves` is the drawing, shared with `evals/bench/learning.py`, which draws several seeds (mean and spread).
`install` puts both on a trainer, in place of the dict of every logged metric that transformers prints.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

__all__ = [
    "CURVES",
    "STUCK_STEPS",
    "CurvesPNG",
    "StepLines",
    "breakdown",
    "draw_curves",
    "install",
    "step_series",
    "time_metrics",
    "time_scoring",
]

# (what is drawn, the log key TRL or the rollout writes it under)
CURVES = (
    ("total reward", "reward"),
    ("answer reward", "rewards/prompt_r1_answer/mean"),
    ("format reward", "rewards/prompt_r1_format/mean"),
    ("environment calls / episode", "episode/env_calls"),
    ("agent tokens / episode", "episode/agent_completion_tokens"),
)


def step_series(log_history: Sequence[dict[str, Any]], extra: Sequence[str] = ()) -> dict[str, list[float]]:
    """Each curve's value per logged training step (NaN where a step lacks it), and the steps themselves; `extra`
    names more logged keys to collect."""
    rows = [row for row in log_history if "reward" in row and "step" in row]
    # A step whose episodes all failed logs no reward (None): a gap in the curve, not a crash at the end.
    keys = [key for _, key in CURVES] + list(extra)
    series = {key: [_float_or_nan(row.get(key)) for row in rows] for key in keys}
    series["step"] = [float(row["step"]) for row in rows]
    return series


def draw_curves(
    runs: Sequence[dict[str, list[float]]],
    path: str | Path,
    title: str = "",
    curves: Sequence[tuple[str, str]] = CURVES,
) -> Path | None:
    """Draw each of `curves` ((label, key) pairs) of `runs` (`step_series` of one run or of several seeds: their
    mean, and their range shaded) into a PNG at `path`. Returns the path, or None without matplotlib (the `train`
    extra has it)."""
    try:
        from matplotlib.figure import Figure  # no pyplot: the caller's plotting backend is left alone
    except ImportError:
        return None
    fig = Figure(figsize=(4 * len(curves), 3.2))
    axes = fig.subplots(1, len(curves), squeeze=False)
    for axis, (label, key) in zip(axes[0], curves, strict=True):
        length = min(len(run[key]) for run in runs) if runs else 0
        if length == 0:
            axis.set_title(label)
            continue
        steps = runs[0]["step"][:length]
        columns = list(zip(*(run[key][:length] for run in runs), strict=True))
        mean = [_nanmean(c) for c in columns]
        axis.plot(steps, mean, color="tab:blue")
        if len(runs) > 1:
            lows = [min((v for v in c if not math.isnan(v)), default=math.nan) for c in columns]
            highs = [max((v for v in c if not math.isnan(v)), default=math.nan) for c in columns]
            axis.fill_between(steps, lows, highs, color="tab:blue", alpha=0.2, linewidth=0)
        axis.set_title(label)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def _nanmean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _number(value: Any, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


# Consecutive steps of a stuck sign before `StepLines` says so.
STUCK_STEPS = 5
# (log key, the test of its value (and the run's settings) that means stuck, what it means): a step where every
# group's rewards are equal teaches nothing (zero advantages), a policy that has stopped calling the environment
# rarely finds its way back, and one that calls until it runs out of turns never answers.
STUCK_SIGNS = (
    (
        "frac_reward_zero_std",
        lambda value, args: value == 1.0,
        "every group had equal rewards (no advantage to learn from)",
    ),
    ("episode/env_calls", lambda value, args: value == 0.0, "no episode called the environment"),
    (
        "episode/status_max_turns",
        lambda value, args: value >= 0.5,
        "half the episodes or more called the environment until max_turns without answering",
    ),
)


class StepLines(TrainerCallback):
    """A line per logged training step on stderr (main process only), and a warning when the policy is stuck:
    a sign of `STUCK_SIGNS` held for `stuck_steps` steps in a row (said once per spell)."""

    def __init__(self, stream: Any = None, stuck_steps: int = STUCK_STEPS) -> None:
        self.stream = stream
        self.stuck_steps = stuck_steps
        self._last: float | None = None
        self._last_step = 0  # the step of the last line
        self._streaks = dict.fromkeys((key for key, _, _ in STUCK_SIGNS), 0)
        self.warnings: list[str] = []  # what was said, for callers and tests

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = time.monotonic()
        self._last_step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        now = time.monotonic()
        seconds = now - self._last if self._last is not None else math.nan
        self._last = now
        line = (
            f"step {state.global_step}/{state.max_steps}  reward {_number(logs.get('reward'), '+.3f')} "
            f"(format {_number(logs.get('rewards/prompt_r1_format/mean'), '.2f')}, "
            f"answer {_number(logs.get('rewards/prompt_r1_answer/mean'), '.2f')})  "
            f"turns {_number(logs.get('episode/turns'), '.2f')}  "
            f"env calls {_number(logs.get('episode/env_calls'), '.2f')}  "
            f"tokens {_number(logs.get('episode/agent_completion_tokens'), '.0f')}  "
            f"{_number(seconds, '.1f')} s"
        )
        if "env/cost" in logs:  # prompt_r1.training.shared.spend: what the environment cost
            total = logs.get("env/total_cost")
            cost = _number(logs["env/cost"], ".4f")
            total = _number(
                total, ".2f" if total is not None and total >= 1 else ".4f"
            )  # cents show under $1
            line += f"  ${cost} this step, ${total} total"
        steps = max(state.global_step - self._last_step, 1)
        line += breakdown(logs, seconds / steps)
        self._last_step = state.global_step
        # The async trainer: how old the samples it trained on were, and how many it dropped.
        if "sample/staleness_max" in logs:
            line += (
                f"  staleness <= {_number(logs.get('sample/staleness_max'), '.0f')}"
                f" (dropped {_number(logs.get('sample/dropped_stale_total') or 0.0, '.0f')})"
            )
        from tqdm.auto import tqdm

        tqdm.write(line, file=self.stream or sys.stderr)  # above transformers' progress bar, not inside it
        for warning in self._stuck(logs, state.global_step, args):
            self.warnings.append(warning)
            tqdm.write(warning, file=self.stream or sys.stderr)

    def _stuck(self, logs: dict[str, Any], step: int, args: Any = None) -> list[str]:
        said = []
        for key, stuck, meaning in STUCK_SIGNS:
            held = logs.get(key) is not None and stuck(float(logs[key]), args)
            self._streaks[key] = self._streaks[key] + 1 if held else 0
            if self._streaks[key] == self.stuck_steps:
                said.append(
                    f"warning: the policy looks stuck at step {step}: {meaning} for {self.stuck_steps} steps in a "
                    "row; a KL term (beta), a lower learning rate or a stronger starting agent are the usual remedies"
                )
        return said


def breakdown(logs: dict[str, Any], step_s: float) -> str:
    """Where a step of `step_s` seconds went, from the `time/*` metrics of `logs` ("" when none were logged). The
    logged means are over the steps since the last line, and so is `step_s`. The parts are shown as logged, so
    that they add up to the line's time only as far as the clocks account for it (`other` is the step clock's
    rest of the step: `prompt_r1.training.shared.step_clock`).

    The synchronous trainer (prompt_r1.training.sync): the rollout's parts, the reward functions (`scoring`), TRL's
    preparation of the samples (`prepare`: what its `_prepare_inputs` took beyond the rollout and the scoring),
    the forward and backward passes and the optimizer (`training`) and the rest:
    `(rollout R s: generate G (by turn G1, G2, ...), env E, loop L; scoring S s, prepare P s, training T s,
    other O s)`. A trainer without the step clock: `(rollout ...; rest X s)`, X what the rollout left of `step_s`.

    The asynchronous one (prompt_r1.training.asynchronous), whose rollouts run beside its steps: the rollout
    worker's seconds a group, averaged over the groups the step trained on, then the step's own parts, the wait for
    samples, training, the weight sync and the rest: `(rollout R s a group: generate G, env E, loop L; scoring S s;
    step: wait W s, training T s, sync Y s, other O s)`."""
    asynchronous = "time/wait_s" in logs
    group = None
    if "time/rollout_s" in logs:
        group = (
            f"rollout {_number(logs['time/rollout_s'], '.2f')} s{' a group' if asynchronous else ''}: "
            f"generate {_number(logs.get('time/generate_s'), '.2f')}{_by_turn(logs)}, "
            f"env {_number(logs.get('time/environment_s'), '.2f')}, "
            f"loop {_number(logs.get('time/loop_s'), '.2f')}"
        )
    scoring = logs.get("time/scoring_s")
    other = f"other {_number(logs.get('time/other_s'), '.2f')} s"
    if asynchronous:
        step = (
            f"step: wait {_number(logs.get('time/wait_s'), '.2f')} s, "
            f"training {_number(logs.get('time/training_s'), '.2f')} s, "
            f"sync {_number(logs.get('time/weight_sync_s'), '.2f')} s, {other}"
        )
        worker = [] if group is None else [group]
        if scoring is not None:
            worker.append(f"scoring {_number(scoring, '.2f')} s")
        return f"  ({'; '.join([*worker, step])})"
    training = f"training {_number(logs.get('time/training_s'), '.2f')} s"
    if "time/inputs_s" in logs:
        if group is None:
            return f"  (inputs {_number(logs['time/inputs_s'], '.2f')} s, {training}, {other})"
        prepare = logs["time/inputs_s"] - logs["time/rollout_s"] - (scoring or 0.0)
        scored = "" if scoring is None else f"scoring {_number(scoring, '.2f')} s, "
        return f"  ({group}; {scored}prepare {_number(prepare, '.2f')} s, {training}, {other})"
    if group is None:
        return ""
    return f"  ({group}; rest {_number(step_s - logs['time/rollout_s'], '.2f')} s)"


def turn_parts(turn_s: dict[int | None, float], turns: int = 0) -> dict[str, float]:
    """Generation seconds by turn (0: the first) as step parts, `generate_turn1`, `generate_turn2`, ..., for the
    turns 1 to `turns` (the loop's most agent generations) or the last one timed, whichever is later: 0 where a
    turn generated nothing, so that a mean over steps or groups counts every one. Seconds of no known turn are
    left out."""
    last = max([turns, *(turn + 1 for turn in turn_s if turn is not None)])
    return {f"generate_turn{turn + 1}": turn_s.get(turn, 0.0) for turn in range(last)}


def by_turn(parts: dict[str, Any], key: str = "generate_turn{}") -> list[float]:
    """The generation's seconds by turn, in turn order, from `turn_parts`' keys (`key`: as logged, e.g.
    "time/generate_turn{}_s"), up to the first turn missing."""
    seconds: list[float] = []
    while (value := parts.get(key.format(len(seconds) + 1))) is not None:
        seconds.append(value)
    return seconds


def _by_turn(logs: dict[str, Any]) -> str:
    """ " (by turn A, B, ...)" from the `time/generate_turnK_s` metrics of `logs`, or "" when there are none."""
    seconds = [_number(value, ".2f") for value in by_turn(logs, "time/generate_turn{}_s")]
    return f" (by turn {', '.join(seconds)})" if seconds else ""


def time_metrics(times: dict[str, float]) -> dict[str, float]:
    """Seconds by part (`times`) under the keys the step lines read: `time/{part}_s`."""
    return {f"time/{part}_s": seconds for part, seconds in times.items()}


def time_scoring(trainer: Any) -> None:
    """Log the seconds a step spends in the trainer's reward functions (`time/scoring_s`), for the step line: each
    plain function in `trainer.reward_funcs` is wrapped (its name, which TRL logged it under, already taken); the
    last one of a step adds the step's total. A reward model (a module) is left as it is."""
    funcs = getattr(trainer, "reward_funcs", None)
    if not isinstance(funcs, list) or not hasattr(trainer, "_metrics"):
        return
    spent = [0.0]

    def timed(func: Any, last: bool) -> Any:
        def reward(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            try:
                return func(*args, **kwargs)
            finally:
                spent[0] += time.monotonic() - start
                if last:
                    mode = "train" if trainer.model.training else "eval"
                    trainer._metrics[mode]["time/scoring_s"].append(spent[0])
                    spent[0] = 0.0

        reward.__name__ = getattr(func, "__name__", "reward")
        return reward

    plain = [i for i, f in enumerate(funcs) if callable(f) and type(f).__name__ == "function"]
    if len(plain) == len(funcs):
        funcs[:] = [timed(f, i == len(funcs) - 1) for i, f in enumerate(funcs)]


class _BarOnly(ProgressCallback):
    """Transformers' progress bar without its dump of every logged dict (`StepLines` says it in one line)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def install(trainer: Any) -> None:
    """Give a trainer the step lines and curves.png, in place of transformers' printed log dicts."""
    had_bar = trainer.pop_callback(ProgressCallback) is not None
    trainer.pop_callback(PrinterCallback)
    if had_bar:
        trainer.add_callback(_BarOnly)
    trainer.add_callback(StepLines())
    trainer.add_callback(CurvesPNG())


class CurvesPNG(TrainerCallback):
    """Draws OUTPUT_DIR/curves.png from the log history when training ends (main process only)."""

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        series = step_series(state.log_history)
        if not series["step"]:
            return
        path = draw_curves([series], Path(args.output_dir) / "curves.png", title=Path(args.output_dir).name)
        if path is None:
            print("curves.png not drawn: matplotlib is not installed", file=sys.stderr)


def _float_or_nan(value) -> float:
    return math.nan if value is None else float(value)
