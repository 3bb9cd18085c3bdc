"""One resumable results store: a JSONL file of one row per result, appended as results finish, read back on a rerun.

    store = ResultStore.open("results.jsonl", row_prefix='{"id": ', protected=[("input file", path)])
    match store.plan(key, question):  # "run", "done" or "conflict"
        ...
    with store.appending():
        store.write(row)

Used by `batch` (a row per id) and `eval` (a row per method, dataset and id). What it guarantees:
- **Nothing that is not ours is touched.** The path is checked before a byte is written (the input, a folder, a
  device, another program's file, an unwritable path are refused with an `OutputError`); only an unfinished last
  line that a killed run left is cut (prompt_r1.runs.output_files).
- **Finished stays finished, failed is retried.** A key whose last row has a failed status (prompt_r1.runs.episode's
  `FAILED_STATUSES`) is run again; its new row supersedes the old one, and the file is compacted to one row per
  key when the run ends (`close`).
- **One conflict rule.** A finished row whose question differs from the input's is kept, not rerun: which of the
  two to trust is the user's call. `plan` says "conflict", and `conflicts` lists the keys for the end-of-run
  report.
- **Keys never leave in a row.** Rows are written through the redaction module (the API keys in use, and any
  extra secrets given), one flushed line each: a process killed at any point loses only the row being written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TextIO

from prompt_r1.core.errors import OutputError
from prompt_r1.core.redaction import Redactor
from prompt_r1.runs.output_files import OutputState, compact_output, crc, open_results_file, row_id

__all__ = ["ResultStore"]

Plan = Literal["run", "done", "conflict"]


class ResultStore:
    """A results file opened for a run: what it holds, and the one place rows are appended (see the module)."""

    def __init__(
        self,
        path: Path,
        state: OutputState,
        *,
        key: Callable[[dict], Hashable] = row_id,
        redact: Redactor | None = None,
        what: str = "--out",
    ) -> None:
        self.path, self.state, self.key, self.what = path, state, key, what
        self.redact = redact or Redactor()
        self.conflicts: list[Hashable] = []  # finished keys kept although the input's question changed
        self.written = 0
        self._handle: TextIO | None = None

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        row_prefix: str,
        protected: Iterable[tuple[str, Path | None]] = (),
        what: str = "--out",
        key: Callable[[dict], Hashable] = row_id,
        redact: Redactor | None = None,
        check: Callable[[dict], str | None] | None = None,
    ) -> ResultStore:
        """Check `path` and read what it holds (see `open_results_file`); `row_prefix` is how this writer's rows
        begin (`{"id": ` for rows whose first key is the id), by which a row cut mid-write is known; `check(row)`:
        what makes a row unusable for this writer (refused, naming its line), or None."""
        path = Path(path)
        state = open_results_file(
            path, row_prefix=row_prefix, protected=protected, what=what, key=key, check=check
        )
        return cls(path, state, key=key, redact=redact, what=what)

    # ---- reading --------------------------------------------------------------------------------------------
    @property
    def finished(self) -> int:
        return len(self.state.finished)

    def is_finished(self, key: Hashable) -> bool:
        return key in self.state.finished

    def plan(self, key: Hashable, question: str) -> Plan:
        """What to do with an input: run it (new, or its last row failed), skip it (finished for this question),
        or keep the finished row of another question (a conflict, remembered in `conflicts`)."""
        recorded = self.state.finished.get(key)
        if recorded is None:
            return "run"
        if recorded != crc(question):
            self.conflicts.append(key)
            return "conflict"
        return "done"

    # ---- writing --------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def appending(self) -> Iterator[ResultStore]:
        """Open the file for appending; on the way out close it and compact superseded rows."""
        self._handle = self.path.open("a", encoding="utf-8")
        try:
            yield self
        finally:
            handle, self._handle = self._handle, None
            # Every row was flushed as it was written, so closing fails only where a write already failed (a
            # full disk), and that failure, naming the file, is the one to report.
            with contextlib.suppress(OSError):
                handle.close()
            if self.state.superseded:
                with contextlib.suppress(OSError):  # the file stands as written: a rerun compacts it
                    compact_output(self.path, self.key)

    def write(self, row: dict[str, Any]) -> None:
        """Append one row (redacted, one flushed line); `OutputError` when the disk refuses it. A row of a key
        that failed before supersedes that row."""
        if self._handle is None:
            raise RuntimeError("ResultStore.write outside `with store.appending()`")
        try:
            self._handle.write(self.redact.json_line(row))
            self._handle.flush()
        except OSError as exc:  # a full disk, a file system gone read-only: the rows written so far stand
            raise OutputError(f"cannot write {self.what} {self.path}: {exc.strerror or exc}") from None
        self.written += 1
        key = self.key(row)
        if key in self.state.failed:
            self.state.superseded += 1
