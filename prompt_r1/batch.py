"""Many episodes against rate-limited environments: the engine of `prompt-r1 batch`.

    summary = await run_batch("questions.jsonl", "results.jsonl", agent=agent, environment=environment)

How it runs:
- **Independent episodes.** `concurrency` workers each take the next question, run its whole episode through
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
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from prompt_r1.agents.base import AgentBackend, AgentOutput, AgentRequest
from prompt_r1.config import LoopConfig
from prompt_r1.costs import PriceTable, UsageMeter
from prompt_r1.data import Sample, iter_samples, resolve_source
from prompt_r1.environment import EnvironmentClient, EnvironmentReply
from prompt_r1.errors import AgentError, ConfigError, DataError, OutputError
from prompt_r1.graph import trajectory_of
from prompt_r1.redaction import RedactedStream, Redactor
from prompt_r1.results_file import (
    FAILED_STATUSES,
    OutputState,
    check_checkpoint,
    compact_output,
    crc,
    open_results_file,
)

__all__ = ["FAILED_STATUSES", "BatchSummary", "run_batch", "scan_input"]

_MAX_REPORTED = 10  # duplicate or conflicting ids named one by one on stderr; the rest are counted
_ROW_PREFIX = (
    '{"id": '  # how every row this module writes begins (json.dumps of a dict whose first key is id)
)


@dataclass
class BatchSummary:
    """What one `run_batch` call did. `usage` is this run's spending (calls, tokens and cost per model)."""

    out: str
    input_rows: int | None = None
    written: int = 0  # rows written by this run
    skipped: int = 0  # ids finished by an earlier run
    duplicates: int = 0  # input rows whose id repeats an earlier row (not run)
    conflicts: int = 0  # ids finished earlier for a different question (kept, not rerun)
    cancelled: int = 0  # episodes in flight when the run stopped (rerun them, or resume from the checkpoint)
    resumed: int = 0  # episodes continued from a checkpoint instead of started over
    statuses: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    retries: int = 0
    fallbacks: int = 0
    stopped: str | None = None  # None: the input was exhausted; else why the run stopped early
    input_error: str | None = None  # a row of the input that could not be read stopped the run
    usage: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(self.statuses[s] for s in FAILED_STATUSES)

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
            ("status", " · ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())) or "-"),
            ("time", f"{self.seconds:.1f} s · {rate:.2f} episodes/s"),
            (
                "retries",
                f"{self.retries} environment retries"
                + (f" · {self.fallbacks} fallbacks" if self.fallbacks else ""),
            ),
        ]
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
        if self.stopped:
            lines.append(("stopped", self.stopped))
        width = max(len(k) for k, _ in lines)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


class _MeteredEnvironment:
    """The environment, with every successful call added to the meter as it returns (for --budget), and the API
    keys cut out of its errors before the graph keeps them (in the episode's state, and so in checkpoints)."""

    def __init__(self, inner: Any, meter: UsageMeter, redact: Redactor) -> None:
        self.inner, self.meter, self.redact = inner, meter, redact

    async def respond(self, prompt: str, history=(), *, run_config=None) -> EnvironmentReply:
        try:
            reply = await self.inner.respond(prompt, history, run_config=run_config)
        except Exception as exc:
            self.redact.exception(exc)
            raise
        self.meter.add("environment", reply.model or "environment", reply.input_tokens, reply.output_tokens)
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _MeteredAgent:
    """The agent, metered, with the API keys cut out of its errors (LangGraph writes a failed node's error to
    the checkpoint)."""

    def __init__(self, inner: AgentBackend, meter: UsageMeter, model: str, redact: Redactor) -> None:
        self.inner, self.meter, self.model, self.redact = inner, meter, model, redact

    async def generate(self, request: AgentRequest) -> AgentOutput:
        try:
            output = await self.inner.generate(request)
        except Exception as exc:
            self.redact.exception(exc)
            raise
        self.meter.add("agent", self.model, output.prompt_tokens, output.completion_tokens)
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def episode_cost(state: dict[str, Any], prices: PriceTable, agent_model: str) -> float | None:
    """The priced cost of a whole episode (turns paid by earlier runs included); None when a model is unpriced."""
    total = 0.0
    for turn in state.get("turns", []):
        call = turn.get("environment_call")
        if call:
            cost = prices.cost(call.get("model") or "", call["input_tokens"], call["output_tokens"])
            if cost is None:
                return None
            total += cost
    usage = state.get("usage", {})
    agent = prices.cost(
        agent_model, usage.get("agent_prompt_tokens", 0), usage.get("agent_completion_tokens", 0)
    )
    if agent is None:
        return None
    return total + agent


