"""Which input rows a batch run will run, skip as done, skip as repeated, or keep for an earlier question, read
without writing anything: what `prompt-r1 batch --dry-run` counts, decided as the run's pool decides it.

    plan = plan_rows(settings)         # settings: prompt_r1.runs.batch_settings.BatchSettings
    plan.to_run                        # the samples the run would start, in input order
    plan.counts()                      # {"to_run": …, "already_done": …, "duplicates": …, "conflicts": …}

The run (prompt_r1.runs.batch) takes the input's first `--limit` rows, keeps its `--shard`'s, and then, row by
row (prompt_r1.runs.pool): an id seen earlier in this input is a duplicate (not run); an id the results file holds
finished for the same question is done; one finished for another question is a conflict (kept, not rerun);
anything else (new, or its last row failed) runs. The results file is read as the run reads it
(`peek_results_file`): a file the run would refuse is refused here in the same words, and a row cut mid-write
counts as not there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prompt_r1.data.datasets import Sample, iter_samples, resolve_source
from prompt_r1.runs.output_files import crc, peek_results_file
from prompt_r1.runs.shards import Shard

__all__ = ["ROW_PREFIX", "RowPlan", "plan_rows"]

ROW_PREFIX = '{"id": '  # how every batch row begins (json.dumps of a dict whose first key is id): a cut one is known by it


@dataclass
class RowPlan:
    """What a batch run would do with each input row (see the module)."""

    to_run: list[Sample] = field(default_factory=list)
    already_done: int = 0
    duplicates: int = 0
    conflicts: int = 0
    finished_rows: int = 0  # rows finished in the results file, whether or not this run's input names them

    def counts(self) -> dict[str, int]:
        """The counts by the names of the run's summary (written, skipped, duplicates, conflicts)."""
        return {
            "to_run": len(self.to_run),
            "already_done": self.already_done,
            "duplicates": self.duplicates,
            "conflicts": self.conflicts,
        }


def plan_rows(
    source: str | Path,
    out: str | Path,
    *,
    limit: int | None = None,
    shard: Shard | None = None,
    checkpoint: str | Path | None = None,
) -> RowPlan:
    """The run's decision for each of the input's rows (its first `limit`, `shard`'s), against `out` as it is."""
    input_path = resolve_source(source)[0]
    protected = [("input file", input_path), ("--checkpoint file", Path(checkpoint) if checkpoint else None)]
    state = peek_results_file(out, row_prefix=ROW_PREFIX, protected=protected)
    plan = RowPlan(finished_rows=len(state.finished))
    seen: set[str] = set()
    for sample in iter_samples(source, limit=limit, require_answers=False):
        if shard is not None and not shard.contains(sample.id):
            continue
        if sample.id in seen:
            plan.duplicates += 1
            continue
        seen.add(sample.id)
        recorded = state.finished.get(sample.id)
        if recorded is None:
            plan.to_run.append(sample)
        elif recorded != crc(sample.question):
            plan.conflicts += 1
        else:
            plan.already_done += 1
    return plan
