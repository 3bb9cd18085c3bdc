"""The episode call ledger of a distributed batch: every environment call a running episode has paid for, kept
until the episode's row is written, so that an episode run again (its actor's node died, its driver was killed)
is answered from the ledger for the calls it already made instead of sending them again.

    ledger = EpisodeLedger.open(ledger_path_for(out))          # NAME.calls.sqlite beside the results file
    ledger.record("q7", 0, request_key(model, prompt, history), reply_dict)
    ledger.lookup("q7", 0, request_key(model, prompt, history))  # the reply, or None: send it
    ledger.forget("q7")                                          # its row is written: nothing to replay

A call is keyed by the episode's id, its turn (the earlier prompt/response pairs) and a hash of what is sent
(model, prompt, history): an episode run again asks the same first call, gets the recorded reply, so asks the
same second call, and so on, until it reaches a call that was never paid for. Training keeps its own ledger per
rank for the same reason (prompt_r1.training.shared.ledger); this one is written by one process, the run's
ledger keeper beside the driver (prompt_r1.runs.ray_batch), and read by every actor through it. SQLite in WAL mode
with synchronous=FULL: a reply is on disk before the episode sees it, so a killed driver's rerun replays it too.

Any rerun on the results file replays what its ledger holds, with Ray or without: a Ray run killed and rerun as a
local batch (prompt_r1.runs.batch) or a local eval (prompt_r1.evaluation.harness, whose ledger sits beside its
predictions.jsonl) answers the killed run's paid calls from the ledger too. All wrap their environment in
`LedgeredEnvironment` and run each episode inside `ledger_episode(key)`:

    environment = LedgeredEnvironment(client, lookup=..., record=...)   # async callables: a keeper's, or a file's
    with ledger_episode("q7") as calls:
        row = await work(sample)                                        # calls.replayed: answered from the ledger
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import sqlite3
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prompt_r1.clients.environment import EnvironmentReply
from prompt_r1.clients.sqlite_files import create_whole, damage, read_meta
from prompt_r1.core.errors import OutputError
from prompt_r1.core.hashing import stable_hash

__all__ = [
    "EpisodeCalls",
    "EpisodeLedger",
    "LedgeredEnvironment",
    "earlier_ledger",
    "ledger_episode",
    "ledger_path_for",
    "request_key",
]

_FORMAT = "prompt-r1 episode call ledger 1"
_SCHEMA = (
    "CREATE TABLE calls (episode TEXT, turn INTEGER, request TEXT, reply TEXT, "
    "PRIMARY KEY (episode, turn, request));"
)


def _format(connection: sqlite3.Connection) -> str | None:
    """The format the file names: in the shared meta table (name, value), or in the (key, value) one that
    ledgers written before it have, so a run stopped then still replays its calls."""
    try:
        return read_meta(connection).get("format")
    except sqlite3.OperationalError:  # meta without a name column: the earlier layout
        row = connection.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        return None if row is None else row[0]


def ledger_path_for(out: str | Path) -> Path:
    """Where a results file's call ledger lives: beside it, NAME.calls.sqlite."""
    out = Path(out)
    return out.with_name(out.stem + ".calls.sqlite")


def earlier_ledger(out: str | Path) -> EpisodeLedger | None:
    """The results file's ledger, opened, when an earlier run left one; None when there is none (nothing is made:
    a run without Ray keeps what it paid in its checkpoints, not here)."""
    path = ledger_path_for(out)
    return EpisodeLedger.open(path) if path.exists() else None


def request_key(model: str, prompt: str, history: Sequence[Sequence[str]] = ()) -> str:
    """A hash of one environment request: its model, the earlier prompt/response pairs and the new prompt.

    >>> request_key("m", "p") == request_key("m", "p") != request_key("m", "p", [("a", "b")])
    True
    """
    return stable_hash([model, [list(pair) for pair in history], prompt])


