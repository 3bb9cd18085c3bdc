"""One batch input split across N machines or processes (`prompt-r1 batch --shard I/N`), and the shards'
results merged back into one file (`prompt-r1 batch-merge`).

A row belongs to shard `1 + blake2b(id) mod N`: stable across machines, Python versions and runs (not Python's
salted `hash`), and independent of row order, so every machine given the same input and N picks a disjoint
part and together they cover every row once. Each shard writes its own results file beside `--out`
(`results.shard-2-of-4.jsonl`), resumes by itself (rerun the same command), and all of them may share one
provider limit through `--env-rate-store`.

    shard = Shard.parse("2/4")
    shard.path("results.jsonl")         # results.shard-2-of-4.jsonl
    merge_shards("results.jsonl", 4)   # results.jsonl: every shard's rows, one per id
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from prompt_r1.core.errors import ConfigError, OutputError
from prompt_r1.runs.results_file import FAILED_STATUSES, open_results_file, row_id

__all__ = ["MAX_SHARDS", "MergeSummary", "Shard", "merge_shards"]

# The most shards an input is split into: far more machines than a provider limit feeds, and few enough that
# merging names its files at once (a typo of 10^9 would otherwise build a billion paths before finding none).
MAX_SHARDS = 1000


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1 to `count`) of an input."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`I/N` as the flag gives it.

        >>> Shard.parse("2/4")
        Shard(index=2, count=4)
        """
        parts = str(text).split("/")
        try:
            index, count = (int(p) for p in parts)
        except ValueError:
            raise ConfigError(f"--shard must be I/N such as 2/4 (shard 2 of 4), got {text!r}") from None
        if not 1 <= count <= MAX_SHARDS or not 1 <= index <= count:
            raise ConfigError(f"--shard {text}: I must be between 1 and N, and N between 1 and {MAX_SHARDS}")
        return cls(index, count)

    def contains(self, row_id: str) -> bool:
        """Whether the row with this id is this shard's.

        >>> sum(Shard(i, 3).contains("row-7") for i in (1, 2, 3))
        1
        """
        digest = hashlib.blake2b(str(row_id).encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.count == self.index - 1

    def path(self, out: str | Path) -> Path:
        """This shard's results file beside `out`."""
        out = Path(out)
        return out.with_name(f"{out.stem}.shard-{self.index}-of-{self.count}{out.suffix}")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass
class MergeSummary:
    rows: int = 0
    failed: int = (
        0  # rows whose last status is a failure: rerun their shard (or the merged file) to retry them
    )
    superseded: int = 0  # earlier rows of an id that a later row of its shard replaced

    def render(self) -> str:
        return f"{self.rows} rows ({self.failed} failed), {self.superseded} superseded rows dropped"


def merge_shards(out: str | Path, count: int) -> MergeSummary:
    """Write `out` with the last row of each id from the `count` shard files beside it (each must exist; an id
    found in two shards means they were not made from one input and N, and is refused). `out` must not exist:
    nothing is overwritten. The merged file is a results file like any other: `prompt-r1 batch` on it resumes."""
    out = Path(out)
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigError(f"--shards must be between 1 and {MAX_SHARDS}, got {count}")
    if out.exists():
        raise OutputError(f"{out} exists: batch-merge writes a new file; name another --out or move it away")
    paths = [Shard(i, count).path(out) for i in range(1, count + 1)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise OutputError(
            f"missing shard files ({len(missing)} of {count}): {', '.join(missing[:3])}{more}; run those shards first"
        )
    summary = MergeSummary()
    owner: dict[str, Path] = {}
    tmp = out.with_name(out.name + ".merging")
    try:
        with tmp.open("w", encoding="utf-8") as dst:
            for path in paths:
                state = open_results_file(path, row_prefix='{"id": ', what="shard file")
                summary.superseded += state.superseded
                last: dict[str, str] = {}
                with path.open(encoding="utf-8") as src:
                    for line in src:
                        if line.strip():
                            last[row_id(json.loads(line))] = line if line.endswith("\n") else line + "\n"
                for key, line in last.items():
                    if key in owner:
                        raise OutputError(
                            f"id {key!r} is in both {owner[key]} and {path}: these shards were not made from "
                            "one input with one N"
                        )
                    owner[key] = path
                    dst.write(line)
                    summary.rows += 1
                    summary.failed += json.loads(line).get("status") in FAILED_STATUSES
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return summary
