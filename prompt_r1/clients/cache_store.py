"""The response cache's stores (clients/response_cache.py says what the cache does and how a run opens one):
`ResponseCache`, what every store shares (the run's counts, checksums, every secret cut from a reply), and
`FileCache`, the cache in one SQLite file, with the functions that open, check and make that file.

    endpoints = ["https://api.openai.com/v1"]
    cache = open_file(Path("eval.cache.sqlite"), endpoints)   # checked now if there, made at the first kept reply
    peek_file(Path("eval.cache.sqlite"), endpoints)   # read-only and immutable (a dry run's); None without a file

Why a store of its own rather than training's ledger: the ledger keys a call by where it falls in a run (step,
episode, turn) so that a resumed run replays its own calls exactly, one file per rank, beside its checkpoints;
the cache keys a call by its content, across runs, commands and machines. What they share is the file handling
(`sqlite_files`: made whole, quick-checked, a meta table naming format and owner).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.clients.sqlite_files import create_whole, damage, orphan_log, read_meta
from prompt_r1.core import redaction
from prompt_r1.core.errors import ConfigError

__all__ = [
    "BUSY_SECONDS",
    "FLAG",
    "CacheError",
    "FileCache",
    "ResponseCache",
    "open_file",
    "peek_file",
    "render_summary",
]

FORMAT = "prompt-r1 response cache"
VERSION = "1"
FLAG = "--env-cache"

# How long a lookup or a kept reply waits for a cache file other processes are writing ("database is locked")
# before it gives up on the cache for that call: a lookup then misses, a paid reply is returned but not kept.
BUSY_SECONDS = 120.0
_BUSY_TIMEOUT_MS = 10_000  # SQLite's own wait within one statement, retried until BUSY_SECONDS

_SCHEMA = """
CREATE TABLE IF NOT EXISTS replies (
    key TEXT PRIMARY KEY,
    reply TEXT NOT NULL,          -- the EnvironmentReply as JSON
    model TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    checksum TEXT NOT NULL,       -- of key and reply: a row changed on disk is refused, not replayed
    stored_at REAL NOT NULL
);
"""


class CacheError(ConfigError):
    """A response cache this run cannot use, or a reply in it that was damaged; one line, naming it."""


def _checksum(key: str, reply_json: str) -> str:
    return hashlib.blake2b(f"{key}\n{reply_json}".encode(), digest_size=16).hexdigest()


class ResponseCache:
    """Replies by request key, in a file or a Redis database, with this run's counts: `hits` (calls answered from
    the cache, not sent), `stored` (calls sent and kept), and the tokens each model was not paid for."""

    def __init__(self, label: str) -> None:
        self.label = label  # what errors and summaries call it (a path, or the store URL without secrets)
        self.hits = 0
        self.stored = 0
        self.saved: dict[str, list[int]] = {}  # model → [input tokens, output tokens] not paid for
        self.damaged: str | None = None  # the error of the first damaged reply found, for the run's last line
        self.unsaved = 0  # paid replies not kept: the file stayed busy past BUSY_SECONDS
        self._lock = threading.Lock()

    # --- what a store implements ------------------------------------------------------------------------
    def _get(self, key: str) -> tuple[str, str] | None:  # (reply JSON, checksum)
        raise NotImplementedError

    def _put(self, key: str, reply_json: str, model: str, tokens: tuple[int, int], checksum: str) -> bool:
        """Keep the reply; False when it could not be kept for a reason that must not fail the call (busy)."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def size(self) -> int | None:
        """How many replies the store holds, where it can say cheaply (a file), else None."""
        return None

    # --- what the client calls --------------------------------------------------------------------------
    def get(self, key: str) -> dict[str, Any] | None:
        """The reply stored under `key` (as `EnvironmentReply` fields), or None. A damaged row is a `CacheError`."""
        with self._lock:
            found = self._get(key)
        if found is None:
            return None
        reply_json, checksum = found
        try:
            reply = json.loads(reply_json) if _checksum(key, reply_json) == checksum else None
        except ValueError:
            reply = None
        # A cache another run wrote (an older version, another user's) may hold a URL secret: cut on the way out.
        reply = redaction.scrub(reply)
        if not isinstance(reply, dict) or not isinstance(reply.get("text"), str):
            self.damaged = (
                f"{FLAG} {self.label}: a stored reply is damaged (its checksum does not match), so it was not "
                "replayed and its row failed: restore the cache from a copy, or use another one"
            )
            raise CacheError(self.damaged)
        with self._lock:
            self.hits += 1
            tokens = self.saved.setdefault(str(reply.get("model") or ""), [0, 0])
            tokens[0] += int(reply.get("input_tokens") or 0)
            tokens[1] += int(reply.get("output_tokens") or 0)
        return reply

    def holds(self, key: str) -> dict[str, Any] | None:
        """The reply stored under `key` as `get` returns it, without counting a hit (a dry run's look)."""
        found = self._get(key)
        if found is None:
            return None
        try:
            reply = json.loads(found[0]) if _checksum(key, found[0]) == found[1] else None
        except ValueError:
            reply = None
        reply = redaction.scrub(reply)
        return reply if isinstance(reply, dict) and isinstance(reply.get("text"), str) else None

    def put(self, key: str, reply: dict[str, Any]) -> None:
        """Keep one paid reply (its fields, `cached` left out) under `key`, every key and URL secret cut (the
        endpoint's user part, a secret query parameter): the file is shared, and replayed into others' rows."""
        reply = redaction.scrub({k: v for k, v in reply.items() if k != "cached"})
        reply_json = json.dumps(reply, ensure_ascii=False)
        tokens = (int(reply.get("input_tokens") or 0), int(reply.get("output_tokens") or 0))
        with self._lock:
            if self._put(key, reply_json, str(reply.get("model") or ""), tokens, _checksum(key, reply_json)):
                self.stored += 1
            else:
                self.unsaved += 1

    def summary(self, prices: PriceTable | None = None) -> dict[str, Any]:
        """This run's use of the cache: hits (calls saved), stored, and the dollars saved (None when a model
        whose reply was replayed has no price)."""
        saved_usd: float | None = 0.0
        for model, (tokens_in, tokens_out) in sorted(self.saved.items()):
            cost = None if prices is None else prices.cost(model, tokens_in, tokens_out)
            saved_usd = None if cost is None or saved_usd is None else saved_usd + cost
        return {"cache": self.label, "hits": self.hits, "calls_saved": self.hits, "stored": self.stored,
                "saved_usd": saved_usd, **({"not_kept": self.unsaved} if self.unsaved else {})}  # fmt: skip

    def render(self, prices: PriceTable | None = None) -> str:
        return render_summary(self.summary(prices))


