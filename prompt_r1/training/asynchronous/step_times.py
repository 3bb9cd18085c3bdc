"""Where an asynchronous step's seconds went, for the step lines (`prompt_r1.training.shared.progress.StepLines`).

The async step has two sides, one on each end of the rollout queue, and a clock for each:
- `GroupClock`, the rollout worker's, one per group: from the group's start to its last episode's end, the
  seconds in which some of its episodes waited for the policy (`generate`), else some waited for the environment
  (`environment`), else none waited on anything but the event loop (`loop`: the graph, parsing, tokenising, and
  the other groups' turns on the same thread). The three add up to the group's wall time (`rollout`); `generate`
  is split by turn as well (each moment shared among the turns of the episodes waiting for the policy). The worker
  puts them, with the seconds it spent scoring the group (`scoring`), into each of the group's samples' metrics,
  which TRL averages over the samples a step trains on: the step line shows them as seconds a group.
  `TimedAgent` and `TimedEnvironment` tell the clock of the group that calls them (a context variable: each group
  runs in a task of its own, and its episodes in tasks made from it).
- the trainer's, `prompt_r1.training.shared.step_clock.StepClock`: the step's wall time split into the wait for
  samples (TRL's queue wait, `perf/rollout_wait_s`: what overlapping rollouts with training hides or not),
  `training` (the step's forward and backward passes to its optimizer step), the weight sync to the server, and
  `other`, the rest (taking the samples and packing them into micro-batches, the step's callbacks). Logged as
  `time/wait_s`, `time/training_s`, `time/weight_sync_s`, `time/other_s`, adding up to `time/step_s`.

Cheap enough to stay on: two clock readings per agent or environment call.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prompt_r1.training.shared.progress import turn_parts

__all__ = ["GroupClock", "TimedAgent", "TimedEnvironment"]

_CURRENT: contextvars.ContextVar[GroupClock | None] = contextvars.ContextVar(
    "prompt_r1_group_clock", default=None
)


class GroupClock:
    """Where one group's seconds went (see the module docstring). Read and written on the event loop's thread
    only, so it needs no lock. `turns`: the loop's most agent generations (`progress.turn_parts`); `now`: the
    clock read (a test's own)."""

    def __init__(self, now: Callable[[], float] = time.monotonic, *, turns: int = 0) -> None:
        self._now, self._turns = now, turns
        self._start = self._since = now()
        # Episodes waiting now, by what they wait for, in the order that decides which part a moment belongs to:
        # while any episode waits for the policy, the group does.
        self._waiting = {"generate": 0, "environment": 0}
        self._seconds = {"generate": 0.0, "environment": 0.0, "loop": 0.0}
        self._generating: Counter[int | None] = Counter()  # episodes waiting for the policy, by turn
        self._turn_seconds: dict[int | None, float] = {}

    def _mark(self) -> None:
        now = self._now()
        part = next((part for part, count in self._waiting.items() if count), "loop")
        self._seconds[part] += now - self._since
        if part == "generate":
            for turn, count in self._generating.items():
                if count:
                    share = (now - self._since) * count / self._waiting["generate"]
                    self._turn_seconds[turn] = self._turn_seconds.get(turn, 0.0) + share
        self._since = now

    @contextlib.contextmanager
    def waiting(self, part: str, turn: int | None = None) -> Iterator[None]:
        """One episode waits for `part` ("generate" or "environment"; a generation: for its `turn`) while the
        block runs."""
        self._mark()
        self._waiting[part] += 1
        if part == "generate":
            self._generating[turn] += 1
        try:
            yield
        finally:
            self._mark()
            self._waiting[part] -= 1
            if part == "generate":
                self._generating[turn] -= 1

    @contextlib.contextmanager
    def running(self) -> Iterator[GroupClock]:
        """The block runs the group's episodes: the agent's and the environment's calls made in it (in tasks it
        starts too) are counted on this clock."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def split(self) -> dict[str, float]:
        """Seconds so far: `rollout` (the wall time) and its parts `generate`, `environment` and `loop`, and
        `generate` by turn (`generate_turn1`, ...)."""
        self._mark()
        return {
            "rollout": self._since - self._start,
            **self._seconds,
            **turn_parts(self._turn_seconds, self._turns),
        }


def _waiting(part: str, turn: int | None = None) -> contextlib.AbstractContextManager:
    clock = _CURRENT.get()
    return clock.waiting(part, turn) if clock is not None else contextlib.nullcontext()


class TimedAgent:
    """The agent as the worker's episodes call it: each `generate` counted on the calling group's clock; every
    other attribute the agent's own."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def __getattr__(self, name: str) -> Any:
        return getattr(self.agent, name)

    async def generate(self, request: Any) -> Any:
        with _waiting("generate", getattr(request, "turn", None)):
            return await self.agent.generate(request)


class TimedEnvironment:
    """The environment as the worker's episodes call it: each `respond` (its throttle and retries included)
    counted on the calling group's clock; every other attribute the environment's own."""

    def __init__(self, environment: Any) -> None:
        self.environment = environment

    def __getattr__(self, name: str) -> Any:
        return getattr(self.environment, name)

    async def respond(self, *args: Any, **kwargs: Any) -> Any:
        with _waiting("environment"):
            return await self.environment.respond(*args, **kwargs)
