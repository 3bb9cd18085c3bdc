"""The files a run writes: results files (one JSON row per episode, appended as episodes finish), read, cut and
compacted here (the store that decides what to run over them: prompt_r1.runs.result_store), and the summary, log
and checkpoint paths, each checked before a byte is written.

A run writes to paths the user names, so it checks them before it writes a byte: an output that is the input, a
folder, or a file that is not a results file is refused untouched, and one that cannot be written (a read-only or
full file system) is refused at start, each with one line naming the path (`OutputError`). Only then is a last
line that a killed run left unfinished cut off.

    state = open_results_file("results.jsonl", row_prefix='{"id": ', protected=[input_path])
"""

from __future__ import annotations

import json
import os
import sqlite3
import zlib
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prompt_r1.core.errors import OutputError
from prompt_r1.core.files import open_new, write_whole

__all__ = [
    "FAILED_STATUSES",
    "OutputState",
    "check_checkpoint",
    "check_folder_of",
    "peek_results_file",
    "check_log_file",
    "check_summary_path",
    "compact_output",
    "crc",
    "RowsRead",
    "open_results_file",
    "read_rows",
    "row_id",
    "write_text_file",
]

# Rows with these statuses are failures of the infrastructure or of this code, not the episode's outcome: a
# rerun retries them. internal_error: the episode raised something unexpected (its row holds the error).
FAILED_STATUSES = frozenset({"environment_error", "agent_error", "internal_error"})


def crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


@dataclass
class OutputState:
    """What an existing results file already holds: finished ids (with a checksum of their question) and failed
    ones, and how many rows an id's later row superseded."""

    finished: dict[Hashable, int] = field(default_factory=dict)
    failed: set[Hashable] = field(default_factory=set)
    superseded: int = 0


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _refuse_protected(path: Path, what: str, protected: Iterable[tuple[str, Path | None]]) -> None:
    for name, other in protected:
        if other is not None and (_same_file(path, Path(other)) or Path(other).resolve() == path.resolve()):
            raise OutputError(f"{what} {path} is the {name}; name another file")


def check_folder_of(path: str | Path, what: str) -> None:
    """Refuse, without creating anything, a path whose nearest existing ancestor is not a folder."""
    path = Path(path)
    for ancestor in path.absolute().parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise OutputError(f"cannot write {what} {path}: {ancestor} is not a folder")
            return


