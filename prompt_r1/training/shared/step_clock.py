"""Where a training step's wall time went, for the step lines (`prompt_r1.training.shared.progress.StepLines`).

`StepClock` is a trainer callback that times each optimizer step, from the end of the last one to its own end, and
splits it into parts that add up to it, logged at the step's end (before TRL's log of the step) as `time/{part}_s`
with `time/step_s`:
- `training`: from the step's start (`on_step_begin`) to its optimizer step, less what the trainer reported as
  spent inside that span (`spent(..., in_training=True)`): the forward and backward passes and the optimizer;
- each part the trainer reports with `spent(part, seconds)`;
- `wait`, where the clock is given TRL's metric of the wait for samples (the async trainer's queue);
- `other`: the rest of the step's wall time (the step's callbacks, logging, the next batch of prompts). It is the
  only part not measured on its own, so a large one says that something is not accounted for.

The two trainers use it each their own way:
- the asynchronous one (`prompt_r1.training.asynchronous.trainer`): the queue wait, training, and the weight sync
  to the rollout server, which comes after the optimizer step (`synced`);
- the synchronous one (`install`): TRL's `_prepare_inputs`, which runs inside the span, is `inputs`: the rollout,
  the reward functions, and TRL's own preparation of the samples (tensors, advantages, the old log-probabilities'
  forward pass where TRL needs one, the weight sync to a vLLM engine). The rollout and the reward functions log
  their own seconds, so the step line shows that preparation as what the inputs took beyond them.

Cheap enough to stay on: four clock readings per step, two more per reported part.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from transformers import TrainerCallback

from prompt_r1.training.shared.progress import time_metrics

__all__ = ["StepClock", "install"]


class StepClock(TrainerCallback):
    """A step's wall time in parts (see the module docstring), appended to `metrics` (the trainer's sink of
    training metrics, which TRL averages over the steps of a log) at each step's end.

    parts: the parts logged every step, in order (0 for one with nothing reported in a step); `training` and
        `wait` are measured by the clock, any other is reported by the trainer.
    wait_key: the metric under which TRL appends each wait for samples (read for `wait`).
    now: the clock read (a test's own)."""

    def __init__(
        self,
        metrics: dict[str, list],
        now: Callable[[], float] = time.monotonic,
        parts: Sequence[str] = ("wait", "training", "weight_sync"),
        wait_key: str = "perf/rollout_wait_s",
    ) -> None:
        self.metrics, self._now, self.parts, self.wait_key = metrics, now, tuple(parts), wait_key
        self._window: float | None = None  # when the step began: the end of the last one
        self._begin: float | None = None  # when its training began
        self._spent: dict[str, float] = {}  # seconds reported by part, this step
        self._inside = 0.0  # reported as spent within this step's training span
        self._training = 0.0
        self._waits: list | None = None  # TRL's list of waits, and how much of it was taken
        self._waits_taken = 0

    def spent(self, part: str, seconds: float, *, in_training: bool = False) -> None:
        """The trainer spent `seconds` on `part` in this step; `in_training`: within the span from the step's start
        to its optimizer step, so not training."""
        self._spent[part] = self._spent.get(part, 0.0) + seconds
        if in_training:
            self._inside += seconds

    def synced(self, seconds: float) -> None:
        """The trainer spent `seconds` syncing the weights to the rollout server."""
        self.spent("weight_sync", seconds)

    def on_train_begin(self, args, state, control, **kwargs):
        self._window = self._now()
        self._reset()

    def on_step_begin(self, args, state, control, **kwargs):
        self._begin = self._now()  # the step's samples are taken (async) or its inputs come next (sync)
        self._inside = 0.0

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self._begin is not None:
            self._training += self._now() - self._begin - self._inside

    def on_step_end(self, args, state, control, **kwargs):
        now = self._now()
        if self._window is None:
            self._window = now
            self._reset()
            return
        step = now - self._window
        parts = {}
        for part in self.parts:
            if part == "wait":
                parts[part] = self._wait()
            elif part == "training":
                parts[part] = self._training
            else:
                parts[part] = self._spent.get(part, 0.0)
        parts["other"] = step - sum(parts.values())
        for key, seconds in time_metrics({**parts, "step": step}).items():
            self.metrics[key].append(seconds)
        self._window = now
        self._reset()

    def _reset(self) -> None:
        self._begin, self._training, self._inside = None, 0.0, 0.0
        self._spent = {}

    def _wait(self) -> float:
        """The waits TRL logged since the last step's end (on the main process, which takes the samples; none
        elsewhere). Its list is a new one after each log, which empties the sink."""
        waits = self.metrics.get(self.wait_key)
        if waits is None:
            return 0.0
        if waits is not self._waits:
            self._waits, self._waits_taken = waits, 0
        new = waits[self._waits_taken :]
        self._waits_taken = len(waits)
        return float(sum(new))


def install(trainer: Any, now: Callable[[], float] = time.monotonic) -> StepClock:
    """Time the synchronous trainer's steps (`inputs`, `training`, `other`): TRL's `_prepare_inputs` is wrapped to
    report its seconds while training (an evaluation's are not a step's), and the clock goes after the trainer's
    own callbacks, so that what they do at a step's end (the spend cap stopping the run) is in the step's time, as
    it is in the step line's. What comes after the step's end (a callback added later, an evaluation, a checkpoint
    save) is in the next step's `other`."""
    clock = StepClock(trainer._metrics["train"], now, parts=("inputs", "training"))
    prepare = trainer._prepare_inputs

    def _prepare_inputs(*args: Any, **kwargs: Any) -> Any:
        if not trainer.model.training:
            return prepare(*args, **kwargs)
        started = now()
        try:
            return prepare(*args, **kwargs)
        finally:
            clock.spent("inputs", now() - started, in_training=True)

    trainer._prepare_inputs = _prepare_inputs
    trainer.add_callback(clock)
    trainer.step_clock = clock
    return clock
