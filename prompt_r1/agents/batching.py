"""Batching of concurrent episodes' agent requests into one generate call per step of the event loop.

Episodes run as independent coroutines; each awaits `generate` for its own turn. A backend that does not batch by
itself (a `transformers` model, the trainer's policy, TRL's vLLM in colocate or server mode) collects the requests
made while the event loop runs the other episodes' environment calls and answers them with one blocking call in a
worker thread, so the loop never blocks on the accelerator and the model sees full batches.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from prompt_r1.agents.base import AgentOutput, AgentRequest
from prompt_r1.aio import PerLoop
from prompt_r1.errors import AgentError, ContextOverflow
from prompt_r1.tokens import initial_prompt_ids

__all__ = ["BatchingBackend", "PendingRequest"]


@dataclass
class PendingRequest:
    """One request waiting for its batch: the ids to continue, its token budget and stop strings."""

    prompt_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...]
    future: asyncio.Future


@dataclass
class _Queue:
    pending: list[PendingRequest] = field(default_factory=list)
    drainer: asyncio.Task | None = None


class BatchingBackend:
    """Base of the token-level backends that batch: subclasses implement `_generate_locked(batch)`.

    Subclasses set `tokenizer`, `max_context` (or None) and `default_max_new_tokens` before use.
    """

    tokenizer: Any
    max_context: int | None = None
    default_max_new_tokens: int = 1024
    max_batch_size: int = 64

    def __init__(self) -> None:
        # Requests and their drainer belong to the event loop they came from: futures must be resolved on it.
        self._queues: PerLoop[_Queue] = PerLoop(_Queue)
        # One generate at a time, whichever loop's worker thread calls it.
        self._generate_lock = threading.Lock()
        self.batches: list[int] = []  # sizes of the generate calls made, for tests and logs

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
        queue = self._queues.get()
        future = asyncio.get_running_loop().create_future()
        queue.pending.append(PendingRequest(list(prompt_ids), max_new, tuple(request.stop), future))
        if queue.drainer is None or queue.drainer.done():
            queue.drainer = asyncio.create_task(self._drain(queue))
        return await future

    async def _drain(self, queue: _Queue) -> None:
        while queue.pending:
            # Let every episode that is ready to generate enqueue first: one pass of the loop per step.
            await asyncio.sleep(0)
            # Rows of one batch share their stop strings: a row must not stop on a string it did not ask for.
            stop = queue.pending[0].stop
            batch, rest = [], []
            for item in queue.pending:
                (batch if item.stop == stop and len(batch) < self.max_batch_size else rest).append(item)
            queue.pending = rest
            try:
                outputs = await asyncio.to_thread(self._generate_batch, batch)
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

    def _generate_batch(self, batch: list[PendingRequest]) -> list[AgentOutput]:
        with self._generate_lock:
            self.batches.append(len(batch))
            return self._generate_locked(batch)

    def _generate_locked(self, batch: list[PendingRequest]) -> list[AgentOutput]:
        raise NotImplementedError
