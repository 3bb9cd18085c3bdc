"""One batch input split across N machines or processes (`prompt-r1 batch --shard I/N`), and the shards'
results merged back into one file (`prompt-r1 batch-merge`).

A row belongs to shard `1 + blake2b(id) mod N`: stable across machines, Python versions and runs (not Python's
salted `hash`), and independent of row order, so every machine given the same input and N picks a disjoint
part and together they cover every row once. Each shard writes its own results file beside `--out`
(`results.shard-2-of-4.jsonl`), resumes by itself (rerun the same command), and all of them may share one
provider limit through `--env-rate-store`. The merge checks every shard file against the input, and reads it
without changing it: a shard that is still being written, holds a torn row, or was made from another input or
another N is refused, naming the file, what is wrong and the ids. The merged file gets a manifest of its own
(`NAME.manifest.json`), made from the shards' manifests, so a later `batch` on it compares its settings with
those that made the rows, as on any results file.

    shard = Shard.parse("2/4")
    shard.path("results.jsonl")         # results.shard-2-of-4.jsonl
    merge_shards("results.jsonl", 4, source="questions.jsonl")   # results.jsonl: every shard's rows, one per id
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from prompt_r1.core.errors import ConfigError, OutputError
from prompt_r1.core.files import open_new
from prompt_r1.data.datasets import iter_samples, resolve_source
from prompt_r1.runs.manifest import (
    build_manifest,
    changed_settings,
    manifest_path,
    read_manifest,
    write_manifest,
)
from prompt_r1.runs.output_files import FAILED_STATUSES, crc, read_rows
from prompt_r1.runs.output_lock import hold_output

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


def _some(ids: list[str]) -> str:
    """A few ids, for a one-line message.

    >>> _some(["a", "b", "c", "d", "e", "f", "g"])
    "'a', 'b', 'c', 'd', 'e', … (7)"
    """
    shown = ", ".join(repr(i) for i in ids[:5])
    return shown + (f", … ({len(ids)})" if len(ids) > 5 else "")


def _mismatch(shard: Shard, rows: dict, questions: dict[str, int]) -> dict[str, str]:
    """What does not match between a shard's rows and its part of the input: ids the input lacks, ids of another
    shard (the shards were made with another N), ids answered for another question, and its ids with no row."""
    foreign, elsewhere, changed = [], [], []
    for key, (_, row) in rows.items():
        if key not in questions:
            foreign.append(key)
        elif not shard.contains(key):
            elsewhere.append(key)
        elif crc(str(row.get("question", ""))) != questions[key]:
            changed.append(key)
    missing = [key for key in questions if shard.contains(key) and key not in rows]
    return {
        kind: f"{len(ids)} {what} ({_some(ids)})"
        for kind, ids, what in (
            ("foreign", foreign, "ids not in the input"),
            ("elsewhere", elsewhere, "ids of other shards"),
            ("changed", changed, "ids answered for another question"),
            ("missing", missing, "of its ids missing"),
        )
        if ids
    }


# What a merged file's manifest says of settings no shard manifest recorded (shards made before manifests, or
# whose manifest was moved away): a later batch on the merged file differs from it, and is refused as for any
# other setting unless allowed (--allow-changed-settings).
UNKNOWN = "unknown: a shard file had no manifest"


def _merged_manifest(out: Path, shards: list[Shard], source: str | Path) -> dict:
    """The manifest of the merged file: the shards' common settings (shard: null), or the refusal naming the
    settings two shards differ by. A shard file without a manifest leaves the merged file's agent, environment
    and loop unknown (UNKNOWN), never the settings of another shard."""
    manifests = [(shard, read_manifest(manifest_path(results_file=shard.path(out)))) for shard in shards]
    known = [(shard, m) for shard, m in manifests if m is not None]
    measured: dict = {"input": str(resolve_source(source)[0].resolve()), "shard": None}
    if len(known) < len(manifests):
        measured.update(agent=UNKNOWN, environment=UNKNOWN, loop=UNKNOWN)
    elif known:
        first_shard, first = known[0]
        measured = {**first["settings"]["measured"], **measured}
        for shard, m in known[1:]:
            differ = changed_settings({**first["settings"]["measured"], "shard": None},
                                      {**m["settings"]["measured"], "shard": None})  # fmt: skip
            if differ:
                raise OutputError(
                    f"shards {first_shard} and {shard} of {out} were made with other settings "
                    f"({'; '.join(differ)}): their rows cannot share one manifest; rerun shard {shard} with the "
                    f"settings of shard {first_shard}"
                )
    first_manifest = known[0][1] if known else {}
    operational = {
        "shards": len(shards),
        "without_manifest": [str(shard.path(out)) for shard, m in manifests if m is None],
    }
    manifest = build_manifest("batch-merge", measured, operational, seeds=first_manifest.get("seeds"))
    manifest["prices"] = first_manifest.get("prices")
    # The merged file's history: each shard's runs, then this merge (write_manifest adds it).
    manifest["runs"] = [
        {**run, "shard": str(shard)}
        for shard, m in known
        for run in (m.get("runs") or [])
        if isinstance(run, dict)
    ]
    return manifest


def merge_shards(
    out: str | Path, count: int, *, source: str | Path, limit: int | None = None
) -> MergeSummary:
    """Write `out` with the last row of each id from the `count` shard files beside it, checked against the input
    they were run on (`source`, its first `limit` rows): each shard must hold a whole row for every id of its part
    of the input and nothing else. A shard file that is missing, still being written (its lock is held), holds a
    torn row, or does not match the input (ids the input lacks, ids of another shard, another question, or its
    ids missing) is refused, naming the file, what is wrong and the ids; shard files are only read, and `out`,
    which must not exist, is written only when every check passed. The merged file is a results file like any
    other, with its manifest (NAME.manifest.json, from the shards'): `prompt-r1 batch` on it resumes with the
    shards' settings and is refused with others."""
    out = Path(out)
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigError(f"--shards must be between 1 and {MAX_SHARDS}, got {count}")
    if out.exists():
        raise OutputError(f"{out} exists: batch-merge writes a new file; name another --out or move it away")
    shards = [Shard(i, count) for i in range(1, count + 1)]
    missing = [str(shard.path(out)) for shard in shards if not shard.path(out).is_file()]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise OutputError(
            f"missing shard files ({len(missing)} of {count}): {', '.join(missing[:3])}{more}; run those shards first"
        )
    questions = {
        str(sample.id): crc(sample.question)
        for sample in iter_samples(source, limit=limit, require_answers=False)
    }
    summary = MergeSummary()
    with contextlib.ExitStack() as held:
        held.enter_context(hold_output(out, "--out"))
        for shard in shards:  # a shard still being written is refused, and none starts while they are read
            held.enter_context(hold_output(shard.path(out), "shard file"))
        parts: list[dict] = []
        for shard in shards:
            path = shard.path(out)
            read = read_rows(path, "shard file")
            wrong = _mismatch(shard, read.last, questions)
            rerun = f"`prompt-r1 batch {source} --out {out} --shard {shard}`"
            if set(wrong) == {"missing"}:  # a shard stopped early (a budget, a signal): finish it
                raise OutputError(
                    f"shard file {path} (shard {shard}) is not finished: {wrong['missing']}; run {rerun} again, "
                    "then merge"
                )
            if wrong:
                what = "; ".join(wrong.values())
                raise OutputError(
                    f"shard file {path} (shard {shard}) does not match the input {source}: {what}; "
                    f"was it made from another input or another N? Rerun {rerun}, or merge against the input "
                    "it was made from"
                )
            summary.superseded += read.superseded
            parts.append(read.last)
        manifest = _merged_manifest(out, shards, source)
        tmp = out.with_name(out.name + ".merging")
        try:
            with open_new(tmp) as dst:  # never through a link left at NAME.merging
                for rows in parts:
                    for line, row in rows.values():
                        dst.write(line)
                        summary.rows += 1
                        summary.failed += row.get("status") in FAILED_STATUSES
                dst.flush()
                os.fsync(dst.fileno())
            # The manifest first: a merge stopped between the two leaves no results file without its manifest
            # (a manifest without its file is replaced by the next merge).
            write_manifest(manifest_path(results_file=out), manifest, manifest)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return summary
