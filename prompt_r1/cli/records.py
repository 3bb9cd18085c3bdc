"""What `batch` and `eval` keep beside their results: the response cache's flags and the manifest's one flag.

    add_cache_flags(parser)                   # --env-cache PATH|redis://…, --env-cache-always
    add_allow_changed_flag(parser, "rows")    # --allow-changed-settings
    check_run_cache(args, configs, protected=[("--out file", out)])   # before anything is written
    cache = open_run_cache(args, environments, protected=[("--out file", out)])
    verdict = cache_verdict(cache)            # the line to end with when a cached reply was found damaged

The cache and the manifest themselves live below (prompt_r1.clients.response_cache, prompt_r1.runs.manifest); this
module turns flags into them, so that each command adds a line, not a copy.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prompt_r1.clients.response_cache import CacheError, ResponseCache, cache_endpoints, open_cache
from prompt_r1.core.urls import names_store

__all__ = [
    "ALLOW_CHANGED",
    "add_allow_changed_flag",
    "add_cache_flags",
    "cache_verdict",
    "check_run_cache",
    "closing_caches",
    "open_run_cache",
    "peek_run_cache",
]

ALLOW_CHANGED = "--allow-changed-settings"
_opened: list[ResponseCache] = []  # the caches this command opened, closed when it ends (closing_caches)


@contextlib.contextmanager
def closing_caches() -> Iterator[None]:
    """Close every cache opened inside the block when it ends, however it ends: a cache file is then whole at rest
    (its write-ahead log taken in), as the next run's check expects."""
    try:
        yield
    finally:
        while _opened:
            _opened.pop().close()


def add_cache_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("response cache")
    group.add_argument(
        "--env-cache",
        metavar="FILE|URL",
        help="replay environment answers paid for before instead of paying again: an SQLite file (made when "
        "missing) or the store's redis:// URL; keyed by endpoint, model, messages and sampling settings. Only "
        "at --env-temperature 0 unless --env-cache-always",
    )
    group.add_argument(
        "--env-cache-always",
        action="store_true",
        help="with --env-cache, replay also answers sampled above temperature 0 (as they were, not drawn again)",
    )


def add_allow_changed_flag(parser: argparse.ArgumentParser, unit: str) -> None:
    parser.add_argument(
        ALLOW_CHANGED,
        action="store_true",
        help=f"add {unit} to an output made with other settings (refused otherwise, naming each that differs); "
        "the manifest records what changed",
    )


def open_run_cache(
    args: argparse.Namespace, environments: Sequence[Any], protected: Iterable[tuple[str, Path | None]] = ()
) -> ResponseCache | None:
    """The run's response cache from --env-cache (None without it), for every environment the run calls: a file
    that is one of the run's other files, a folder, unreadable, damaged, or another endpoint's is one line
    (exit 2) before anything is sent."""
    where = getattr(args, "env_cache", None)
    if where is None:
        if getattr(args, "env_cache_always", False):
            raise CacheError("--env-cache-always goes with --env-cache FILE|URL")
        return None
    _refuse_own_files(where, protected)
    endpoints = sorted({e for environment in environments for e in cache_endpoints(environment)})
    cache = open_cache(where, endpoints)
    _opened.append(cache)
    return cache


def check_run_cache(
    args: argparse.Namespace, configs: Sequence[Any], protected: Iterable[tuple[str, Path | None]] = ()
) -> None:
    """Refuse, before a command writes anything, the --env-cache it would refuse once its clients are built (a
    folder, unreadable, damaged, another endpoint's, one of its own files, sampling above temperature 0), from the
    environments' `configs`; a missing file is made later, by `open_run_cache`. Nothing is written here."""
    _refuse_own_files(getattr(args, "env_cache", None), protected)
    cache = peek_run_cache(args, configs)
    if cache is not None:
        cache.close()


def peek_run_cache(
    args: argparse.Namespace, configs: Sequence[Any], protected: Iterable[tuple[str, Path | None]] = ()
) -> ResponseCache | None:
    """The --env-cache opened to look only (`response_cache.peek_cache`; None without one, or with no file yet),
    refused as the run would refuse it (one of the run's own `protected` files too). A dry run's look, and
    `check_run_cache`'s."""
    from prompt_r1.clients.environment import OPENAI_BASE_URL
    from prompt_r1.clients.response_cache import check_replayable, peek_cache
    from prompt_r1.core.defaults import is_local_model_name, local_endpoint
    from prompt_r1.core.urls import printable_url

    where = getattr(args, "env_cache", None)
    if where is None:
        if getattr(args, "env_cache_always", False):
            raise CacheError("--env-cache-always goes with --env-cache FILE|URL")
        return None
    _refuse_own_files(where, protected)
    for config in configs:
        check_replayable(config.temperature, always=args.env_cache_always)

    def endpoint(config) -> str:  # as the environment client keys its replies (a built-in model: its name)
        if is_local_model_name(config.model):
            return local_endpoint(config.model)
        return printable_url(config.base_url or OPENAI_BASE_URL, 10_000)

    return peek_cache(where, {endpoint(c) for c in configs})


def _refuse_own_files(where: str | None, protected: Iterable[tuple[str, Path | None]]) -> None:
    if where is None or names_store(where):
        return
    for what, path in protected:
        if path is not None and _same(Path(path), Path(where)):
            raise CacheError(f"--env-cache {where} is the {what}; name a file of its own")


def _same(a: Path, b: Path) -> bool:
    """One file by two names: the same path once links are followed, or one file (a hard link)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


def cache_verdict(cache: ResponseCache | None) -> str | None:
    """The one line to end with when a reply in the cache turned out damaged during the run, else None."""
    return None if cache is None else cache.damaged
