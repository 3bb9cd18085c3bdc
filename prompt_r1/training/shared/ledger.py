"""The call ledger: every environment call a training run pays for, kept so that a resumed run never pays twice.

A rollout's environment is wrapped in `LedgerEnvironment`. Each call is keyed by where it falls in the run: the
global step, training or evaluation, the rollout call within the step, the episode's index among the call's
episodes, the turn (the number of earlier prompt/response pairs) and a hash of the request (the environment's model
and every message it is sent). Before a call goes out the key is looked up: a recorded call is answered from the
ledger and costs nothing. A call that went out is written, and committed, before its reply is handed to the episode,
so a reply the agent has seen is a reply on disk.

    ledger = CallLedger.open(ledger_path(output_dir, rank), identity)      # refuses a foreign or broken file
    environment = LedgerEnvironment(client, ledger, prices)
    with call_scope(step=3, training=True, call=0, episode=5):             # what the rollout sets per episode
        reply = await environment.respond(prompt, history)

The file is SQLite in WAL mode with synchronous=FULL: one row per call, each commit on disk before the reply is
used (a SIGKILL or a lost machine keeps every row committed before it). Each process (rank) writes its own file,
`OUTPUT_DIR/call_ledger/rank-NNNNN.sqlite`, and reads only its own on resume: no SQLite writer is shared between
processes, and the files live beside the checkpoints they go with. The scope is a context variable, so any
rollout (the synchronous `GraphRollout`, or a worker that runs episodes its own way) keys its calls by entering
`call_scope` around each episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.clients.environment import EnvironmentReply, environment_messages
from prompt_r1.clients.sqlite_files import create_whole, damage, orphan_log, read_meta
from prompt_r1.core.aio import PerLoop
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.hashing import message_texts, stable_hash
from prompt_r1.core.prompts import ENVIRONMENT_SYSTEM_PROMPT

__all__ = [
    "LEDGER_FOLDER",
    "CallKey",
    "CallLedger",
    "LedgerEnvironment",
    "LedgerError",
    "StepSpend",
    "call_scope",
    "ledger_path",
    "request_hash",
]

LEDGER_FOLDER = "call_ledger"
FORMAT = "prompt-r1 call ledger"
VERSION = "1"


class LedgerError(ConfigError):
    """A ledger file this run cannot use: not a ledger, damaged, or another run's. The message is one line."""


def ledger_path(output_dir: str | Path, rank: int) -> Path:
    """Where process `rank` of a run keeps its ledger: beside the run's checkpoints."""
    return Path(output_dir) / LEDGER_FOLDER / f"rank-{rank:05d}.sqlite"


def request_hash(model: str, messages: Sequence[Any]) -> str:
    """A hash of what the environment is sent: its model, then each message's role and text, in order.

    >>> request_hash("m", []) == request_hash("m", []) != request_hash("n", [])
    True
    """
    return stable_hash([model, message_texts(messages)])


@dataclass(frozen=True)
class CallKey:
    """Where a call falls in the run; the same when the same step is replayed with the same seed."""

    step: int
    phase: str  # "train" or "eval"
    call: int  # the rollout call within the step and phase (TRL may generate more than once per step)
    episode: int  # the episode's index among the call's episodes
    turn: int  # earlier prompt/response pairs in the episode
    request: str  # request_hash of the messages

    def as_row(self) -> tuple:
        return (self.step, self.phase, self.call, self.episode, self.turn, self.request)


@dataclass(frozen=True)
class _Scope:
    step: int
    phase: str
    call: int
    episode: int


_scope: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("ledger_scope", default=None)


