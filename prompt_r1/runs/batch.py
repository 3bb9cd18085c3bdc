"""Many episodes against rate-limited environments: the engine of `prompt-r1 batch`.

    settings = BatchSettings("questions.jsonl", "results.jsonl", concurrency=64)   # prompt_r1.runs.batch_settings
    summary = await run_batch(settings, agent=agent, environment=environment)

How it runs:
- **Independent episodes.** `settings.concurrency` workers each take the next question, run its whole episode through
  the graph and write its row; nothing waits for a slow or failing neighbour (no per-turn lockstep). The
  environment's process-wide limiter (requests per period, tokens per minute, requests in flight) is the only
  thing episodes share, so throughput is what the rate limit allows.
- **Streaming.** The input is read lazily (parquet by record batch, JSONL by line); each finished episode is
  appended to the output as one JSON line and flushed. Memory holds the ids seen, not the rows.
- **Nothing lost, nothing paid twice.** A rerun with the same output skips ids already finished and retries the
  failed ones (`environment_error`, `agent_error`, `internal_error`); a row written again supersedes the old
  one, and the file is compacted to one row per id when the run ends. A process killed at any point loses at
  most the episodes in flight. With `checkpoint=` (LangGraph's SQLite checkpointer, one thread per id) those too
  resume from their last completed step, and a failed episode resumes from the environment call that failed:
  turns already paid for are not called again. A finished episode's thread is deleted once its row is written.
  One run writes an output at a time: a second run on the same results file is refused before it reads a row
  (prompt_r1.runs.output_lock; the lock goes with the process, so a killed run leaves none). A call ledger beside
  the output (NAME.calls.sqlite, left by a `--ray` run killed or stopped mid-episode) is replayed: the calls it
  holds are answered from it, not paid for again (prompt_r1.runs.call_ledger).
- **Faults.** The environment client retries (429 with Retry-After, 5xx, timeouts, dropped connections,
  malformed bodies); an episode whose call still fails is written with status `environment_error` and the error,
  and the batch goes on (as it does, with status `internal_error`, for anything else one episode raises).
  `max_failures` stops the run after that many; `budget` stops starting episodes once the estimated cost
  reaches it; SIGINT/SIGTERM stop at once, cancelling the episodes in flight (the next run redoes them, or
  resumes them from the checkpoint). Every stop writes what finished and returns a summary.
- **Ids.** An input row's `id`, else `<dataset>-<row index>`. A repeated id is reported and not run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

from prompt_r1.agents.base import AgentBackend
from prompt_r1.clients.costs import PriceTable, UsageMeter
from prompt_r1.clients.response_cache import ResponseCache, render_summary, use_cache
from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig, rate_store_password
from prompt_r1.core.errors import DataError
from prompt_r1.core.redaction import RedactedStream, Redactor
from prompt_r1.core.urls import is_shared_store
from prompt_r1.data.datasets import Sample, iter_samples, resolve_source
from prompt_r1.runs.batch_plan import ROW_PREFIX
from prompt_r1.runs.batch_rows import episode_row, episode_work, failure_row
from prompt_r1.runs.batch_settings import BatchSettings
from prompt_r1.runs.call_ledger import LedgeredEnvironment, earlier_ledger, ledger_episode
from prompt_r1.runs.episode import FAILED_STATUSES, EpisodeRunner, as_environment
from prompt_r1.runs.metering import (
    MeteredAgent,
    MeteredEnvironment,
    budget_rule,
    check_budget_prices,
    episode_cost,
)
from prompt_r1.runs.output_files import check_checkpoint, crc
from prompt_r1.runs.output_lock import hold_output
from prompt_r1.runs.pool import RunTally, named_keys, run_many
from prompt_r1.runs.result_store import ResultStore
from prompt_r1.runs.shards import Shard
from prompt_r1.runs.shared_budget import (
    BudgetReached,
    SpendingEnvironment,
    add_agent_cost,
    shard_spend_key,
    shared_budget_rule,
)

__all__ = ["FAILED_STATUSES", "BatchSettings", "BatchSummary", "run_batch", "scan_input"]


@dataclass
class BatchSummary(RunTally):
    """What one `run_batch` call did: the pool's tally (written, skipped, duplicates, conflicts, cancelled,
    statuses, stopped) and batch's own figures. `usage` is this run's spending (calls, tokens, cost per model)."""

    out: str = ""
    input_rows: int | None = None
    resumed: int = 0  # episodes continued from a checkpoint instead of started over
    retries: int = 0
    fallbacks: int = 0
    usage: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] | None = None  # the response cache's use: hits (calls saved), stored, saved_usd
    ray: dict[str, Any] | None = (
        None  # a --ray run's own figures (actors, start-up, episodes retried, calls replayed)
    )

    @property
    def complete(self) -> bool:
        """Every input id has a finished row for its question: nothing failed, was cancelled, left unstarted, or
        kept from an earlier run for a different question."""
        return self.stopped is None and self.failed == 0 and self.cancelled == 0 and self.conflicts == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": self.out,
            "input_rows": self.input_rows,
            "written": self.written,
            "skipped": self.skipped,
            "duplicates": self.duplicates,
            "conflicts": self.conflicts,
            "conflict_ids": list(self.conflict_keys),
            "cancelled": self.cancelled,
            "resumed": self.resumed,
            "failed": self.failed,
            "statuses": dict(self.statuses),
            "seconds": round(self.seconds, 3),
            "episodes_per_second": round(self.written / self.seconds, 4) if self.seconds else None,
            "retries": self.retries,
            "fallbacks": self.fallbacks,
            "stopped": self.stopped,
            "input_error": self.input_error,
            "usage": self.usage,
            "cache": self.cache,
            **({"ray": self.ray} if self.ray is not None else {}),
        }

    def render(self) -> str:
        """The final summary table."""
        rate = self.written / self.seconds if self.seconds else 0.0
        lines = [
            ("output", self.out),
            (
                "episodes",
                f"{self.written} run · {self.skipped} already done"
                + (f" · {self.resumed} resumed from checkpoint" if self.resumed else "")
                + (f" · {self.cancelled} cancelled" if self.cancelled else "")
                + (f" · {self.duplicates} duplicate ids" if self.duplicates else "")
                + (f" · {self.conflicts} ids with a changed question" if self.conflicts else ""),
            ),
            *(
                [("changed", "ids kept for an earlier question: " + named_keys(self.conflict_keys))]
                if self.conflict_keys
                else []
            ),
            ("status", " · ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())) or "-"),
            ("time", f"{self.seconds:.1f} s · {rate:.2f} episodes/s"),
            (
                "retries",
                f"{self.retries} environment retries"
                + (f" · {self.fallbacks} fallbacks" if self.fallbacks else ""),
            ),
        ]
        if self.ray is not None:
            lines.append(("ray", ray_line(self.ray)))
        for entry in self.usage.get("models", []):
            cost = entry["cost_usd"]
            lines.append(
                (
                    f"{entry['role']}",
                    f"{entry['model']}: {entry['calls']} calls · {entry['input_tokens']:,} tokens in / "
                    f"{entry['output_tokens']:,} out · " + ("unpriced" if cost is None else f"${cost:.4f}"),
                )
            )
        if self.usage:
            unpriced = self.usage.get("unpriced_models") or []
            lines.append(
                (
                    "cost",
                    f"${self.usage.get('cost_usd', 0.0):.4f} estimated"
                    + (f" (no price for {', '.join(unpriced)}; see --prices)" if unpriced else ""),
                )
            )
        if self.cache is not None:
            lines.append(("cache", render_summary(self.cache)))
        if self.stopped:
            lines.append(("stopped", self.stopped))
        width = max(len(k) for k, _ in lines)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def ray_line(figures: dict[str, Any]) -> str:
    """A --ray run's figures, as the summary table shows them."""
    return (
        f"{figures['actors']} actors · started in {figures['start_seconds']:.1f} s · "
        f"{figures['retried_episodes']} episodes retried (actor lost) · {figures['replayed_calls']} paid calls "
        "replayed from the ledger"
    )