def render_summary(summary: dict[str, Any]) -> str:
    """A cache's summary as one line: `12 hits (calls saved) · 3 stored · $0.0123 saved`."""
    saved = summary["saved_usd"]
    shown = (
        "dollars unknown (a replayed model has no price; see --prices)" if saved is None else f"${saved:.4f}"
    )
    lost = summary.get("not_kept")
    kept = f" · {lost} paid replies not kept (the file stayed busy)" if lost else ""
    return f"{summary['hits']} hits (calls saved) · {summary['stored']} stored{kept} · {shown} saved"


def _busy(exc: BaseException) -> bool:
    """SQLite's "database is locked" / "database is busy": another process holds the file for a moment."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def _waiting(action: Callable[[], Any]) -> Any:
    """`action()`, tried again while the file is busy, up to BUSY_SECONDS; then the busy error is raised."""
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class FileCache(ResponseCache):
    """The cache in one SQLite file (see the module). Without a connection (`connection` None) the file is not
    made yet: a lookup finds nothing (or the file another process has made since), and the first reply kept makes
    it."""

    def __init__(
        self, connection: sqlite3.Connection | None, path: Path, endpoints: list[str] | None = None
    ) -> None:
        super().__init__(str(path))
        self.connection, self.path, self.endpoints = connection, path, endpoints

    def _connect(self, *, create: bool) -> sqlite3.Connection | None:
        if self.connection is None:
            if not self.path.exists():
                if not create:
                    return None
                _create(self.path, self.endpoints or [])
            self.connection = _connect_checked(self.path, self.endpoints or [])
        return self.connection

    def _get(self, key: str) -> tuple[str, str] | None:
        try:
            connection = self._connect(create=False)
            if connection is None:
                return None
            row = _waiting(
                lambda: connection.execute(
                    "SELECT reply, checksum FROM replies WHERE key=?", (key,)
                ).fetchone()
            )
        except sqlite3.DatabaseError as exc:
            if _busy(exc):  # busy past the wait: a miss (the call is sent), never a failed row
                return None
            raise CacheError(
                f"{FLAG} {self.path} cannot be read ({exc}); restore it or use another"
            ) from None
        return None if row is None else (str(row[0]), str(row[1]))

    def _put(self, key: str, reply_json: str, model: str, tokens: tuple[int, int], checksum: str) -> bool:
        def insert() -> None:
            with connection:
                connection.execute(
                    "INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (key, reply_json, model, *tokens, checksum, time.time()),
                )

        try:
            connection = self._connect(create=True)
            _waiting(insert)
        except sqlite3.DatabaseError as exc:
            if _busy(
                exc
            ):  # the call was paid and its reply goes back to the episode: only the cache lacks it
                return False
            raise CacheError(f"{FLAG} {self.path} cannot be written ({exc})") from None
        return True

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def size(self) -> int | None:
        connection = self._connect(create=False)
        if connection is None:
            return 0
        return int(_waiting(lambda: connection.execute("SELECT COUNT(*) FROM replies").fetchone()[0]))


def _checked(connection: sqlite3.Connection, path: Path, check: Callable[[], None]) -> FileCache:
    """The cache on `connection` once `check` passes; a damaged database is one line, and the connection is
    closed whatever stops it."""
    try:
        check()
    except sqlite3.DatabaseError as exc:
        connection.close()
        raise CacheError(
            f"{FLAG} {path} is not a readable response cache ({exc}); it was left untouched"
        ) from None
    except BaseException:
        connection.close()
        raise
    return FileCache(connection, path)


def _check_path(path: Path) -> None:
    """A cache path that is a folder, unreadable or empty: one line."""
    if path.is_dir():
        raise CacheError(f"{FLAG} {path} is a folder; give a file (such as {path / 'cache.sqlite'})")
    if path.exists():
        if not os.access(path, os.R_OK) or not os.access(path, os.W_OK):
            raise CacheError(f"{FLAG} {path} cannot be read and written (permission denied)")
        if path.stat().st_size == 0:
            raise CacheError(
                f"{FLAG} {path} is empty (0 bytes), so it was damaged; restore it or use another"
            )


def open_file(path: Path, endpoints: list[str]) -> FileCache:
    """The cache file at `path`, checked now when it is there; a missing one is checked to be makeable now (its
    folder, a write-ahead log left without its file) and made at the run's first kept reply (`FileCache`)."""
    _check_path(path)
    if path.exists():
        return FileCache(_connect_checked(path, endpoints), path, endpoints)
    for ancestor in path.absolute().parents:  # the nearest folder there: where create_whole makes the rest
        if ancestor.exists():
            if not ancestor.is_dir():
                raise CacheError(f"{FLAG} {path}: {ancestor} is not a folder")
            if not os.access(ancestor, os.W_OK | os.X_OK):
                raise CacheError(f"{FLAG} {path} cannot be created (permission denied in {ancestor})")
            break
    wal = orphan_log(path)
    if wal is not None:
        raise CacheError(
            f"{FLAG} {path} cannot be created ({wal.name} is there without the file it belongs to; move it away "
            "too, or put that file back)"
        )
    return FileCache(None, path, endpoints)


