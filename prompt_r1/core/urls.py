"""The one check of every URL a user gives: an OpenAI-compatible endpoint (http/https) and the rate store (memory,
redis://, rediss://), from a flag, a config or recipe file, an environment variable or the Python API.

    check_store_url("redis://10.0.0.5:6379/0")    # the URL, or a one-line ConfigError naming what is wrong
    printable_url("http://u:pw@host/v1?key=k")    # 'http://host/v1': what an error may show of a URL

A URL is refused as written, before anything is contacted: Python's parser raises a bare ValueError for a bad
port, drops a newline without a word, and the redis client reads `/notadb` as database 0 and takes a password or
any option from the query. An error shows at most a short prefix of the URL, never its user part or query.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlparse, urlsplit

from prompt_r1.core.errors import ConfigError

__all__ = [
    "MEMORY_STORE",
    "RATE_STORE_PASSWORD_ENV",
    "STORE_SCHEMES",
    "STORE_URL_MAX",
    "check_store_url",
    "check_url",
    "is_shared_store",
    "names_store",
    "printable_url",
    "store_user",
]

# The environment variable holding the rate store's Redis password (never a flag or a file: it is never printed).
RATE_STORE_PASSWORD_ENV = "PROMPT_R1_RATE_STORE_PASSWORD"

# The rate store kinds, named here only: the limits of this process alone, kept in its memory, or a shared
# store that every process and machine naming it takes from (a Redis server; rediss: over TLS).
MEMORY_STORE = "memory"
STORE_SCHEMES = ("redis", "rediss")


def is_shared_store(url: str) -> bool:
    """Whether a rate store (as `check_store_url` accepts it) is shared, rather than this process's memory.

    >>> is_shared_store("memory"), is_shared_store("redis://10.0.0.5:6379/0")
    (False, True)
    """
    return url != MEMORY_STORE


def check_url(url: str, flag: str) -> None:
    """Refuse, in one line naming `flag`, what is not an http(s) URL with a host."""
    _check_characters(url, flag)
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 (raises ValueError for a port that is not a number from 0 to 65535)
    except ValueError:
        parsed = None
    if parsed is None or parsed.scheme not in {"http", "https"} or not parsed.netloc:
        raise ConfigError(
            f"{flag} must be an http(s) URL such as http://127.0.0.1:8000/v1, got {_shown(url)}"
        )


# The longest rate-store URL taken, and how much of a refused one is shown: a URL is printed in logs and errors.
STORE_URL_MAX = 1000
_SHOWN = 60


def printable_url(url: str, limit: int = _SHOWN) -> str:
    """A URL as an error may show it: without its user part or query (either may hold a password or key), at
    most `limit` characters.

    >>> printable_url("http://user:pw@10.0.0.5:8000/v1?api-key=k")
    'http://10.0.0.5:8000/v1'
    """
    scheme, sep, rest = url.partition("://")
    host = rest.split("/")[0].split("?")[0]
    if "@" in host:  # the user part ends at the last @ before the path
        rest = rest[len(host.rsplit("@", 1)[0]) + 1 :]
    text = (scheme + sep + rest if sep else url.rsplit("@", 1)[-1]).split("?")[0].split("#")[0]
    return text[:limit] + "…" if len(text) > limit else text


def _check_characters(url: str, flag: str) -> None:
    """A URL holds no space or control character: Python's URL parser drops a newline or tab without a word,
    so the URL that is used would not be the one that is shown."""
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ConfigError(f"{flag} must be a URL without spaces or control characters, got {_shown(url)}")


def _shown(url: str) -> str:
    """A refused URL, printable and quoted so that no control character breaks the one line."""
    return repr(printable_url(url))


def check_store_url(url: str, flag: str = "--env-rate-store") -> str:
    """`url` when it is a rate store the redis client can open as written (`memory`, or redis:// or rediss://,
    a host, a port from 1 to 65535, an optional database number, nothing more), else a one-line ConfigError
    naming what is wrong. The one rule for every surface (flags, config and recipe files, pool members,
    environment variables, Python): the redis client itself reads `/notadb` as database 0, takes a password and
    any option from the query, and raises a bare ValueError for a bad port.

    >>> check_store_url("redis://10.0.0.5:6380/2")
    'redis://10.0.0.5:6380/2'
    >>> check_store_url("redis://10.0.0.5/notadb")
    Traceback (most recent call last):
    ...
    prompt_r1.core.errors.ConfigError: --env-rate-store: the path must be a database number such as /0, got '/notadb'
    """
    if not is_shared_store(url):
        return url
    example = "redis://127.0.0.1:6379/0"
    _check_characters(url, flag)
    if len(url) > STORE_URL_MAX:
        raise ConfigError(
            f"{flag} is {len(url)} characters long (at most {STORE_URL_MAX}), got {_shown(url)}"
        )
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", a port that is not a number
        why = "a port from 1 to 65535" if "ort" in str(exc) else "a well-formed host"
        raise ConfigError(f"{flag} needs {why}, as in {example}, got {_shown(url)}") from None
    if parsed.scheme not in STORE_SCHEMES or not parsed.hostname:
        raise ConfigError(
            f"{flag} must be {MEMORY_STORE} or a {' / '.join(f'{s}://' for s in STORE_SCHEMES)} URL such as {example}, "
            f"got {_shown(url)}"
        )
    query = parse_qs(parsed.query, keep_blank_values=True)
    if parsed.password is not None or "password" in query:
        raise ConfigError(
            f"{flag}: put the Redis password in {RATE_STORE_PASSWORD_ENV}, not in the URL (a URL "
            "is printed in logs and summaries)"
        )
    if port == 0:
        raise ConfigError(f"{flag} needs a port from 1 to 65535, as in {example}, got {_shown(url)}")
    if not _HOST.fullmatch(parsed.hostname):
        raise ConfigError(f"{flag} needs a host name or IP address, as in {example}, got {_shown(url)}")
    if parsed.query or parsed.fragment or "?" in url or "#" in url:
        raise ConfigError(
            f"{flag} takes no options after the database (?… or #…): the password comes from "
            f"{RATE_STORE_PASSWORD_ENV}, the database is the path, as in {example}; got {_shown(url)}"
        )
    db = parsed.path.removeprefix("/")
    if db and not (db.isascii() and db.isdigit() and int(db) < 2**31):
        raise ConfigError(f"{flag}: the path must be a database number such as /0, got {_shown(parsed.path)}")
    return url


# A DNS name, an IPv4 address or the inside of an IPv6 address's brackets (as urlsplit gives `hostname`).
_HOST = re.compile(r"[A-Za-z0-9._-]{1,253}|[0-9A-Fa-f:.]{2,45}(%[A-Za-z0-9._-]+)?")


def names_store(value: str) -> bool:
    """Whether a value given where a file or a shared store may go (`--env-cache`) names a store by URL.

    >>> names_store("redis://10.0.0.5:6379/0"), names_store("cache.sqlite")
    (True, False)
    """
    return value.split("://", 1)[0] in STORE_SCHEMES and "://" in value


def store_user(url: str) -> bool:
    """Whether a rate store URL names a user (its password then comes from PROMPT_R1_RATE_STORE_PASSWORD)."""
    return is_shared_store(url) and bool(urlsplit(url).username)