def _check_writable(path: Path, what: str) -> None:
    """Create the parent folders and open `path` for appending (creating it empty), so that a path that cannot be
    written fails now, before any work, rather than after it."""
    if path.is_dir():
        raise OutputError(f"{what} {path} is a folder; name a file")
    if path.exists() and not path.is_file():  # a device or a pipe cannot be read back to resume
        raise OutputError(f"{what} {path} is not a regular file; name a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise OutputError(f"cannot write {what} {path}: {_reason(exc)}") from None


def row_id(row: dict) -> str:
    """The key of a row in a file of one row per id (batch's)."""
    return str(row["id"])


def _row(line: bytes) -> dict | None:
    """A results row (a JSON object with an id and a status), or None when the line is not one."""
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(row, dict) or "id" not in row or "status" not in row:
        return None
    return row


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return True


def open_results_file(
    path: str | Path,
    *,
    row_prefix: str,
    protected: Iterable[tuple[str, Path | None]] = (),
    what: str = "--out",
    key: Callable[[dict], Hashable] = row_id,
    check: Callable[[dict], str | None] | None = None,
) -> OutputState:
    """Check `path` as the results file of a run and read what it holds, touching nothing that is not ours.

    Every complete line must be a results row (a JSON object with `id` and `status`); a file holding anything
    else is refused untouched. An unfinished last line (no newline) that begins as this writer's rows begin
    (`row_prefix`) is what a killed run leaves: it is cut off; one that is a complete row only gets its newline.
    `protected`: (name, path) pairs the output must not be (the input, the summary, the checkpoint). A last line
    that is complete JSON but not a row (someone else's file) is refused like any other. `key` names what a row
    is the result of (its id; eval's rows: method, dataset and id): a later row of a key supersedes earlier ones.
    `check(row)`: why a complete row cannot be used by this writer (refused with its line), or None."""
    path = Path(path)
    _refuse_protected(path, what, protected)
    _check_writable(path, what)
    state, cut_at, add_newline = _scan(path, row_prefix, what, key, check)
    if cut_at is not None or add_newline:
        try:
            with path.open("r+b") as handle:
                if cut_at is not None:
                    handle.truncate(cut_at)
                else:
                    handle.seek(0, os.SEEK_END)
                    handle.write(b"\n")
        except OSError as exc:
            raise OutputError(f"cannot write {what} {path}: {_reason(exc)}") from None
    return state


def peek_results_file(
    path: str | Path,
    *,
    row_prefix: str,
    protected: Iterable[tuple[str, Path | None]] = (),
    what: str = "--out",
    key: Callable[[dict], Hashable] = row_id,
) -> OutputState:
    """What `open_results_file` would find, without creating, cutting or writing anything (a dry run's view):
    the same refusals, in the same words, and the same finished and failed keys; a file not there yet holds
    nothing."""
    path = Path(path)
    _refuse_protected(path, what, protected)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a folder; name a file")
    if not path.exists():
        check_folder_of(path, what)
        return OutputState()
    if not path.is_file():
        raise OutputError(f"{what} {path} is not a regular file; name a file")
    try:
        return _scan(path, row_prefix, what, key, None)[0]
    except OSError as exc:
        raise OutputError(f"cannot read {what} {path}: {_reason(exc)}") from None


def _scan(
    path: Path,
    row_prefix: str,
    what: str,
    key: Callable[[dict], Hashable],
    check: Callable[[dict], str | None] | None,
) -> tuple[OutputState, int | None, bool]:
    """Read a results file: its state, where a row cut mid-write begins (None: none), and whether its complete
    last row lacks its newline. Refuses (OutputError) a line that is not a results row or fails `check`."""
    state = OutputState()
    seen: set[str] = set()
    cut_at: int | None = None
    add_newline = False
    offset = 0
    with path.open("rb") as handle:
        for line_no, line in enumerate(handle, 1):
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            parsed = _row(line)
            if not line.endswith(b"\n"):  # the last line, unfinished
                if parsed is not None:
                    add_newline = True
                elif line.startswith(row_prefix.encode()) and not _is_json(line):  # a row cut mid-write
                    cut_at = start
                    break
            if parsed is None:
                raise OutputError(
                    f"{what} {path} line {line_no} is not a results row: it is not a file this command "
                    "wrote, and was left untouched; name another file"
                )
            problem = check(parsed) if check is not None else None
            if problem is not None:
                raise OutputError(
                    f"{what} {path} line {line_no}: {problem}; a rerun would keep it as done: fix or delete the "
                    "line, or name another folder"
                )
            row, row_key = parsed, key(parsed)
            if row_key in seen:
                state.superseded += 1
            seen.add(row_key)
            if row.get("status") in FAILED_STATUSES:
                state.failed.add(row_key)
                state.finished.pop(row_key, None)
            else:
                state.failed.discard(row_key)
                state.finished[row_key] = crc(str(row.get("question", "")))
    return state, cut_at, add_newline


@dataclass
class RowsRead:
    """A results file read whole and left as it is: the last row of each key (its line, newline-ended, and the
    row), in the order the keys first appear, and how many earlier rows later ones superseded."""

    last: dict[Hashable, tuple[str, dict]] = field(default_factory=dict)
    superseded: int = 0


def read_rows(path: str | Path, what: str, key: Callable[[dict], Hashable] = row_id) -> RowsRead:
    """Read a results file that another step wrote (a shard's, for a merge) without changing a byte of it: every
    line must be a whole results row, so a row cut mid-write (the file of a run killed, or still being written)
    or a line that is not a row is refused with `OutputError`, naming the file and the line."""
    path = Path(path)
    read = RowsRead()
    try:
        with path.open("rb") as handle:
            for line_no, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                row = _row(line)
                if row is None:
                    torn = not line.endswith(b"\n") or not _is_json(line)
                    raise OutputError(
                        f"{what} {path} line {line_no} is "
                        + ("a torn row (cut mid-write)" if torn else "not a results row")
                        + ": it was left untouched; run the command that writes it again to finish it"
                    )
                row_key = key(row)
                read.superseded += row_key in read.last
                text = line.decode("utf-8")
                read.last[row_key] = (text if text.endswith("\n") else text + "\n", row)
    except OSError as exc:
        raise OutputError(f"cannot read {what} {path}: {_reason(exc)}") from None
    return read


def compact_output(path: str | Path, key: Callable[[dict], Hashable] = row_id) -> int:
    """Rewrite the output with the last row of each key only (atomically); returns the rows dropped."""
    path = Path(path)
    last: dict[Hashable, int] = {}
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle):
            if line.strip():
                last[key(json.loads(line))] = line_no
    dropped = 0
    keep = set(last.values())
    tmp = path.with_name(path.name + ".compacting")
    with path.open(encoding="utf-8") as src, open_new(tmp) as dst:
        for line_no, line in enumerate(src):
            if line_no in keep:
                dst.write(line)
            elif line.strip():
                dropped += 1
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, path)
    return dropped