def _create(path: Path, endpoints: list[str]) -> None:
    """Make the cache file whole (WAL already set) unless another process has made it first."""
    try:
        create_whole(
            path,
            _SCHEMA,
            {"format": FORMAT, "version": VERSION, "endpoints": json.dumps(endpoints)},
            wal=True,
        )
    except (OSError, sqlite3.Error) as exc:
        raise CacheError(
            f"{FLAG} {path} cannot be created ({getattr(exc, 'strerror', None) or exc})"
        ) from None


def _connect_checked(path: Path, endpoints: list[str]) -> sqlite3.Connection:
    """A connection to the cache file at `path` once it passes `_check`, set for sharing (WAL, a busy wait)."""
    try:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise CacheError(f"{FLAG} {path} cannot be opened ({exc})") from None

    def check() -> None:
        connection.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        _waiting(lambda: _check(connection, path, endpoints))
        # A file made before caches were made in WAL mode is switched once, which waits for its other users.
        _waiting(lambda: connection.execute("PRAGMA journal_mode = WAL"))
        # A reply lost in a crash is only paid again; a torn file is refused when opened.
        connection.execute("PRAGMA synchronous = NORMAL")

    return _checked(connection, path, check).connection


def _check(connection: sqlite3.Connection, path: Path, endpoints: list[str]) -> None:
    problem = damage(connection)
    if problem is not None:
        raise CacheError(f"{FLAG} {path} is damaged ({problem}); restore it from a copy or use another file")
    meta = read_meta(connection)
    if meta.get("format") != FORMAT:
        raise CacheError(
            f"{FLAG} {path} is not a prompt-r1 response cache; it was left untouched: name another file"
        )
    if meta.get("version") != VERSION:
        raise CacheError(
            f"{FLAG} {path} is a response cache of version {meta.get('version')}, this one reads {VERSION}"
        )
    try:
        recorded = json.loads(meta.get("endpoints", "[]"))
    except ValueError:
        recorded = None
    if recorded != endpoints:
        raise CacheError(
            f"{FLAG} {path} holds replies of {', '.join(recorded or ['?'])}, not of this run's "
            f"{', '.join(endpoints)}: every call would be paid again; use another {FLAG} file for these endpoints"
        )


def peek_file(path: Path, endpoints: list[str]) -> FileCache | None:
    """The cache file at `path` opened read-only and immutable (`response_cache.peek_cache`): None when there is
    no file yet; refused as `open_file` refuses."""
    _check_path(path)
    if not path.exists():
        return None
    try:
        connection = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise CacheError(f"{FLAG} {path} cannot be opened ({exc})") from None
    return _checked(connection, path, lambda: _check(connection, path, endpoints))
