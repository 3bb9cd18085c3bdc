"""The worker pool under `batch` and `eval`: many independent items, each run and written as it finishes.

    tally = await run_many(samples, work, store, concurrency=32, key=lambda s: s.id, max_failures=10)

- **Independent items.** `concurrency` workers each take the next item, await `work(item)` (a row) and write it to
  the `ResultStore`; nothing waits for a slow or failing neighbour. The input is read lazily, one item at a
  time, shared by the workers.
- **What is skipped.** An item whose key the store holds finished is skipped; one whose finished row is for
  another question is kept, not rerun, and named (the store's conflict rule); a key repeated in the input is run
  once and named. Only the first ten of each are named on the log; the tally counts them all.
- **Stops.** `max_failures` failed rows (prompt_r1.runs.episode's `FAILED_STATUSES`) stop the run and cancel the items
  in flight; `stop()` (a surface's own rule, e.g. a budget) is asked before each item starts and stops starting
  new ones when it gives a reason; a `DataError` from the input stops it likewise, its message kept; SIGINT and
  SIGTERM stop at once, cancelling the items in flight (a second signal quits at once). A cancelled item leaves
  no row: the next run does it again. Every stop keeps the rows written, and the tally says why it stopped.
- **No half-written rows.** Only a worker inside `work` is cancelled; one writing its row, or running
  `after_write` (batch drops a finished episode's checkpoint thread there), finishes that first.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from prompt_r1.core import signals
from prompt_r1.core.checks import number
from prompt_r1.core.errors import DataError
from prompt_r1.runs.output_files import FAILED_STATUSES
from prompt_r1.runs.result_store import ResultStore

__all__ = ["RunTally", "check_limits", "named_keys", "run_many"]

MAX_NAMED = 10  # duplicate or conflicting keys named one by one on the log; the rest are counted


def check_limits(
    concurrency: int, max_failures: int | None = None, budget: float | None = None, *, flags: bool = False
) -> None:
    """A `ConfigError` for limits a run cannot keep: the surfaces check theirs before they touch a file. `flags`:
    name them as the command line does (`--max-failures`), not as the keywords do (`max_failures`)."""

    def name(keyword: str) -> str:
        return "--" + keyword.replace("_", "-") if flags else keyword

    number(concurrency, name("concurrency"), integer=True, minimum=1)
    number(max_failures, name("max_failures"), integer=True, minimum=1, none_ok=True)
    # nan would pass every `cost >= budget` test and run with no budget at all; inf is no budget either.
    number(budget, name("budget") + " (dollars)", above=0, none_ok=True)


def named_keys(keys: list, most: int = MAX_NAMED) -> str:
    """The first `most` keys, and how many more: how a run's end names what it kept or skipped."""
    shown = ", ".join(repr(k) for k in keys[:most])
    return shown + (f" and {len(keys) - most} more" if len(keys) > most else "")


@dataclass
class RunTally:
    """What one `run_many` call did; surfaces extend it with their own figures (batch: usage, retries)."""

    written: int = 0  # rows written by this run
    skipped: int = 0  # items finished by an earlier run
    duplicates: int = 0  # input items whose key repeats an earlier item's (not run)
    conflicts: int = 0  # keys finished earlier for a different question (kept, not rerun)
    conflict_keys: list = field(default_factory=list)  # those keys, all of them (the store's), for the report
    cancelled: int = 0  # items in flight when the run stopped (the next run does them)
    statuses: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    stopped: str | None = None  # None: the input was exhausted; else why the run stopped early
    input_error: str | None = None  # an input item that could not be read stopped the run

    @property
    def failed(self) -> int:
        return sum(self.statuses[s] for s in FAILED_STATUSES)