def priced_models(environment: Any, agent: AgentBackend) -> dict[str, str]:
    """What a budget is spent on: label → model name, for every environment model (each pool member's) and for a
    served agent (an in-process agent makes no paid calls)."""
    members = getattr(environment, "members", None) or [environment]
    models = {}
    for member in members:
        model = str(getattr(member, "model_name", None) or "environment")
        name = getattr(member, "name", None)
        label = f"environment model {model!r}" + (f" (pool member {name})" if len(members) > 1 else "")
        models[label] = model
    config = getattr(agent, "config", None)
    if getattr(config, "resolved_backend", None) == "served":
        models[f"agent model {config.model!r}"] = str(config.model)
    return models


def scan_input(source: str | Path, limit: int | None = None) -> int:
    """Read the input through once before anything runs: the number of rows, or a `DataError` for a row that
    cannot be used or an id that repeats an earlier row's id with another question (which of the two to answer
    is the user's call). An id repeated for the same question is only reported later, and run once."""
    questions: dict[str, tuple[int, int]] = {}  # id → (checksum of its question, row index)
    rows = 0
    for sample in iter_samples(source, limit=limit, require_answers=False):
        rows += 1
        checksum = crc(sample.question)
        earlier = questions.setdefault(sample.id, (checksum, sample.index))
        if earlier[0] != checksum:
            raise DataError(
                f"input row {sample.index}: id {sample.id!r} repeats row {earlier[1]} with another question; "
                "give each question its own id"
            )
    return rows


def _failed(status: str, error: str) -> dict[str, Any]:
    return {"answer": None, "status": status, "error": error, "turns": [], "usage": {}}


def _describe_internal(exc: BaseException) -> str:
    """`Type: message (at file:line)`, the line being where it was raised, for a bug report."""
    import traceback

    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        text += f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})"
    return text


