"""What one batch run is asked to do, as one typed object built once at the surface's edge.

    settings = BatchSettings("questions.jsonl", "results.jsonl", concurrency=64, budget=5.0)
    settings.check_files()       # every file the run reads or writes, checked, none changed
    summary = await run_batch(settings, agent=agent, environment=environment)

`prompt-r1 batch` builds it from its flags, a Python caller from its arguments; below the surface nothing reads
a flag again. Numbers are checked when it is built (one rule for every number, `prompt_r1.core.checks`), so a
`BatchSettings` that exists is one a run can keep; the agent's, the environment's and the loop's settings are
their own typed configs (`prompt_r1.core.config`), built at the same edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prompt_r1.core.checks import number
from prompt_r1.core.errors import ConfigError
from prompt_r1.data.datasets import resolve_source
from prompt_r1.runs.call_ledger import ledger_path_for
from prompt_r1.runs.manifest import manifest_path
from prompt_r1.runs.output_files import check_folder_of, check_log_file, check_summary_path
from prompt_r1.runs.pool import check_limits
from prompt_r1.runs.ray_settings import RaySettings
from prompt_r1.runs.shards import Shard

__all__ = ["BatchSettings"]


@dataclass(frozen=True)
class BatchSettings:
    """One batch run: the input, where its rows, summary and checkpoints go, and the rules it runs by.

    source: a bundled set's name or a parquet/JSONL/JSON file of questions. out: the results file (.jsonl),
    appended to. summary: where the summary JSON goes (default: beside `out`, as NAME.summary.json).
    checkpoint: LangGraph's SQLite checkpoints, so that interrupted and failed episodes resume mid-episode.
    log_file: debug logs of every HTTP request and retry, keys redacted. concurrency: episodes in flight.
    max_failures: stop after this many failed episodes. budget: stop starting episodes once this run's estimated
    cost reaches it (US $). limit: only the first rows of the input. progress: a progress bar on stderr.
    shard: run only this shard's rows (`prompt-r1 batch --shard I/N`, prompt_r1.runs.shards); `out` is then that
    shard's own results file (`Shard.path`).
    ray: run the episodes in Ray actors (`prompt-r1 batch --ray`, prompt_r1.runs.ray_batch); everything else holds.
    flags: name settings in errors as the command line does (`--max-failures`), for the CLI.
    """

    source: str | Path
    out: Path
    concurrency: int = 32
    checkpoint: Path | None = None
    max_failures: int | None = None
    budget: float | None = None
    limit: int | None = None
    summary: Path | None = None
    log_file: Path | None = None
    progress: bool = True
    shard: Shard | None = None
    ray: RaySettings | None = None
    flags: bool = False

    def __post_init__(self) -> None:
        check_limits(self.concurrency, self.max_failures, self.budget, flags=self.flags)
        number(self.limit, "--limit" if self.flags else "limit", integer=True, minimum=1, none_ok=True)
        if self.ray is not None and self.shard is not None:
            raise ConfigError(
                "--ray and --shard are two ways to spread one run: give one (--ray runs every shard's rows itself)"
                if self.flags
                else "ray and shard are two ways to spread one run: give one"
            )
        if self.ray is not None and self.checkpoint is not None:  # the call ledger keeps "no call paid twice"
            raise ConfigError(
                "--checkpoint is not supported with --ray: its call ledger (NAME.calls.sqlite beside --out) keeps "
                "an interrupted episode's paid calls; drop --checkpoint"
                if self.flags
                else "checkpoint is not supported with ray: drop it (the call ledger keeps the paid calls)"
            )
        out = Path(self.out)
        if out.suffix != ".jsonl":
            raise ConfigError(f"{'--out' if self.flags else 'the output'} must be a .jsonl file, got {out}")
        set_ = object.__setattr__  # frozen: the paths are normalised once, here
        set_(self, "out", out)
        set_(
            self, "summary", Path(self.summary) if self.summary else out.with_name(out.stem + ".summary.json")
        )
        for name in ("checkpoint", "log_file"):
            value = getattr(self, name)
            set_(self, name, Path(value) if value else None)

    def own_files(self) -> list[tuple[str, Path | None]]:
        """(what, path) of every file the run reads or makes: the input, the results and their lock, the
        checkpoints, the manifest, the call ledger, the summary and the log. An --env-cache naming one of them is
        refused before anything is made (it would be written over, or hold a database where they expect text)."""
        from prompt_r1.runs.output_lock import lock_path

        return [("input file", resolve_source(self.source)[0]), ("--out file", self.out),
                ("--out file's lock", lock_path(self.out)), ("--checkpoint file", self.checkpoint),
                ("manifest", manifest_path(results_file=self.out)), ("call ledger", ledger_path_for(self.out)),
                ("--summary file", self.summary), ("--log-file", self.log_file)]  # fmt: skip

    def check_files(self) -> Path:
        """Check, without changing any, every file the run will read or write, before a model is loaded or an
        endpoint contacted: the input exists (or names a bundled set), and the summary and log are not the
        input, the results, the checkpoints or each other, nor a folder or a foreign file. The results file and
        the checkpoints are checked again by `run_batch`, against their contents. Returns the input's path."""
        source = resolve_source(self.source)[0]
        check_folder_of(self.out, "--out")
        # The files the run makes beside --out too: a summary or log written over the manifest would block every
        # rerun (it no longer parses as one), over the call ledger would lose what was paid.
        run_files = [("input file", source), ("--out file", self.out), ("--checkpoint file", self.checkpoint),
                     ("manifest", manifest_path(results_file=self.out)), ("call ledger", ledger_path_for(self.out))]  # fmt: skip
        check_summary_path(self.summary, run_files)
        if self.log_file is not None:
            check_log_file(self.log_file, [*run_files, ("--summary file", self.summary)])
        return source