def scan_input(source: str | Path, limit: int | None = None, shard: Shard | None = None) -> int:
    """Read the input through once before anything runs: the number of rows (of `shard`'s, when given), or a
    `DataError` for a row that cannot be used or an id that repeats an earlier row's id with another question
    (which of the two to answer is the user's call), whichever shard holds it. An id repeated for the same
    question is only reported later, and run once."""
    questions: dict[str, tuple[int, int]] = {}  # id → (checksum of its question, row index)
    rows = mine = 0
    for sample in iter_samples(source, limit=limit, require_answers=False):
        rows += 1
        mine += shard is None or shard.contains(sample.id)
        checksum = crc(sample.question)
        earlier = questions.setdefault(sample.id, (checksum, sample.index))
        if earlier[0] != checksum:
            raise DataError(
                f"input row {sample.index}: id {sample.id!r} repeats row {earlier[1]} with another question; "
                "give each question its own id"
            )
    if rows == 0 and limit != 0:  # a run of nothing would end 'complete' with exit 0 and no word
        raise DataError(f"{resolve_source(source)[0]} has no rows: nothing to run")
    return mine


async def run_batch(
    settings: BatchSettings,
    *,
    agent: AgentBackend | None = None,
    environment: Any = None,
    agent_config: AgentConfig | None = None,
    environment_config: EnvironmentConfig | None = None,
    loop: LoopConfig | None = None,
    prices: PriceTable | None = None,
    log: TextIO | None = None,
    secrets: Sequence[str] = (),
    cache: ResponseCache | None = None,
    cache_always: bool = False,
    manifest: Callable[[], None] | None = None,
) -> BatchSummary:
    """Run the loop on every question of `settings.source` not yet finished in `settings.out`, appending one
    JSON row per episode. Returns the summary (also when stopped early).

    Before anything runs, the input is read through once (a bad row, or an id repeated for another question, stops
    it with a `DataError`), and the results file and the checkpoints are checked (`OutputError`: the input, a
    folder, a file that is not a results file or a SQLite database, an unwritable path) without being changed.

    Every API key the clients use (prompt_r1.core.redaction), and any `secrets` given, are cut out of everything
    written: rows, the summary, `log`. With `settings.shard`, only that shard's rows run (`limit` applies
    first). With `cache` (prompt_r1.clients.response_cache), calls answered before are replayed from it, not
    paid for; refused for an environment sampled above temperature 0 unless `cache_always`, and not with
    `settings.ray` (the actors build their own clients). `manifest` is called once the input and the results
    file are checked, before the first episode (`prompt-r1 batch` writes the manifest beside the results with it:
    prompt_r1.runs.manifest). With `settings.ray`, the episodes run in Ray actors that build their own players
    from `agent_config` and `environment_config` (prompt_r1.runs.ray_batch; `agent` and `environment` are not
    needed); the rest of the run is this one."""
    redact = Redactor(secrets)
    log = RedactedStream(log if log is not None else sys.stderr, redact)
    loop = loop or LoopConfig()
    prices = prices or PriceTable.load()

    if settings.ray is not None:
        if agent_config is None or environment_config is None:
            raise ValueError(
                "a Ray batch needs agent_config and environment_config: its actors build the players"
            )
        from prompt_r1.clients.environment import EnvironmentClient

        # Built here only to check prices and keys (no connection is opened); the actors build their own.
        environment = EnvironmentClient(environment_config)
        agent = SimpleNamespace(config=agent_config)
    environment = as_environment(environment)
    use_cache(environment, cache, always=cache_always)
    agent_config = getattr(agent, "config", None)
    agent_model = str(getattr(agent_config, "model", None) or "agent")
    if settings.budget is not None:
        check_budget_prices(prices, environment, agent)
    path, _ = resolve_source(settings.source)
    # One writer per results file (re-entered when `prompt-r1 batch` already holds it), held to the end: a second
    # run on it is refused here, before it reads a row or calls anything.
    with hold_output(settings.out, "--out" if settings.flags else "the output"):
        return await _run_batch(
            _BatchRun(
                settings=settings,
                agent=agent,
                environment=environment,
                environment_config=environment_config,
                loop=loop,
                prices=prices,
                log=log,
                redact=redact,
                input_path=path,
                agent_model=agent_model,
                cache=cache,
                manifest=manifest,
            )
        )