@contextlib.contextmanager
def call_scope(*, step: int, training: bool, call: int, episode: int) -> Iterator[None]:
    """Key the environment calls made inside the block (in this task and the tasks it starts) as those of one
    episode of one rollout call. Calls made outside any scope go out unrecorded."""
    token = _scope.set(_Scope(int(step), "train" if training else "eval", int(call), int(episode)))
    try:
        yield
    finally:
        _scope.reset(token)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    step INTEGER NOT NULL, phase TEXT NOT NULL, call INTEGER NOT NULL, episode INTEGER NOT NULL,
    turn INTEGER NOT NULL, request TEXT NOT NULL,
    reply TEXT NOT NULL,          -- the EnvironmentReply as JSON
    model TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    cost REAL,                    -- dollars from the price table; NULL when the model has no price
    recorded_at REAL NOT NULL,
    PRIMARY KEY (step, phase, call, episode, turn, request)
);
"""


class CallLedger:
    """One process's ledger file. `identity` names the run (seed, processes, rank, models): a file written under
    another identity is refused, since its keys would answer calls of a different run."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self.connection, self.path = connection, path
        # Episodes call from the event loop's thread, the trainer reads totals from its own: one at a time.
        self._lock = threading.Lock()
        # The (step, phase) pairs the file holds calls of: only this process writes it, so a call elsewhere (every
        # call of a new run, and of a resumed one past its crash) is not looked up at all. A lookup waits for the
        # connection, which a commit holds while the disk syncs; the event loop then waited with it.
        self._places = set(connection.execute("SELECT DISTINCT step, phase FROM calls"))

    @classmethod
    def open(cls, path: str | Path, identity: Mapping[str, Any]) -> CallLedger:
        """Open this process's ledger, creating it when there is none. A file that is there is read as a ledger or
        refused (`LedgerError`), whatever its size: a ledger is never empty on disk (it is made whole under
        another name, then renamed), so an empty or cut file is a damaged one, and taking it as new would pay
        its calls again and restart the run's spend total."""
        path = Path(path)
        identity = {k: str(v) for k, v in identity.items()}
        try:
            wal = orphan_log(path)
            if wal is not None:
                # The calls of a killed run live in its write-ahead log until they are checkpointed into the
                # file: a log without its file is a ledger whose file was lost, and a new file would take it in.
                raise LedgerError(
                    f"{path} is missing but its write-ahead log {wal.name} is there; {_WAYS_ON}"
                )
            if not path.exists():
                _create(path, identity)
            elif path.is_file() and path.stat().st_size == 0:
                raise LedgerError(
                    f"{path} is empty (0 bytes), so it was damaged: its calls would be paid again and the spend "
                    f"total restart; {_WAYS_ON}"
                )
            connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                connection.execute("PRAGMA busy_timeout = 5000")
                _check(connection, path, identity)
                connection.execute("PRAGMA journal_mode = WAL")
                # Each commit reaches the disk before the reply is used.
                connection.execute("PRAGMA synchronous = FULL")
            except BaseException:
                connection.close()  # and with it the -wal and -shm files it made beside a refused file
                raise
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{path} is not a readable call ledger ({exc}); {_WAYS_ON}") from None
        except OSError as exc:
            raise LedgerError(f"cannot use the call ledger {path}: {exc.strerror or exc}") from None
        return cls(connection, path)

    def lookup(self, key: CallKey) -> dict[str, Any] | None:
        if (key.step, key.phase) not in self._places:
            return None
        with self._lock:
            row = self.connection.execute(
                "SELECT reply, cost FROM calls WHERE step=? AND phase=? AND call=? AND episode=? AND turn=? "
                "AND request=?",
                key.as_row(),
            ).fetchone()
        if row is None:
            return None
        return {"reply": json.loads(row[0]), "cost": row[1]}

    def record(self, key: CallKey, reply: EnvironmentReply, cost: float | None) -> None:
        """Write one paid call and commit it (on disk when this returns)."""
        self.record_many([(key, reply, cost)])

    def record_many(self, calls: Sequence[tuple[CallKey, EnvironmentReply, float | None]]) -> None:
        """Write paid calls in one transaction: one commit, one wait for the disk, for all of them."""
        now = time.time()
        rows = [
            (
                *key.as_row(),
                json.dumps(reply.to_dict(), ensure_ascii=False),
                reply.model,
                reply.input_tokens,
                reply.output_tokens,
                cost,
                now,
            )
            for key, reply, cost in calls
        ]
        with self._lock, self.connection:
            self.connection.executemany(
                "INSERT OR REPLACE INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
            )
        self._places.update((key.step, key.phase) for key, _, _ in calls)

    def totals(self, *, from_step: int | None = None) -> dict[str, float]:
        """Every call this process has paid for in the run, over all its restarts; `from_step`: those of that
        step and later only (under the async trainer a call's step is its rollout group)."""
        where, args = ("WHERE step >= ?", (from_step,)) if from_step is not None else ("", ())
        with self._lock:
            calls, tokens_in, tokens_out, cost, steps = self.connection.execute(
                "SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
                f"COALESCE(SUM(cost), 0.0), COUNT(DISTINCT step) FROM calls {where}",
                args,
            ).fetchone()
        return {
            "calls": calls,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost": cost,
            "steps": steps,
        }

    def close(self) -> None:
        self.connection.close()


