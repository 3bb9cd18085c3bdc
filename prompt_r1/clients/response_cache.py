"""The environment's response cache: an answer paid for once is replayed, not bought again (`--env-cache`).

    cache = open_cache("eval.cache.sqlite", endpoints=["https://api.openai.com/v1"])   # or a redis:// URL
    use_cache(environment, cache)       # a client, or each member of a pool; refused unless replaying is right
    ...                                 # episodes run; a reply found in the cache comes back with cached=True
    cache.summary(prices)               # {"hits": …, "stored": …, "saved_usd": …}

A call is keyed by what decides its answer: the endpoint (its URL as `printable_url` shows it, never a user,
password or query), the model, every message (role and text, in order) and the sampling settings (temperature,
max_tokens). Nothing else goes in: no API key is part of a key, a row or the file's meta; a reply is stored and
replayed with every key and URL secret cut (`redaction.scrub`: the endpoint's user part, a secret query
parameter), so a cache written by another run or user replays none into this run's rows. Replaying is right only
where the endpoint would give the same answer again, so `use_cache` refuses an environment sampled above
temperature 0 unless the run asks for replays anyway (`always=True`, `--env-cache-always`).

Two stores, one format:
- **a file** (SQLite, WAL): made whole before it appears (`clients.sqlite_files`, as training's call ledger),
  and only when the run keeps its first reply, so a run refused or stopped before it paid for anything leaves no
  empty cache behind. Processes sharing one file (several jobs, shards) each make their own temporary and the
  first to finish links it into place; the others open that one. A file another process is writing ("database
  is locked") is waited for (`BUSY_SECONDS`), and a reply that still cannot be kept is returned all the same:
  being busy never fails a row whose call was paid (it is counted as not kept).
  The file names the endpoints whose replies it holds; a run on other endpoints is refused (every lookup would
  miss, and every call would be paid again while the user thinks it is cached). A folder, an unreadable or
  damaged file, another program's database: one line (`CacheError`, exit 2), the file left as it is.
- **the store's Redis** (`redis://` / `rediss://`, as `--env-rate-store`): one key per reply under
  `prompt-r1:env-cache:v1:`; the password from PROMPT_R1_RATE_STORE_PASSWORD. A Redis server serves many
  endpoints, and the endpoint is part of every key, so it is not bound to one.

Each reply is stored with a checksum of its key and its JSON: a row changed on disk is refused when it is read
(`CacheError`), never replayed as another call's answer.

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
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.clients.sqlite_files import create_whole, damage, orphan_log, read_meta
from prompt_r1.core import redaction
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.hashing import message_texts, stable_hash
from prompt_r1.core.urls import check_store_url, names_store, printable_url

__all__ = [
    "CacheError",
    "ResponseCache",
    "cache_endpoints",
    "check_replayable",
    "open_cache",
    "peek_cache",
    "render_summary",
    "request_key",
    "use_cache",
]

FORMAT = "prompt-r1 response cache"
VERSION = "1"
FLAG = "--env-cache"
REDIS_PREFIX = "prompt-r1:env-cache:v1:"

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


def request_key(endpoint: str, model: str, messages: Sequence[Any], sampling: dict[str, Any]) -> str:
    """The key of one call: a hash of the endpoint, the model, each message's role and text, and the sampling.

    >>> a = request_key("http://h/v1", "m", [], {"temperature": 0})
    >>> a == request_key("http://h/v1", "m", [], {"temperature": 0}) != request_key("http://h/v1", "m", [], {})
    True
    """
    body = [printable_url(endpoint, 10_000), model, message_texts(messages), sorted(sampling.items())]
    return stable_hash(body, digest_size=20)


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


class RedisCache(ResponseCache):
    """The cache in a Redis database (see the module); a plain, synchronous client: one GET or SET a call."""

    def __init__(self, client: Any, label: str) -> None:
        super().__init__(label)
        self.client = client

    def _get(self, key: str) -> tuple[str, str] | None:
        value = self.client.get(REDIS_PREFIX + key)
        if value is None:
            return None
        try:
            stored = json.loads(value)
            return str(stored["reply"]), str(stored["checksum"])
        except (ValueError, KeyError, TypeError):
            return "", ""  # refused by `get` as damaged

    def _put(self, key: str, reply_json: str, model: str, tokens: tuple[int, int], checksum: str) -> bool:
        self.client.set(REDIS_PREFIX + key, json.dumps({"reply": reply_json, "checksum": checksum}))
        return True

    def close(self) -> None:
        self.client.close()


def cache_endpoints(environment: Any) -> list[str]:
    """The endpoints an environment calls (each pool member's), as a cache file records them."""
    members = getattr(environment, "members", None) or [environment]
    return sorted({_endpoint(member) for member in members})


def _endpoint(client: Any) -> str:
    where = (
        getattr(client, "cache_endpoint", None)
        or getattr(client, "base_url", None)
        or getattr(client, "name", "")
    )
    return printable_url(str(where), 10_000)


def open_cache(where: str | Path, endpoints: Iterable[str]) -> ResponseCache:
    """The cache at `where` (a file path, made when missing, or a redis:// URL), for a run calling `endpoints`.
    Everything a run cannot use is a one-line `CacheError` before anything is sent, the file left as it is."""
    where = str(where)
    if names_store(where):
        return _open_redis(where)
    return _open_file(Path(where), sorted(set(endpoints)))


def peek_cache(where: str | Path, endpoints: Iterable[str]) -> ResponseCache | None:
    """The cache at `where` opened only to look up replies (a dry run's look): None when there is no file yet.
    Refused as `open_cache` refuses (one `CacheError` line); nothing is written: the file is opened read-only and
    immutable (no lock, no -wal or -shm file), so a reply a crashed run left in its write-ahead log is not seen."""
    where = str(where)
    if names_store(where):
        return _open_redis(where)  # a GET writes nothing
    path = Path(where)
    _check_path(path)
    if not path.exists():
        return None
    try:
        connection = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise CacheError(f"{FLAG} {path} cannot be opened ({exc})") from None
    return _checked(connection, path, lambda: _check(connection, path, sorted(set(endpoints))))


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


def _open_file(path: Path, endpoints: list[str]) -> FileCache:
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


def _open_redis(url: str) -> RedisCache:
    check_store_url(url, FLAG)
    try:
        import redis
    except ModuleNotFoundError:
        raise CacheError(
            f"a redis:// {FLAG} needs the redis client: pip install 'prompt-r1[store]', or give a file"
        ) from None
    from prompt_r1.clients.limit_store import store_label
    from prompt_r1.core.config import rate_store_password

    label = store_label(url)
    client = redis.Redis.from_url(
        url, password=rate_store_password(url), socket_timeout=5, socket_connect_timeout=5
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        raise CacheError(f"{FLAG} {label} does not answer ({str(exc).split('. ')[0]})") from None
    return RedisCache(client, label)


def use_cache(environment: Any, cache: ResponseCache | None, *, always: bool = False) -> None:
    """Answer `environment`'s calls from `cache` (each member's, for a pool). Refused (`CacheError`) for an
    environment sampled above temperature 0 unless `always`: a replay would stand in for a new draw."""
    if cache is None:
        return
    members = getattr(environment, "members", None) or [environment]
    for member in members:
        if not hasattr(member, "cache"):
            raise CacheError(
                f"{FLAG} works with the environment client and pool; got {type(member).__name__}"
            )
        check_replayable(sampling_of(member).get("temperature"), always=always)
    for member in members:
        member.cache = cache


def check_replayable(temperature: float | None, *, always: bool) -> None:
    """A `CacheError` for an environment sampled above temperature 0, unless `always` (`--env-cache-always`)."""
    if not always and temperature != 0:
        shown = "the endpoint's default" if temperature is None else f"{temperature:g}"
        raise CacheError(
            f"{FLAG} replays answers, right only for a deterministic environment: its temperature is "
            f"{shown}; give --env-temperature 0, or --env-cache-always to replay sampled answers as they were"
        )


def sampling_of(client: Any) -> dict[str, Any]:
    """The sampling settings that go into a call's key: the client's config, or its chat model's; or, given an
    environment config itself (a dry run's, which builds no client), that config's."""
    model = getattr(client, "chat_model", None)
    config = getattr(client, "config", client)
    source = model if model is not None else config
    return {name: getattr(source, name, None) for name in ("temperature", "max_tokens")}
