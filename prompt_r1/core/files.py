"""Files the product makes beside its outputs (temporaries, lock files), opened without following links.

A stale `NAME.manifest.json.writing`, `NAME.jsonl.lock` or `.prompt-r1.lock` may be a symbolic link someone left in
a shared folder; opened the ordinary way, the run would truncate and overwrite the file it points to. So:

    with open_new(path.with_name(path.name + ".writing")) as handle:   # a fresh file: O_EXCL | O_NOFOLLOW
        handle.write(text)
    write_whole(path, text, what="--summary")        # a temporary made so, then renamed over `path`
    fd = open_lock(lock)                              # a lock file: O_NOFOLLOW, a regular file with one link

A temporary left over from a run that died is removed first (`unlink` removes a link itself, never its target),
then made anew with O_EXCL, so a link put there between the two is refused, not followed. A lock file that is a
link, not a regular file, or a hard link to another file is refused in one line (`OutputError`): it was not made
by prompt-r1, and truncating it to write the holder's pid would damage whatever it shares its data with.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from prompt_r1.core.errors import OutputError

__all__ = ["open_lock", "open_new", "write_whole"]

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def open_new(path: str | Path, *, encoding: str = "utf-8") -> Iterator[IO[str]]:
    """A text file made anew at `path` (a leftover there removed first), never through a link; OSError as `open`."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):  # a folder there: O_EXCL refuses it below
        os.unlink(path)
    fd = os.open(path, _NEW, 0o644)
    with os.fdopen(fd, "w", encoding=encoding) as handle:
        yield handle


def write_whole(path: str | Path, text: str, *, sync: bool = False) -> None:
    """Write `text` to `path` whole: a temporary `NAME.writing` made by `open_new`, then renamed over `path` (the
    rename replaces a link at `path` itself, never its target). OSError as `open`; the temporary is removed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".writing")
    try:
        with open_new(tmp) as handle:
            handle.write(text)
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            if tmp.is_symlink() or tmp.is_file():
                os.unlink(tmp)
        raise


def open_lock(path: str | Path, what: str) -> int:
    """A lock file's descriptor, made when missing, never through a link: a link, anything but a regular file,
    or a file with other hard links is one line (`OutputError` naming `what`). Other OSErrors as `os.open`."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError:
        if path.is_symlink():
            raise OutputError(
                f"cannot lock {what}: {path} is a symbolic link, which prompt-r1 never makes; remove it"
            ) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        kind = "has other hard links" if stat.S_ISREG(info.st_mode) else "is not a regular file"
        raise OutputError(f"cannot lock {what}: {path} {kind}, which prompt-r1 never makes; remove it")
    return fd
