"""Batching of concurrent episodes' agent requests into one generate call per step of the event loop.

Episodes run as independent coroutines; each awaits `generate` for its own turn. A backend that does not batch by
itself (a `transformers` model, the trainer's policy, TRL's vLLM in colocate or server mode) collects the requests
made while the event loop runs the other episodes' environment calls and answers them with one blocking call in a
worker thread, so the loop never blocks on the accelerator and the model sees full batches.

On an accelerator a decoding pass costs about the same for 1 row as for 64, so a turn whose requests arrive a few
milliseconds apart (environment replies land on different passes of the event loop) must not become several
generate calls. Callers that know how many episodes are running register them (`with backend.episode(): ...`),
and the loop marks each registered episode's environment call (`with backend.away(): ...`), so the drainer knows
where every live episode is: asking, at the environment, or between the two (the loop's own work: parsing,
tokenising, the graph's steps), which asks within milliseconds. It waits, with no timer, for the episodes between
the two, and dispatches the moment every live episode that is not at the environment has asked. Episodes at the
environment are the one count it cannot know (a reply may be a millisecond or a minute away): the batch waits for
them at most `batch_wait` times the duration of a recent generate call (what one more call would cost), and not at
all before a generate call has been timed. Finished episodes hold nothing. Requests of unregistered callers never
wait.

Reproducible batches (`lockstep = True`, what training rollouts use): the drainer waits, with no deadline, until
every registered episode is waiting or has ended, and orders the batch by the episodes' indices
(`backend.episode(index)`), so each batch holds the same rows in the same order whatever order the environment's
replies arrived in; with the sampler seeded per step, the same seed then gives the same trajectories. The cost:
each turn waits for the slowest environment reply of the step. Each request also carries its episode's index and
turn (`PendingRequest.key`), so that a backend that seeds per request (vLLM) can draw the same numbers for it in
any batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prompt_r1.agents.base import AgentOutput, AgentRequest
from prompt_r1.core.aio import PerLoop
from prompt_r1.core.errors import AgentError, ContextOverflow
from prompt_r1.core.tokens import initial_prompt_ids

__all__ = ["BatchingBackend", "PendingRequest", "derive_seed"]


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (a run's seed, a step, a rank, an episode, a turn): distinct parts give
    unrelated seeds, the same parts the same seed, on every machine and Python (no `hash` randomisation)."""
    digest = hashlib.blake2b(repr(tuple(int(p) for p in parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass
class PendingRequest:
    """One request waiting for its batch: the ids to continue, its token budget and stop strings."""

    prompt_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...]
    future: asyncio.Future
    # (episode index, turn within the episode) when the episode was registered with an index, else None.
    key: tuple[int, int] | None = None
    registered: bool = False  # made by a registered episode (counted against the live ones)
    turn: int | None = None  # the request's `AgentRequest.turn`


@dataclass
class _Slot:
    """A registered episode's place: its index among the call's episodes (None: unordered), and how many requests
    it has made."""

    index: int | None
    turns: int = 0


# The registered episode the current coroutine belongs to (episodes run as separate tasks, each with its own copy).
_current_slot: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("episode_slot", default=None)


@dataclass
class _Queue:
    pending: list[PendingRequest] = field(default_factory=list)
    drainer: asyncio.Task | None = None
    live: int = 0  # registered episodes still running (see BatchingBackend.episode)
    away: int = 0  # of them, those waiting on the environment (BatchingBackend.away)
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # a request arrived or an episode ended


class BatchingBackend:
    """Base of the token-level backends that batch: subclasses implement `_generate_locked(batch)`.

    Subclasses set `tokenizer`, `max_context` (or None) and `default_max_new_tokens` before use.
    """

    tokenizer: Any
    max_context: int | None = None
    default_max_new_tokens: int = 1024
    max_batch_size: int = 64
    # Longest wait for registered episodes at the environment to join a batch, as a fraction of a recent generate
    # call's duration (episodes between their environment reply and their request are waited for without a timer).
    batch_wait: float = 0.5
    # Wait for every registered episode and order batches by episode index (see the module doc).
    lockstep: bool = False
    # Set per rollout step: a backend that can seed each request derives its seed from this and the request's key.
    sampling_seed: int | None = None

    def __init__(self) -> None:
        # Requests and their drainer belong to the event loop they came from: futures must be resolved on it.
        self._queues: PerLoop[_Queue] = PerLoop(_Queue)
        # One generate at a time, whichever loop asks, and always on the same thread: every call runs on this one
        # worker, not a rotating pool: the C allocator keeps an arena per thread that has allocated, and a
        # generate call's tensors freed into the arenas of a rotating pool stay in the process (the built-in
        # agent's held-out evaluation, 50 questions: 7.36 GB peak through asyncio's pool, 4.55 GB on one thread).
        # Backends that share weights, or that a caller makes per step, share one worker (`_generate_thread` is
        # replaceable), and so take turns as well.
        self._generate_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
        # Sizes of the batches answered (a backend may split one into calls), for tests and logs.
        self.batches: list[int] = []
        self.generate_seconds = 0.0  # moving average of one generate call's duration
        self.generate_total_s = 0.0  # every generate call's duration, summed (a step's breakdown)
        # The same by turn (a call shared among its requests' turns, in proportion; None: the turn was not given).
        self.generate_turn_s: dict[int | None, float] = {}

    @contextlib.contextmanager
    def episode(self, index: int | None = None) -> Iterator[None]:
        """Register one running episode on this event loop, so that batches wait for it (see the module doc).
        `index`: the episode's place among those of the call, which orders lockstep batches and keys its requests.
        """
        queue = self._queues.get()
        queue.live += 1
        token = _current_slot.set(_Slot(index))
        try:
            yield
        finally:
            _current_slot.reset(token)
            queue.live -= 1
            queue.changed.set()

    @contextlib.contextmanager
    def away(self) -> Iterator[None]:
        """Mark the current registered episode as waiting on the environment, so that batches do not count on its
        request now (see the module doc); nothing for an unregistered caller."""
        if _current_slot.get() is None:
            yield
            return
        queue = self._queues.get()
        queue.away += 1
        queue.changed.set()
        try:
            yield
        finally:
            queue.away -= 1
            queue.changed.set()

    async def generate(self, request: AgentRequest) -> AgentOutput:
        prompt_ids = (
            request.prompt_ids
            if request.prompt_ids is not None
            else initial_prompt_ids(self.tokenizer, request.messages)
        )
        max_new = request.max_new_tokens or self.default_max_new_tokens
        if self.max_context is not None and len(prompt_ids) >= self.max_context:
            raise ContextOverflow(
                f"agent prompt of {len(prompt_ids)} tokens does not fit the context of {self.max_context}"
            )
        if self.max_context is not None:
            max_new = min(max_new, self.max_context - len(prompt_ids))
        slot = _current_slot.get()
        key = None
        if slot is not None:
            if slot.index is not None:
                key = (slot.index, slot.turns)
            slot.turns += 1
        queue = self._queues.get()
        future = asyncio.get_running_loop().create_future()
        item = PendingRequest(
            list(prompt_ids), max_new, tuple(request.stop), future, key, slot is not None, request.turn
        )
        queue.pending.append(item)
        queue.changed.set()
        if queue.drainer is None or queue.drainer.done():
            queue.drainer = asyncio.create_task(self._drain(queue))
        return await future

    async def _drain(self, queue: _Queue) -> None:
        while queue.pending:
            # Let every episode that is ready to generate enqueue first: one pass of the loop per step.
            await asyncio.sleep(0)
            if self.lockstep:
                await self._wait_for_every_live_episode(queue)
                # Registered episodes by index; any unregistered request after them, in arrival order.
                queue.pending.sort(key=lambda item: (item.key is None, item.key or (0, 0)))
            else:
                await self._wait_for_live_episodes(queue)
            # Rows of one batch share their stop strings: a row must not stop on a string it did not ask for.
            stop = queue.pending[0].stop
            batch, rest = [], []
            for item in queue.pending:
                (batch if item.stop == stop and len(batch) < self.max_batch_size else rest).append(item)
            queue.pending = rest
            try:
                outputs = await asyncio.get_running_loop().run_in_executor(
                    self._generate_thread, self._generate_batch, batch
                )
            except Exception as exc:  # a failed batch fails its requests, not the drainer
                error = (
                    exc
                    if isinstance(exc, AgentError | ContextOverflow)
                    else AgentError(f"agent generation failed: {exc!r}")
                )
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(error)
                continue
            for item, output in zip(batch, outputs, strict=True):
                if not item.future.done():
                    item.future.set_result(output)

    async def _wait_for_live_episodes(self, queue: _Queue) -> None:
        """Hold the batch while live episodes that have not asked yet are on their way (no timer), or at the
        environment (at most `batch_wait` x a recent generate call); see the module doc."""
        deadline: float | None = None
        while len(queue.pending) < self.max_batch_size:
            asked = sum(item.registered for item in queue.pending)
            if queue.live - queue.away > asked:
                # An episode between its reply and its request: it asks, goes to the environment or ends soon.
                queue.changed.clear()
                await queue.changed.wait()
                continue
            if queue.live <= asked or self.batch_wait <= 0 or not self.batches:
                return  # every live episode has asked, or those at the environment cannot be timed
            if deadline is None:  # one bound per batch, however the replies trickle in
                deadline = time.monotonic() + self.batch_wait * self.generate_seconds
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            queue.changed.clear()
            try:
                await asyncio.wait_for(queue.changed.wait(), remaining)
            except TimeoutError:
                return

    async def _wait_for_every_live_episode(self, queue: _Queue) -> None:
        """Hold the batch until every registered episode is waiting or has ended (lockstep batches)."""
        while len(queue.pending) < queue.live:
            queue.changed.clear()
            await queue.changed.wait()

    def _generate_batch(self, batch: list[PendingRequest]) -> list[AgentOutput]:
        # Runs on `_generate_thread` only, so calls never overlap and the figures below need no lock.
        self.batches.append(len(batch))
        start = time.monotonic()
        try:
            return self._generate_locked(batch)
        finally:
            seconds = time.monotonic() - start
            self.generate_total_s += seconds
            for item in batch:
                turn_s = self.generate_turn_s.get(item.turn, 0.0)
                self.generate_turn_s[item.turn] = turn_s + seconds / len(batch)
            first = len(self.batches) == 1
            self.generate_seconds = seconds if first else 0.7 * self.generate_seconds + 0.3 * seconds

    def _generate_locked(self, batch: list[PendingRequest]) -> list[AgentOutput]:
        raise NotImplementedError