# What a user can do with a damaged ledger; never "start a new one in its place", which pays every call again.
_WAYS_ON = (
    "restore it from a copy, or resume with call_ledger false (the spend total then comes from the checkpoint's "
    "log, and calls after it are paid again), or start a new output_dir"
)


def _create(path: Path, identity: dict[str, str]) -> None:
    """A new, empty ledger, made whole before it appears at `path` (`clients.sqlite_files`, as the response
    cache's): a file there is always a ledger or a damaged one."""
    create_whole(path, _SCHEMA, {**identity, "format": FORMAT, "version": VERSION})


def _check(connection: sqlite3.Connection, path: Path, identity: dict[str, str]) -> None:
    """Refuse a damaged file, a database that is not a ledger, and another run's ledger, each in one line."""
    problem = damage(connection)
    if problem is not None:
        raise LedgerError(f"{path} is damaged ({problem}); {_WAYS_ON}")
    tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    meta = read_meta(connection)
    if meta.get("format") != FORMAT or "calls" not in tables:
        raise LedgerError(
            f"{path} is an SQLite file but not a call ledger: move it away or use another output_dir"
        )
    if meta.get("version") != VERSION:
        raise LedgerError(
            f"{path} is a call ledger of version {meta.get('version')}, this one reads {VERSION}"
        )
    differ = [
        f"{k} {meta.get(k)!r} (this run: {v!r})" for k, v in sorted(identity.items()) if meta.get(k) != v
    ]
    if differ:
        raise LedgerError(
            f"{path} belongs to another run: {'; '.join(differ)}. Resume with the same settings, or use another "
            "output_dir (or call_ledger false)"
        )


@dataclass
class StepSpend:
    """What this process's environment calls came to since the counters were last taken."""

    calls: int = 0  # answered, sent or replayed
    replayed: int = 0  # answered from the ledger, not sent
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0  # priced calls only
    unpriced: int = 0  # calls whose model has no price

    def as_list(self) -> list[float]:
        return [float(self.calls), float(self.replayed), float(self.tokens_in), float(self.tokens_out),
                self.cost, float(self.unpriced)]  # fmt: skip


@dataclass
class _Commits:
    """Paid calls waiting to be committed on one event loop, and the task committing them."""

    waiting: list[tuple[CallKey, EnvironmentReply, float | None, asyncio.Future]] = field(
        default_factory=list
    )
    writer: asyncio.Task | None = None


