"""One writer per output: an OS lock held for the whole run on what a run writes (a results file, an eval folder, a
training output folder).

Two runs writing one output would each pay for the same ids and interleave their rows, so the second is refused in
one line naming the output and the holder (`OutputError`, exit 2) before it reads a row or calls anything. The
lock is `flock` on a lock file: the kernel releases it when the holder's process ends, however it ends (SIGKILL, a
lost terminal), so a writer that died never leaves the output locked. The lock file holds the holder's pid and host
for the message only; it is never trusted as the lock.

    with hold_output("results.jsonl", "--out"):            # the lock file results.jsonl.lock, beside it
        ...
    with hold_output("eval-results", "--out", folder=True):  # the lock file eval-results/.prompt-r1.lock

A file's lock file sits beside it (`NAME.lock`), a folder's inside it (`.prompt-r1.lock`); either is removed when
the run ends, as are the folders made for it that the run left empty. The lock belongs to the real output, not to
the path's spelling: the output's links are resolved first, so `--out link.jsonl` (a symbolic link to
`results.jsonl`) takes the lock of `results.jsonl`. The lock file itself is opened without following links
(`core.files.open_lock`): one that is a link, or a hard link to another file, is refused in one line. Within one process the lock is re-entrant (the command takes it before its checks, the engine it
calls takes it again), so only other processes are refused. Shards write their own files, so each shard locks its
own file and shards of one input run side by side. On NFS, Linux maps `flock` to a lock the server keeps.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from prompt_r1.core.errors import OutputError
from prompt_r1.core.files import open_lock

__all__ = ["FOLDER_LOCK", "hold_output", "lock_path"]

FOLDER_LOCK = ".prompt-r1.lock"

# lock file → [file descriptor, holds, folders created for it] for the locks this process holds.
_held: dict[str, list] = {}
_guard = threading.Lock()


def lock_path(output: str | Path, *, folder: bool = False) -> Path:
    """The lock file of `output`.

    >>> str(lock_path("runs/results.jsonl")), str(lock_path("runs/eval", folder=True))
    ('runs/results.jsonl.lock', 'runs/eval/.prompt-r1.lock')
    """
    output = Path(output)
    return output / FOLDER_LOCK if folder else output.with_name(output.name + ".lock")


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it (it may not have written it yet)."""
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text.splitlines()[0] if text else "another process"


def _acquire(path: Path, output: Path, what: str) -> int:
    while True:
        try:
            fd = open_lock(path, f"{what} {output}")
        except OSError as exc:
            raise OutputError(f"cannot lock {what} {output}: {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputError(
                f"{what} {output} is being written by another run ({holder}, lock {path}): wait for it to end, "
                "or name another output"
            ) from None
        except OSError as exc:  # a file system without locks: one writer cannot be made sure of
            os.close(fd)
            raise OutputError(f"cannot lock {what} {output}: {path}: {exc.strerror or exc}") from None
        # The holder before us removes the file as it ends: a lock on a file no longer at `path` guards nothing.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd


@contextlib.contextmanager
def hold_output(output: str | Path, what: str, *, folder: bool = False) -> Iterator[Path]:
    """Hold the lock of `output` (a file, or with `folder` a folder, created if missing) until the block ends, or
    raise `OutputError` naming the output and the holder when another process holds it. `what`: how the message
    names the output (`--out`, `output_dir`). Yields the lock file's path."""
    output = Path(output)
    with _guard:
        made = _make_folders(output if folder else output.parent, output, what)
        # The real output, its links resolved (a dangling one to where it points): one lock for every spelling.
        path = lock_path(Path(os.path.realpath(output)), folder=folder)
        key = str(path)
        entry = _held.get(key)
        if entry is None:
            try:
                entry = _held[key] = [_acquire(path, output, what), 0, made]
            except OutputError:
                _remove_empty(made)
                raise
        entry[1] += 1
    try:
        yield path
    finally:
        with _guard:
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                # Removed while still locked, so that no one locks the file we are about to let go of.
                with contextlib.suppress(OSError):
                    os.unlink(path)
                os.close(entry[0])
                _remove_empty(entry[2])


def _make_folders(folder: Path, output: Path, what: str) -> list[Path]:
    """Create `folder` and its missing parents; the ones created, deepest first (a run refused later, or one
    that wrote nothing, leaves no empty folder behind)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot write {what} {output}: {exc.strerror or exc}") from None
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty: the run wrote there
            return