@dataclass(frozen=True)
class _BatchRun:
    """What `run_batch` hands its run once the results file is held: the settings, the players and what was
    resolved from them."""

    settings: BatchSettings
    agent: Any  # the agent backend; with Ray, a stand-in holding only its config (the actors load the agent)
    environment: Any  # the environment as the episodes call it (`as_environment`), its cache already in use
    environment_config: EnvironmentConfig | None  # what Ray's actors build their environment from
    loop: LoopConfig
    prices: PriceTable
    log: TextIO  # the run's log, keys cut out
    redact: Redactor  # cuts every key out of what is written
    input_path: Path  # the input file, resolved (refused as an output: the results file, a checkpoint)
    agent_model: str  # the agent's name in rows, prices and traces
    cache: ResponseCache | None = None  # its summary goes into the run's
    manifest: Callable[[], None] | None = None  # writes the manifest once the results file is checked


async def _run_batch(run: _BatchRun) -> BatchSummary:
    """`run_batch`'s run, with the results file held."""
    settings = run.settings
    source, out, checkpoint, limit = settings.source, settings.out, settings.checkpoint, settings.limit
    input_rows = scan_input(source, limit, settings.shard)
    samples = iter_samples(source, limit=limit, require_answers=False)
    if settings.shard is not None:
        samples = (s for s in samples if settings.shard.contains(s.id))
    meter = UsageMeter(run.prices)
    async with contextlib.AsyncExitStack() as stack:
        episodes = None
        if settings.ray is not None:  # joined (or started) before a file is touched: a refusal changes none
            from prompt_r1.runs.ray_batch import RayEpisodes

            episodes = stack.enter_context(
                RayEpisodes(settings.ray, episode_work, out=out, concurrency=settings.concurrency,
                            budget=settings.budget, agent_config=run.agent.config,
                            environment_config=run.environment_config, loop=run.loop, prices=run.prices,
                            meter=meter, options={"agent_model": run.agent_model, "tags": ("batch", "ray")})
            )  # fmt: skip
        # Without Ray, a --ray run's ledger (that run killed, or stopped by its budget mid-episode) answers the
        # calls it holds; opened before a file is touched, so one that is damaged is refused with nothing written.
        ledger = earlier_ledger(out) if episodes is None else None
        if ledger is not None:
            stack.callback(ledger.close)
        protected = [("input file", run.input_path), ("--checkpoint file", checkpoint)]
        if checkpoint is not None:  # checked first, created last: a refusal leaves no file behind
            check_checkpoint(checkpoint, [("input file", run.input_path), ("--out file", out)], create=False)
        store = ResultStore.open(out, row_prefix=ROW_PREFIX, protected=protected, redact=run.redact)
        if checkpoint is not None:
            check_checkpoint(checkpoint, [("input file", run.input_path), ("--out file", out)])
        if run.manifest is not None:
            run.manifest()
        summary = BatchSummary(out=str(out), input_rows=input_rows)
        if episodes is not None:
            work, after_write, stop = episodes.work, episodes.after_write, episodes.stop_rule()
        else:
            metered_env = MeteredEnvironment(run.environment, meter, run.redact)
            metered_agent = MeteredAgent(run.agent, meter, run.agent_model, run.redact)
            spend = await _shard_spend(stack, settings, run.environment, run.input_path)
            if spend is not None:  # the shards' one budget: checked before each call, counted in the store
                metered_env = SpendingEnvironment(metered_env, run.prices, spend, settings.budget)
            # Outermost: a call replayed from the ledger is neither sent, metered nor counted in the store.
            if ledger is not None:
                metered_env = LedgeredEnvironment(metered_env, ledger.answer)
            work, after_write = await _local_episodes(
                stack,
                settings,
                metered_agent,
                metered_env,
                run.loop,
                run.prices,
                run.agent_model,
                summary,
                spend,
                ledger,
            )
            stop = (
                budget_rule(meter, settings.budget)
                if spend is None
                else shared_budget_rule(spend, settings.budget)
            )

        # The bar starts once the players are up (a Ray start takes seconds), so its rate is the episodes'.
        bar = None
        if settings.progress:
            from tqdm.auto import tqdm

            total = None if input_rows is None else max(0, input_rows - store.finished)
            bar = tqdm(total=total, desc="batch", unit="episode", dynamic_ncols=True, file=run.log)

        def retries() -> int:  # with Ray, the actors' clients retried: counted from the rows they made
            return episodes.retries if episodes is not None else getattr(run.environment, "retries", 0)

        def postfix(row: dict[str, Any], in_flight: int) -> None:
            if bar is not None:
                bar.set_postfix_str(
                    f"failed {summary.failed} · retries {retries()} · in flight {in_flight} · "
                    f"${meter.cost:.4f}",
                    refresh=False,
                )

        try:
            await run_many(
                samples,
                work,
                store,
                failure_row=failure_row,
                concurrency=settings.concurrency,
                max_failures=settings.max_failures,
                stop=stop,
                after_write=after_write,
                on_row=postfix,
                tally=summary,
                progress=bar,
                log=run.log,
            )
        finally:
            if bar is not None:
                bar.close()
            summary.retries = retries()
            summary.fallbacks = getattr(run.environment, "fallbacks", 0)
            summary.usage = meter.to_dict()
            summary.cache = None if run.cache is None else run.cache.summary(run.prices)
            if episodes is not None:
                summary.ray = episodes.figures()
            summary.stopped = run.redact(summary.stopped)
            summary.input_error = run.redact(summary.input_error)
    return summary