class _Runner:
    def __init__(
        self,
        graph: Any,
        checkpointer: Any,
        samples: Iterator[Sample],
        out: Path,
        existing: OutputState,
        summary: BatchSummary,
        meter: UsageMeter,
        environment: Any,
        *,
        concurrency: int,
        max_failures: int | None,
        budget: float | None,
        agent_model: str,
        bar: Any,
        log: TextIO,
        redact: Redactor,
    ) -> None:
        self.graph, self.checkpointer, self.samples = graph, checkpointer, samples
        self.out, self.existing, self.summary, self.meter = out, existing, summary, meter
        self.environment = environment
        self.concurrency, self.max_failures, self.budget = concurrency, max_failures, budget
        self.agent_model, self.bar, self.log, self.redact = agent_model, bar, log, redact
        self.seen: set[str] = set()
        self.stopping = False
        self.workers: list[asyncio.Task] = []
        # Workers inside an episode: the only ones a stop cancels. A worker writing a row or deleting a finished
        # episode's checkpoint thread finishes that first, so no row is half-recorded.
        self.in_episode: set[asyncio.Task] = set()
        self.in_flight = 0
        self.handle: TextIO | None = None

    # ---- input ----------------------------------------------------------------------------------------------
    def _next_sample(self) -> Sample | None:
        """The next question to run, skipping finished and repeated ids. No await inside, so the workers can
        share one generator."""
        while not self.stopping:
            try:
                sample = next(self.samples)
            except StopIteration:
                return None
            except DataError as exc:
                self.summary.input_error = str(exc)
                self.stop(f"input error: {exc}", cancel=False)
                return None
            if sample.id in self.seen:
                self.summary.duplicates += 1
                if self.summary.duplicates <= _MAX_REPORTED:
                    print(
                        f"prompt-r1: duplicate id {sample.id!r} at input row {sample.index}: not run again",
                        file=self.log,
                    )
                self._shrink_total()
                continue
            self.seen.add(sample.id)
            recorded = self.existing.finished.get(sample.id)
            if recorded is not None:
                if recorded != crc(sample.question):
                    self.summary.conflicts += 1
                    if self.summary.conflicts <= _MAX_REPORTED:
                        print(
                            f"prompt-r1: id {sample.id!r} was finished in {self.out} for another question: kept, "
                            "not rerun (use another --out to run the new question)",
                            file=self.log,
                        )
                else:
                    self.summary.skipped += 1
                continue
            return sample
        return None

    def _shrink_total(self) -> None:
        if self.bar is not None and self.bar.total:
            self.bar.total -= 1

    # ---- control --------------------------------------------------------------------------------------------
    def stop(self, reason: str, *, cancel: bool) -> None:
        if self.summary.stopped is None:
            self.summary.stopped = reason
        self.stopping = True
        if cancel:
            current = asyncio.current_task()
            for task in list(self.in_episode):
                if task is not current and not task.done():
                    task.cancel()

    def _over_budget(self) -> bool:
        return self.budget is not None and self.meter.cost >= self.budget

    # ---- episodes -------------------------------------------------------------------------------------------
    async def _invoke(self, sample: Sample, config: dict) -> tuple[dict, str | None]:
        inputs = {"question": sample.question, "golden_answers": sample.golden_answers}
        if self.checkpointer is None:
            return await self.graph.ainvoke(inputs, config), None
        snapshot = await self.graph.aget_state(config)
        values = snapshot.values or {}
        if values and values.get("question") == sample.question:
            if snapshot.next:  # interrupted mid-episode: continue after its last completed step
                return await self.graph.ainvoke(None, config, durability="sync"), "interrupted"
            if values.get("status") not in FAILED_STATUSES:  # finished, but its row was never written
                return values, "finished"
            async for earlier in self.graph.aget_state_history(config):
                if earlier.next == ("environment",):  # just before the call that failed
                    return await self.graph.ainvoke(None, earlier.config, durability="sync"), "failed_call"
        if values:  # another question under this id: start over
            await self.checkpointer.adelete_thread(sample.id)
        return await self.graph.ainvoke(inputs, config, durability="sync"), None

    async def _episode(self, sample: Sample) -> dict[str, Any]:
        config = {
            "configurable": {"thread_id": sample.id},
            "run_name": "prompt_r1_episode",
            "tags": ["prompt-r1", "batch"],
            "metadata": {"episode_id": sample.id, "dataset": sample.dataset},
        }
        started = time.monotonic()
        row: dict[str, Any] = {"id": sample.id, "dataset": sample.dataset, "index": sample.index}
        row["question"] = sample.question
        if sample.golden_answers:
            row["golden_answers"] = sample.golden_answers
        try:
            state, resumed = await self._invoke(sample, config)
            result: dict[str, Any] = {
                "answer": state.get("answer"),
                "status": state.get("status"),
                "error": state.get("error"),
                "turns": state.get("turns", []),
                "usage": state.get("usage", {}),
            }
            trajectory = trajectory_of(state)  # a token-exact agent's ids, for training or checking
            if trajectory is not None:
                result["trajectory"] = trajectory
            if resumed:
                result["resumed"] = resumed
            result["cost_usd"] = episode_cost(state, self.meter.prices, self.agent_model)
            if sample.golden_answers and result["answer"] is not None:
                from prompt_r1.metrics import exact_match, f1

                result["metrics"] = {
                    "em": exact_match(result["answer"], sample.golden_answers),
                    "f1": f1(result["answer"], sample.golden_answers),
                }
        except AgentError as exc:
            result = _failed("agent_error", f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            # Whatever else one episode raises (a bug, a library's unexpected error) is that episode's failure:
            # recorded, retried by the next run, counted toward --max-failures; the other episodes go on.
            result = _failed("internal_error", _describe_internal(exc))
        else:
            if resumed:
                self.summary.resumed += 1
        row.update(result)
        row["latency_s"] = round(time.monotonic() - started, 3)
        row["finished_at"] = round(time.time(), 3)  # Unix time, for throughput over any part of a run
        return row

    def _write(self, row: dict[str, Any]) -> None:
        try:
            self.handle.write(self.redact.json_line(row))
            self.handle.flush()
        except OSError as exc:  # a full disk, a file system gone read-only: the rows written so far stand
            raise OutputError(f"cannot write --out {self.out}: {exc.strerror or exc}") from None
        self.summary.written += 1
        self.summary.statuses[row["status"]] += 1
        if row["id"] in self.existing.failed:
            self.existing.superseded += 1

    async def _forget(self, sample_id: str) -> None:
        if self.checkpointer is not None:
            await self.checkpointer.adelete_thread(sample_id)

    async def _worker(self) -> None:
        # Cancelled outside an episode (the run itself was cancelled while this worker was between episodes):
        # nothing in flight to count, and the rows written so far stand.
        with contextlib.suppress(asyncio.CancelledError):
            await self._work()

    async def _work(self) -> None:
        task = asyncio.current_task()
        while not self.stopping:
            if self._over_budget():
                self.stop(f"budget of ${self.budget:g} reached (${self.meter.cost:.4f} spent)", cancel=False)
                return
            sample = self._next_sample()
            if sample is None:
                return
            self.in_flight += 1
            self.in_episode.add(task)
            try:
                row = await self._episode(sample)
            except asyncio.CancelledError:
                self.summary.cancelled += 1
                return
            finally:
                self.in_episode.discard(task)
                self.in_flight -= 1
            self._write(row)
            if row["status"] not in FAILED_STATUSES:
                await self._forget(sample.id)
            self._progress()
            if self.max_failures is not None and self.summary.failed >= self.max_failures:
                self.stop(
                    f"{self.summary.failed} failed episodes reached --max-failures {self.max_failures}",
                    cancel=True,
                )

    def _progress(self) -> None:
        if self.bar is None:
            return
        self.bar.update(1)
        retries = getattr(self.environment, "retries", 0)
        self.bar.set_postfix_str(
            f"failed {self.summary.failed} · retries {retries} · in flight {self.in_flight} · ${self.meter.cost:.4f}",
            refresh=False,
        )

    async def run(self) -> None:
        self.handle = self.out.open("a", encoding="utf-8")
        self.workers = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        try:
            await asyncio.gather(*self.workers)
        finally:  # an unexpected error in one worker (or our own cancellation) stops them all
            for task in self.workers:
                task.cancel()
            await asyncio.gather(*self.workers, return_exceptions=True)
            # Every row was flushed as it was written, so closing fails only where a write already failed (a full
            # disk), and that failure, naming the file, is the one to report.
            with contextlib.suppress(OSError):
                self.handle.close()


@contextlib.contextmanager
def _stop_on_signals(runner: _Runner, log: TextIO):
    """SIGINT/SIGTERM stop the run and cancel the episodes in flight; a second SIGINT quits at once."""
    loop = asyncio.get_running_loop()
    installed = []

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        print(
            f"\nprompt-r1: {name}: stopping; {runner.in_flight} episode(s) in flight are cancelled and rerun "
            "next time (Ctrl-C again to quit at once)",
            file=log,
        )
        runner.stop(f"interrupted ({name})", cancel=True)
        loop.remove_signal_handler(signal.SIGINT)  # the next Ctrl-C raises KeyboardInterrupt as usual

    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


async def run_batch(
    source: str | Path,
    out: str | Path,
    *,
    agent: AgentBackend,
    environment: Any,
    loop: LoopConfig | None = None,
    concurrency: int = 32,
    checkpoint: str | Path | None = None,
    max_failures: int | None = None,
    budget: float | None = None,
    prices: PriceTable | None = None,
    limit: int | None = None,
    progress: bool = True,
    log: TextIO | None = None,
    secrets: Sequence[str] = (),
) -> BatchSummary:
    """Run the loop on every question of `source` (a bundled set's name or a parquet/JSONL/JSON file) not yet
    finished in `out`, appending one JSON row per episode. Returns the summary (also when stopped early).

    Before anything runs, the input is read through once (a bad row, or an id repeated for another question, stops
    it with a `DataError`), and `out` and `checkpoint` are checked (`OutputError`: the input, a folder, a file
    that is not a results file or a SQLite database, an unwritable path) without being changed.

    Every API key the clients use (prompt_r1.redaction), and any `secrets` given, are cut out of everything
    written: rows, the summary, `log`."""
    from prompt_r1.graph import build_graph

    redact = Redactor(secrets)
    log = RedactedStream(log if log is not None else sys.stderr, redact)
    loop = loop or LoopConfig()
    if concurrency < 1:
        raise ConfigError(f"concurrency must be ≥ 1, got {concurrency}")
    if max_failures is not None and max_failures < 1:
        raise ConfigError(f"max_failures must be ≥ 1, got {max_failures}")
    if budget is not None and budget <= 0:
        raise ConfigError(f"budget must be > 0 dollars, got {budget}")
    out = Path(out)
    if out.suffix != ".jsonl":
        raise ConfigError(f"the output must be a .jsonl file, got {out}")
    prices = prices or PriceTable.load()

    from langchain_core.language_models import BaseChatModel

    if isinstance(environment, BaseChatModel):
        environment = EnvironmentClient(chat_model=environment, limiter_key=f"chat-model-{id(environment)}")
    agent_config = getattr(agent, "config", None)
    agent_model = str(getattr(agent_config, "model", None) or "agent")
    if budget is not None:
        # An unpriced model's spending would count as nothing, and the budget would never stop the run.
        missing = prices.unpriced(priced_models(environment, agent))
        if missing:
            raise ConfigError(
                f"a budget needs a price for every model it pays for; there is none for {', '.join(missing)}: "
                f"{prices.edit_hint()}, as MODEL: {{input: $, output: $}} per 1M tokens"
            )
    path, _ = resolve_source(source)
    input_rows = scan_input(source, limit)
    samples = iter_samples(source, limit=limit, require_answers=False)
    protected = [("input file", path), ("--checkpoint file", Path(checkpoint) if checkpoint else None)]
    if checkpoint is not None:  # checked first, created last: a refusal leaves no file behind
        check_checkpoint(checkpoint, [("input file", path), ("--out file", out)], create=False)
    existing = open_results_file(out, row_prefix=_ROW_PREFIX, protected=protected)
    if checkpoint is not None:
        check_checkpoint(checkpoint, [("input file", path), ("--out file", out)])
    meter = UsageMeter(prices)
    metered_env = _MeteredEnvironment(environment, meter, redact)
    metered_agent = _MeteredAgent(agent, meter, agent_model, redact)

    summary = BatchSummary(out=str(out), input_rows=input_rows)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        total = None if input_rows is None else max(0, input_rows - len(existing.finished))
        bar = tqdm(total=total, desc="batch", unit="episode", dynamic_ncols=True, file=log)
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        checkpointer = None
        if checkpoint is not None:
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            checkpointer = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(str(checkpoint)))
        graph = build_graph(metered_agent, metered_env, checkpointer=checkpointer, **loop.graph_options())
        runner = _Runner(
            graph,
            checkpointer,
            samples,
            out,
            existing,
            summary,
            meter,
            environment,
            concurrency=concurrency,
            max_failures=max_failures,
            budget=budget,
            agent_model=agent_model,
            bar=bar,
            log=log,
            redact=redact,
        )
        try:
            with _stop_on_signals(runner, log):
                await runner.run()
        finally:
            if bar is not None:
                bar.close()
            summary.seconds = time.monotonic() - started
            summary.retries = getattr(environment, "retries", 0)
            summary.fallbacks = getattr(environment, "fallbacks", 0)
            summary.usage = meter.to_dict()
            summary.stopped, summary.input_error = redact(summary.stopped), redact(summary.input_error)
            if existing.superseded:
                compact_output(out)
    return summary
