"""SQLite files that hold paid replies: made whole before they appear, checked before they are trusted.

The environment's response cache (`clients.response_cache`) and training's call ledger
(`training.shared.ledger`) keep replies the same way: one SQLite file with a `meta` table naming its format,
version and owner, written whole under a temporary name and then renamed into place, so a file at the path is
always one of ours or a damaged one, never a half-made one that would be taken as empty and paid again.

    create_whole(path, SCHEMA, {"format": "prompt-r1 response cache", "version": "1"})
    problem = damage(connection)          # None, or SQLite's own words for what is wrong
    meta = read_meta(connection)          # {} when the file has no meta table
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path

__all__ = ["create_whole", "damage", "read_meta"]


def create_whole(path: Path, schema: str, meta: Mapping[str, str]) -> None:
    """Write a new database with `schema` and `meta` rows under a temporary name, then rename it to `path`: a
    process killed while creating it leaves no file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".creating")
    for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
        leftover.unlink(missing_ok=True)
    connection = sqlite3.connect(tmp, isolation_level=None)
    try:
        connection.executescript(
            "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);" + schema
        )
        with connection:
            connection.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", sorted(meta.items()))
    finally:
        connection.close()
    os.replace(tmp, path)


def damage(connection: sqlite3.Connection) -> str | None:
    """SQLite's quick check of the file: None when it passes, else its first finding."""
    problem = connection.execute("PRAGMA quick_check").fetchone()[0]
    return None if problem == "ok" else str(problem)


def read_meta(connection: sqlite3.Connection) -> dict[str, str]:
    """The file's meta rows; {} when it has no meta table (an SQLite file that is not ours)."""
    tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return dict(connection.execute("SELECT name, value FROM meta")) if "meta" in tables else {}