async def _shard_spend(stack, settings, environment, source):
    """The run's spending in the shared store, for a `--shard` run with a budget and a shared store (every shard
    of the run counts under one key, prompt_r1.runs.shared_budget); else None (this process's meter is the
    budget's)."""
    config = getattr(environment, "config", None)
    url = getattr(config, "rate_store", None)
    if settings.shard is None or settings.budget is None or not is_shared_store(url):
        return None
    from prompt_r1.clients.shared_spend import SharedSpend

    key = shard_spend_key(source, settings.out, settings.shard.count)
    spend = SharedSpend.connect(url, key, rate_store_password(url))
    stack.push_async_callback(spend.close)
    await (
        spend.total()
    )  # what the other shards (and earlier runs of this one) spent: a spent budget stops at once
    return spend


async def _local_episodes(
    stack, settings, agent, environment, loop, prices, agent_model, summary, spend=None, ledger=None
):
    """This process's episode runner (with LangGraph's checkpoints where asked): the pool's `work` and
    `after_write`. With `spend` (the shards' one budget), an episode the budget stops mid-way leaves no row (the
    next run does it), and a served agent's tokens are counted in the store with each row. With `ledger` (an
    earlier run's, answering `environment`'s calls), each episode is its id in it, and a finished row's calls
    leave it."""
    checkpointer = None
    if settings.checkpoint is not None:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        checkpointer = await stack.enter_async_context(
            AsyncSqliteSaver.from_conn_string(str(settings.checkpoint))
        )
    runner = EpisodeRunner(
        agent,
        environment,
        loop,
        checkpointer=checkpointer,
        price=lambda state: episode_cost(state, prices, agent_model),
        tags=["batch"],
    )

    agent_paid = getattr(getattr(agent, "config", None), "resolved_backend", None) == "served"

    async def work(sample: Sample) -> dict[str, Any]:
        try:
            with ledger_episode(str(sample.id)):
                row, resumed = await episode_row(runner, sample)
        except BudgetReached:
            raise asyncio.CancelledError from None  # no row: the pool stops on the budget's reason
        summary.resumed += resumed
        if spend is not None and agent_paid:
            await add_agent_cost(spend, prices, agent_model, row)
        return row

    async def forget_finished(sample: Sample, row: dict[str, Any]) -> None:
        if row["status"] not in FAILED_STATUSES:
            await runner.forget(sample.id)
            if ledger is not None:
                ledger.forget(str(sample.id))

    return work, forget_finished