def check_summary_path(path: str | Path, protected: Iterable[tuple[str, Path | None]] = ()) -> Path:
    """Refuse a summary path that is another file of the run, a folder, an unwritable place, or an existing file
    that is not a summary (a JSON object with `out`); nothing is written."""
    path = Path(path)
    _refuse_protected(path, "--summary", protected)
    if path.is_dir():
        raise OutputError(f"--summary {path} is a folder; name a file")
    if path.exists():
        try:
            existing = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            existing = None
        if not isinstance(existing, dict) or "out" not in existing:
            raise OutputError(
                f"--summary {path} exists and is not a summary this command wrote; name another file"
            )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"cannot write --summary {path}: its folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OutputError(f"cannot write --summary {path}: permission denied or read-only file system")
    return path


def write_text_file(path: str | Path, text: str, what: str) -> None:
    """Write `text` to `path`, atomically (a temporary file then a rename), or raise `OutputError`."""
    path = Path(path)
    try:
        write_whole(path, text)  # its temporary NAME.writing made anew, never through a link
    except OSError as exc:
        raise OutputError(f"cannot write {what} {path}: {_reason(exc)}") from None


# The tables LangGraph's SQLite checkpointer keeps; a database holding others is someone else's.
_CHECKPOINT_TABLES = {"checkpoints", "writes"}


def check_log_file(path: str | Path, protected: Iterable[tuple[str, Path | None]] = ()) -> Path:
    """Refuse a log path that is another file of the run or a folder; the log is appended to."""
    path = Path(path)
    _refuse_protected(path, "--log-file", protected)
    if path.is_dir():
        raise OutputError(f"--log-file {path} is a folder; name a file")
    check_folder_of(path, "--log-file")
    return path


def check_checkpoint(
    path: str | Path, protected: Iterable[tuple[str, Path | None]] = (), *, create: bool = True
) -> Path:
    """Refuse a checkpoint path that is another file of the run, a folder, a file that is not a SQLite database,
    or a database with tables other than the checkpointer's, before any episode runs (each episode would fail on
    it otherwise, or write into someone else's database). `create`: make the empty database now, so that an
    unwritable place fails at once."""
    path = Path(path)
    _refuse_protected(path, "--checkpoint", protected)
    if path.is_dir():
        raise OutputError(f"--checkpoint {path} is a folder; name a file")
    if path.exists() and path.stat().st_size > 0:
        try:
            connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                tables = {
                    name
                    for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                }
            finally:
                connection.close()
        except sqlite3.Error as exc:
            raise OutputError(
                f"--checkpoint {path} is not a SQLite database ({exc}); it was left untouched: name another file"
            ) from None
        foreign = sorted(tables - _CHECKPOINT_TABLES - {"sqlite_sequence"})
        if foreign:
            raise OutputError(
                f"--checkpoint {path} is a database with other tables ({', '.join(foreign[:5])}); it was left "
                "untouched: name another file"
            )
    elif create:
        try:  # create it now (an empty database), so that an unwritable place fails before any episode runs
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()  # an OSError says why (read-only, full) where SQLite only says it cannot open the file
            sqlite3.connect(path).close()
        except OSError as exc:
            raise OutputError(f"cannot write --checkpoint {path}: {_reason(exc)}") from None
        except sqlite3.Error as exc:
            raise OutputError(f"cannot write --checkpoint {path}: {exc}") from None
    return path