class EpisodeLedger:
    """One results file's call ledger (see the module). Not shared between processes: one keeper writes it."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self.connection, self.path = connection, path

    @classmethod
    def open(cls, path: str | Path) -> EpisodeLedger:
        """Open or create the ledger; an `OutputError` for a file that is not one or is damaged (nothing in it is
        changed). A new ledger is made whole under another name and renamed into place (as the response cache and
        training's ledger are), so a driver killed while creating it leaves no file rather than one refused later."""
        path = Path(path)
        try:
            if not path.exists():
                create_whole(path, _SCHEMA, {"format": _FORMAT})
            connection = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            try:
                problem = damage(connection)
                if problem is not None:
                    raise OutputError(
                        f"the call ledger {path} is damaged ({problem}); restore it from a copy, or move it and its "
                        "-wal file away to pay those calls again"
                    )
                if _format(connection) != _FORMAT:
                    raise OutputError(
                        f"{path} is not a prompt-r1 call ledger; move it away (it sits beside --out)"
                    )
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=FULL")
            except BaseException:
                connection.close()
                raise
        except sqlite3.DatabaseError as exc:
            raise OutputError(
                f"{path} is not a prompt-r1 call ledger ({exc}); move it away (it sits beside --out)"
            ) from None
        except OSError as exc:
            raise OutputError(f"cannot make the call ledger {path}: {exc.strerror or exc}") from None
        return cls(connection, path)

    def lookup(self, episode: str, turn: int, request: str) -> dict[str, Any] | None:
        row = self.connection.execute(
            "SELECT reply FROM calls WHERE episode = ? AND turn = ? AND request = ?", (episode, turn, request)
        ).fetchone()
        return None if row is None else json.loads(row[0])

    def record(self, episode: str, turn: int, request: str, reply: dict[str, Any]) -> None:
        """Keep one paid call, committed before it returns (the caller hands the reply on only after)."""
        self.connection.execute(
            "INSERT OR REPLACE INTO calls VALUES (?, ?, ?, ?)",
            (episode, turn, request, json.dumps(reply, ensure_ascii=False)),
        )

    def forget(self, episode: str) -> None:
        """Drop an episode's calls once its row is written (a rerun skips it, so nothing will ask)."""
        self.connection.execute("DELETE FROM calls WHERE episode = ?", (episode,))

    async def answer(self, episode: str, turn: int, request: str) -> dict[str, Any] | None:
        """`lookup`, awaited as `LedgeredEnvironment` asks (a file of this process answers at once)."""
        return self.lookup(episode, turn, request)

    def calls(self) -> int:
        return self.connection.execute("SELECT COUNT(*) FROM calls").fetchone()[0]

    def close(self) -> None:
        self.connection.close()


@dataclass
class EpisodeCalls:
    """The episode whose calls are being made: its ledger key, and how many were answered from the ledger."""

    key: str
    replayed: int = 0


_EPISODE: contextvars.ContextVar[EpisodeCalls] = contextvars.ContextVar("prompt_r1_ledger_episode")


@contextlib.contextmanager
def ledger_episode(key: str) -> Iterator[EpisodeCalls]:
    """The environment calls made inside (the episode's tasks included) are episode `key`'s in the ledger."""
    calls = EpisodeCalls(key)
    token = _EPISODE.set(calls)
    try:
        yield calls
    finally:
        _EPISODE.reset(token)


class LedgeredEnvironment:
    """An environment whose calls are answered from the ledger when their episode paid for them before, else sent
    (by `inner`, which keeps the budget and the meter) and, with `record`, recorded before the reply is handed
    on. lookup(episode, turn, request) and record(episode, turn, request, reply) are awaitables' makers: a Ray
    keeper's methods, or a file's read here. A call outside `ledger_episode` is sent as it is."""

    def __init__(self, inner: Any, lookup: Callable[..., Awaitable[Any]],
                 record: Callable[..., Awaitable[Any]] | None = None) -> None:  # fmt: skip
        self.inner, self.lookup, self.record = inner, lookup, record

    async def respond(self, prompt: str, history=(), *, run_config=None, **options: Any) -> EnvironmentReply:
        episode = _EPISODE.get(None)
        if episode is None:
            return await self.inner.respond(prompt, history, run_config=run_config, **options)
        model = str(getattr(self.inner, "model_name", "") or "")
        turn, key = len(history), request_key(model, prompt, history)
        recorded = await self.lookup(episode.key, turn, key)
        if recorded is not None:
            episode.replayed += 1
            # `cached`: not sent and not paid for now (the try that sent it paid, and the store counted it then).
            return EnvironmentReply(**{**recorded, "cached": True})
        reply = await self.inner.respond(prompt, history, run_config=run_config, **options)
        if self.record is not None:
            await self.record(episode.key, turn, key, reply.to_dict())  # on disk before it is seen
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