class _Pool:
    def __init__(self, items, work, store, tally, *, concurrency, key, question, describe, max_failures, stop,
                 after_write, on_row, log, progress, failure_row) -> None:  # fmt: skip
        self.items, self.work, self.store, self.tally = iter(items), work, store, tally
        self.failure_row = failure_row
        self.concurrency, self.key, self.question, self.describe = concurrency, key, question, describe
        self.max_failures, self.stop_rule, self.after_write, self.on_row = (
            max_failures,
            stop,
            after_write,
            on_row,
        )
        self.log, self.progress = log, progress
        self.seen: set[Hashable] = set()
        self.stopping = False
        # Workers inside `work`: the only ones a stop cancels (see the module docstring).
        self.in_work: set[asyncio.Task] = set()
        self.in_flight = 0

    def next_item(self) -> Any | None:
        """The next item to run, past finished and repeated keys. No await inside, so workers share one
        iterator."""
        while not self.stopping:
            try:
                item = next(self.items)
            except StopIteration:
                return None
            except DataError as exc:
                self.tally.input_error = str(exc)
                self.stop(f"input error: {exc}", cancel=False)
                return None
            key = self.key(item)
            if key in self.seen:
                self.tally.duplicates += 1
                if self.tally.duplicates <= MAX_NAMED:
                    where = getattr(item, "index", None)
                    print(
                        f"prompt-r1: duplicate {self.describe(item)}"
                        + (f" at input row {where}" if where is not None else "")
                        + ": not run again",
                        file=self.log,
                    )
                self._shrink_total()
                continue
            self.seen.add(key)
            plan = self.store.plan(key, self.question(item))
            if plan == "conflict":
                self.tally.conflicts += 1
                if self.tally.conflicts <= MAX_NAMED:
                    print(
                        f"prompt-r1: {self.describe(item)} was finished in {self.store.path} for another question: "
                        "kept, not rerun (use another --out to run the new question)",
                        file=self.log,
                    )
            elif plan == "done":
                self.tally.skipped += 1
            else:
                return item
        return None

    def _shrink_total(self) -> None:
        if self.progress is not None and self.progress.total:
            self.progress.total -= 1

    def stop(self, reason: str, *, cancel: bool) -> None:
        if self.tally.stopped is None:
            self.tally.stopped = reason
        self.stopping = True
        if cancel:
            current = asyncio.current_task()
            for task in list(self.in_work):
                if task is not current and not task.done():
                    task.cancel()

    async def worker(self) -> None:
        # Cancelled outside `work` (the run itself was cancelled between items): nothing in flight to count.
        with contextlib.suppress(asyncio.CancelledError):
            await self._work()

    async def _work(self) -> None:
        task = asyncio.current_task()
        while not self.stopping:
            reason = self.stop_rule() if self.stop_rule is not None else None
            if reason:
                self.stop(reason, cancel=False)
                return
            item = self.next_item()
            if item is None:
                return
            self.in_flight += 1
            self.in_work.add(task)
            try:
                row = await self.work(item)
            except asyncio.CancelledError:
                self.tally.cancelled += 1
                # An item cancelled by its own work (a budget that cannot pay its next call, on another process)
                # stops the run for the reason the stop rule gives, as the rule would before the next item.
                reason = self.stop_rule() if self.stop_rule is not None and not self.stopping else None
                if reason:
                    self.stop(reason, cancel=False)
                return
            except Exception as exc:
                # Whatever a surface's own code raises for one item (its scoring, its bookkeeping) is that item's
                # failed row, retried by the next run; without a failure row the run stops, as a bug must.
                if self.failure_row is None:
                    raise
                row = self.failure_row(item, exc)
            finally:
                self.in_work.discard(task)
                self.in_flight -= 1
            self.store.write(row)
            self.tally.written += 1
            self.tally.statuses[row["status"]] += 1
            if self.after_write is not None:
                await self.after_write(item, row)
            if self.progress is not None:
                self.progress.update(1)
            if self.on_row is not None:
                self.on_row(row, self.in_flight)
            if self.max_failures is not None and self.tally.failed >= self.max_failures:
                self.stop(
                    f"{self.tally.failed} failed episodes reached --max-failures {self.max_failures}",
                    cancel=True,
                )

    async def run(self) -> None:
        workers = [asyncio.create_task(self.worker()) for _ in range(self.concurrency)]
        try:
            await asyncio.gather(*workers)
        finally:  # an unexpected error in one worker (or our own cancellation) stops them all
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)


@contextlib.contextmanager
def _stop_on_signals(pool: _Pool, log: TextIO):
    """SIGINT/SIGTERM stop the run and cancel the items in flight; a second one quits at once. Each signal's
    handler from before the run is put back after it, and after the first signal (asyncio alone would leave
    SIGTERM at its default, which ends the process without a word)."""
    loop = asyncio.get_running_loop()
    signums = (signal.SIGINT, signal.SIGTERM)
    installed = []
    previous = {signum: signal.getsignal(signum) for signum in signums}

    def put_back() -> None:
        for signum in installed:
            loop.remove_signal_handler(signum)
            if previous[signum] is not None:
                signal.signal(signum, previous[signum])
        installed.clear()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        signals.note(name)
        again = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        print(
            f"\nprompt-r1: {name}: stopping; {pool.in_flight} episode(s) in flight are cancelled and rerun "
            f"next time ({again} again to quit at once)",
            file=log,
        )
        pool.stop(f"interrupted ({name})", cancel=True)
        put_back()  # the next signal takes the road it took before the run: KeyboardInterrupt, at once

    for signum in signums:
        try:
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass
    try:
        yield
    finally:
        put_back()


async def run_many(
    items: Iterable[Any],
    work: Callable[[Any], Awaitable[dict[str, Any]]],
    store: ResultStore,
    *,
    concurrency: int = 16,
    key: Callable[[Any], Hashable] = lambda item: item.id,
    question: Callable[[Any], str] = lambda item: item.question,
    describe: Callable[[Any], str] = lambda item: f"id {item.id!r}",
    max_failures: int | None = None,
    stop: Callable[[], str | None] | None = None,
    after_write: Callable[[Any, dict[str, Any]], Awaitable[None]] | None = None,
    on_row: Callable[[dict[str, Any], int], None] | None = None,
    tally: RunTally | None = None,
    progress: Any = None,
    log: TextIO | None = None,
    signals: bool = True,
    failure_row: Callable[[Any, Exception], dict[str, Any]] | None = None,
) -> RunTally:
    """Run `work` on every item of `items` not finished in `store`, writing each row as it comes (see the module
    docstring). `key(item)` must equal `store.key(row)` for the row `work` returns. `progress`: a tqdm bar,
    advanced per row; `on_row(row, in_flight)` for a surface's own running figures; `failure_row(item, exc)` the row
    written for an item whose `work` raised (a failed status: the next run retries it), else the exception stops
    the run. Returns the tally (`tally`, when given, is filled in place), also when stopped early."""
    check_limits(concurrency, max_failures)
    tally = tally if tally is not None else RunTally()
    log = log if log is not None else sys.stderr
    pool = _Pool(items, work, store, tally, concurrency=concurrency, key=key, question=question,
                 describe=describe, max_failures=max_failures, stop=stop, after_write=after_write,
                 on_row=on_row, log=log, progress=progress, failure_row=failure_row)  # fmt: skip
    started = time.monotonic()
    try:
        with store.appending(), _stop_on_signals(pool, log) if signals else contextlib.nullcontext():
            await pool.run()
    finally:
        tally.seconds = time.monotonic() - started
        tally.conflict_keys = list(store.conflicts)
    return tally