class LedgerEnvironment:
    """An environment whose calls are priced, counted, and (with a ledger) recorded and replayed.

    ledger: None to count and price only (call_ledger false): every call is then sent, also on resume.
    The wrapped environment keeps its rate limiting and retries; a call that fails after its retries is not
    recorded (no reply was paid for) and is sent again when its step is replayed.
    """

    def __init__(self, inner: Any, ledger: CallLedger | None, prices: PriceTable) -> None:
        self.inner, self.ledger, self.prices = inner, ledger, prices
        self.spend = StepSpend()
        self._commits: PerLoop[_Commits] = PerLoop(_Commits)  # calls waiting for their commit, per event loop
        # The async trainer's worker counts on its event loop's thread while the trainer takes on its own.
        self._counting = threading.Lock()
        self.dearest: float | None = None  # the highest price of one call so far (None: none priced yet)
        self.by_step: dict[int, int] = {}  # calls per scope step (the async worker's: per rollout group)
        self.model = str(
            getattr(inner, "model_name", None) or getattr(getattr(inner, "config", None), "model", "")
        )

    def take(self) -> StepSpend:
        """The counters since the last take, reset."""
        with self._counting:
            spend, self.spend = self.spend, StepSpend()
        return spend

    async def respond(
        self, prompt: str, history: Sequence[tuple[str, str]] = (), *, run_config: Any = None, **options: Any
    ) -> EnvironmentReply:
        key = self._key(prompt, history, options.get("system_prompt"))
        if key is not None and self.ledger is not None:
            found = self.ledger.lookup(key)
            if found is not None:
                reply = EnvironmentReply(**found["reply"])
                self._count(reply, found["cost"], replayed=True)
                return reply
        reply = await self.inner.respond(prompt, history, run_config=run_config, **options)
        cost = self.prices.cost(reply.model or self.model, reply.input_tokens, reply.output_tokens)
        if key is not None and self.ledger is not None:
            await self._commit(key, reply, cost)  # on disk before the episode sees the reply
        self._count(reply, cost, replayed=False)
        return reply

    async def _commit(self, key: CallKey, reply: EnvironmentReply, cost: float | None) -> None:
        """Record a call and return once it is committed. Group commit: a commit waits for the disk (synchronous
        FULL), so it runs in a worker thread, not on the event loop the other episodes run on, and the calls that
        arrive while one commit is under way go together in the next one (a step's replies landing together cost
        a few waits for the disk, not one each, in series, on the loop)."""
        queue = self._commits.get()
        done = asyncio.get_running_loop().create_future()
        queue.waiting.append((key, reply, cost, done))
        if queue.writer is None or queue.writer.done():
            queue.writer = asyncio.create_task(self._write(queue))
        await done

    async def _write(self, queue: _Commits) -> None:
        batch: list = []
        try:
            while queue.waiting:
                batch, queue.waiting = queue.waiting, []
                try:
                    await asyncio.to_thread(self.ledger.record_many, [(k, r, c) for k, r, c, _ in batch])
                except Exception as exc:  # each waiting call fails with it, as its own write would have
                    for *_, done in batch:
                        if not done.done():  # not an episode cancelled meanwhile
                            done.set_exception(exc)
                    continue
                for *_, done in batch:
                    if not done.done():
                        done.set_result(None)
        finally:  # cancelled (its loop closing): no call waits for a commit that will not come
            for *_, done in [*batch, *queue.waiting]:
                if not done.done():
                    done.cancel()

    def _key(
        self, prompt: str, history: Sequence[tuple[str, str]], system_prompt: str | None
    ) -> CallKey | None:
        scope = _scope.get()
        if scope is None:
            return None
        system = system_prompt or getattr(self.inner, "system_prompt", ENVIRONMENT_SYSTEM_PROMPT)
        messages = environment_messages(prompt, history, system)
        return CallKey(scope.step, scope.phase, scope.call, scope.episode, len(history),
                       request_hash(self.model, messages))  # fmt: skip

    def _count(self, reply: EnvironmentReply, cost: float | None, *, replayed: bool) -> None:
        with self._counting:
            spend = self.spend
            spend.calls += 1
            spend.replayed += int(replayed)
            spend.tokens_in += reply.input_tokens
            spend.tokens_out += reply.output_tokens
            if cost is None:
                spend.unpriced += 1
            else:
                spend.cost += cost
                self.dearest = max(cost, self.dearest or 0.0)
            scope = _scope.get()
            if scope is not None:
                self.by_step[scope.step] = self.by_step.get(scope.step, 0) + 1

    def pending(self) -> StepSpend:
        """A copy of the counters since the last take, left in place."""
        with self._counting:
            return StepSpend(**vars(self.spend))

    def __getattr__(self, name: str) -> Any:  # retries, members, config, name ...: the wrapped environment's
        return getattr(self.inner, name)
