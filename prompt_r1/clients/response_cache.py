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
- **a file** (SQLite, WAL; `clients.cache_store`): made whole before it appears (`clients.sqlite_files`, as
  training's call ledger), and only when the run keeps its first reply, so a run refused or stopped before it
  paid for anything leaves no empty cache behind. Processes sharing one file (several jobs, shards) each make
  their own temporary and the first to finish links it into place; the others open that one. A file another
  process is writing ("database is locked") is waited for (`BUSY_SECONDS`), and a reply that still cannot be kept
  is returned all the same: being busy never fails a row whose call was paid (it is counted as not kept).
  The file names the endpoints whose replies it holds; a run on other endpoints is refused (every lookup would
  miss, and every call would be paid again while the user thinks it is cached). A folder, an unreadable or
  damaged file, another program's database: one line (`CacheError`, exit 2), the file left as it is.
- **the store's Redis** (`redis://` / `rediss://`, as `--env-rate-store`): one key per reply under
  `prompt-r1:env-cache:v1:`; the password from PROMPT_R1_RATE_STORE_PASSWORD. A Redis server serves many
  endpoints, and the endpoint is part of every key, so it is not bound to one.

Each reply is stored with a checksum of its key and its JSON: a row changed on disk is refused when it is read
(`CacheError`), never replayed as another call's answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from prompt_r1.clients.cache_store import (  # FileCache and BUSY_SECONDS: importable from here as ever
    BUSY_SECONDS,  # noqa: F401
    FLAG,
    CacheError,
    FileCache,  # noqa: F401
    ResponseCache,
    open_file,
    peek_file,
    render_summary,
)
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

REDIS_PREFIX = "prompt-r1:env-cache:v1:"


def request_key(endpoint: str, model: str, messages: Sequence[Any], sampling: dict[str, Any]) -> str:
    """The key of one call: a hash of the endpoint, the model, each message's role and text, and the sampling.

    >>> a = request_key("http://h/v1", "m", [], {"temperature": 0})
    >>> a == request_key("http://h/v1", "m", [], {"temperature": 0}) != request_key("http://h/v1", "m", [], {})
    True
    """
    body = [printable_url(endpoint, 10_000), model, message_texts(messages), sorted(sampling.items())]
    return stable_hash(body, digest_size=20)


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
    return open_file(Path(where), sorted(set(endpoints)))


def peek_cache(where: str | Path, endpoints: Iterable[str]) -> ResponseCache | None:
    """The cache at `where` opened only to look up replies (a dry run's look): None when there is no file yet.
    Refused as `open_cache` refuses (one `CacheError` line); nothing is written: the file is opened read-only and
    immutable (no lock, no -wal or -shm file), so a reply a crashed run left in its write-ahead log is not seen."""
    where = str(where)
    if names_store(where):
        return _open_redis(where)  # a GET writes nothing
    return peek_file(Path(where), sorted(set(endpoints)))


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
