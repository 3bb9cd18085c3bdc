"""SQLite files that hold paid replies: made whole before they appear, checked before they are trusted.

The environment's response cache (`clients.response_cache`), training's call ledger (`training.shared.ledger`)
and batch's call ledger (`runs.call_ledger`) keep replies the same way: one SQLite file with a `meta` table naming its format,
version and owner, written whole under a temporary name and then renamed into place, so a file at the path is
always one of ours or a damaged one, never a half-made one that would be taken as empty and paid again.

    create_whole(path, SCHEMA, {"format": "prompt-r1 response cache", "version": "1"})
    problem = damage(connection)          # None, or SQLite's own words for what is wrong
    meta = read_meta(connection)          # {} when the file has no meta table
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import sqlite3
from collections.abc import Mapping
from glob import escape as glob_escape
from pathlib import Path

__all__ = ["create_whole", "damage", "orphan_log", "read_meta"]


def orphan_log(path: Path) -> Path | None:
    """The write-ahead log of a database that is not there (its file moved or deleted, its `-wal` left behind),
    else None. SQLite replays a log over any non-empty file at the path, so a new file made there would take in
    the old one's calls, or be found damaged."""
    wal = path.with_name(path.name + "-wal")
    return wal if not path.exists() and wal.is_file() and wal.stat().st_size > 0 else None


def create_whole(path: Path, schema: str, meta: Mapping[str, str], *, wal: bool = False) -> None:
    """Write a new database with `schema` and `meta` rows under a temporary name, then link it to `path` unless a
    file is there by then (another process made it first, and its file is kept): a process killed while creating
    it leaves no file at `path`. A `FileExistsError` (nothing made) when an earlier
    file's write-ahead log is still there (`orphan_log`). `wal`: the file is made in WAL mode (kept in the file),
    so processes sharing it never switch it, which needs the file to themselves."""
    wal = orphan_log(path)
    if wal is not None:
        raise FileExistsError(
            errno.EEXIST,
            f"{wal.name} is there without the file it belongs to; move it away too, or put that file back",
            str(wal),
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_temporaries(path)
    # A name of this call's own, made with O_EXCL and never through a link: processes creating one file at once
    # (shards, Ray actors, two jobs sharing a cache) each build their own, and a link left there is not followed.
    tmp = path.with_name(f"{path.name}.creating-{os.getpid()}-{secrets.token_hex(4)}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    try:
        connection = sqlite3.connect(tmp, isolation_level=None)
        try:
            connection.executescript(
                "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);" + schema
            )
            with connection:
                connection.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", sorted(meta.items()))
            if wal:
                connection.execute("PRAGMA journal_mode = WAL")
        finally:
            connection.close()
        # Appears only where no file is yet: the first process to finish wins, and a file another process made
        # (and may already hold replies in) is never replaced by an empty one.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        for leftover in (tmp, *(tmp.with_name(tmp.name + end) for end in ("-journal", "-wal", "-shm"))):
            leftover.unlink(missing_ok=True)


def _remove_dead_temporaries(path: Path) -> None:
    """Remove what processes killed while creating `path` left beside it: `NAME.creating` (the older name) and
    `NAME.creating-PID-…` of a process that is gone (a live one's is its own, still being built)."""
    for leftover in path.parent.glob(f"{glob_escape(path.name)}.creating*"):
        pid = leftover.name[len(path.name) + len(".creating") :].lstrip("-").split("-")[0]
        if pid.isdigit() and _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            leftover.unlink()  # a link is removed itself, never followed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def damage(connection: sqlite3.Connection) -> str | None:
    """SQLite's quick check of the file: None when it passes, else its first finding."""
    problem = str(connection.execute("PRAGMA quick_check").fetchone()[0])
    if problem == "ok":
        return None
    # SQLite lists every finding in one value, under a "*** in database main ***" header: the first says enough
    # for the one line an error gets.
    findings = [line.strip() for line in problem.splitlines() if line.strip() and not line.startswith("***")]
    return findings[0] if findings else " ".join(problem.split())


def read_meta(connection: sqlite3.Connection) -> dict[str, str]:
    """The file's meta rows; {} when it has no meta table (an SQLite file that is not ours)."""
    tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return dict(connection.execute("SELECT name, value FROM meta")) if "meta" in tables else {}
