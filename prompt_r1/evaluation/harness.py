"""The evaluation harness behind `prompt-r1 eval`: the paper's Tables 2–4 on your models.

A run evaluates methods (prompt_r1.evaluation.plan) on datasets and keeps everything in one output folder:

    predictions.jsonl   one row per (method, dataset, sample), appended as each finishes; a rerun skips the
                        finished ones (rows that failed on the environment, the agent or this code are retried)
    run.json            the settings each method ran with; a rerun with different ones is refused
    summary.csv         per dataset and method: rows scored, rows failed, EM, SM, F1, SSim, math equivalence
    table.md            the paper's Table 2 layout: methods × (dataset, metric), with averages
    chart.png           F1 per dataset, one bar per method

Rows run on the shared worker pool (prompt_r1.runs.pool) into the shared results store (prompt_r1.runs.result_store), the loop's
rows through the shared episode runner (prompt_r1.runs.episode), as `batch` runs: one row that raises is that row's
`internal_error` and the others go on; `max_failures` and `budget` stop a run; Ctrl-C stops it cleanly, keeping
the rows written, and the next run does each remaining row exactly once. A finished row whose question has since
changed (another file under the same dataset name) is kept, not rerun, and reported. A call ledger beside the rows
(predictions.calls.sqlite, left by an `eval --ray` run killed or stopped mid-row) is replayed by any rerun, with Ray
or without: the calls it holds are answered from it, not paid for again (prompt_r1.runs.call_ledger).

The baselines ask for the answer in `<answer>` tags; a reply without them is scored as a whole and marked
`answer_tagged: false`. Scores and reports: prompt_r1.evaluation.reports.
"""

from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

from prompt_r1.agents.base import AgentBackend
from prompt_r1.clients.costs import PriceTable, UsageMeter
from prompt_r1.core.config import LoopConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.redaction import RedactedStream, Redactor
from prompt_r1.data.datasets import Sample, jsonl_rows
from prompt_r1.evaluation.optimizers.search import OPTIMIZERS
from prompt_r1.evaluation.plan import (
    MANIFEST,
    METHODS,
    SUITES,
    MethodInfo,
    Suite,
    record_settings,
    resolve_plan,
)
from prompt_r1.evaluation.reports import (
    SummaryRow,
    render_markdown,
    summarize,
    write_chart,
    write_reports,
    write_summary_csv,
)
from prompt_r1.evaluation.rows import EvalItem, eval_work, row_head
from prompt_r1.loop.graph import STATUSES
from prompt_r1.runs.call_ledger import EpisodeLedger, LedgeredEnvironment, earlier_ledger, ledger_episode
from prompt_r1.runs.episode import FAILED_STATUSES, as_environment, describe_exception
from prompt_r1.runs.metering import (
    MeteredAgent,
    MeteredEnvironment,
    budget_rule,
    check_budget_prices,
)
from prompt_r1.runs.output_lock import hold_output
from prompt_r1.runs.pool import RunTally, check_limits, run_many
from prompt_r1.runs.ray_settings import RaySettings
from prompt_r1.runs.result_store import ResultStore

__all__ = [
    "FAILED_STATUSES",
    "MANIFEST",
    "METHODS",
    "PREDICTIONS",
    "SUITES",
    "MethodInfo",
    "RunOutcome",
    "Suite",
    "SummaryRow",
    "read_predictions",
    "record_settings",
    "render_markdown",
    "resolve_plan",
    "run_evaluation",
    "summarize",
    "write_chart",
    "write_reports",
    "write_summary_csv",
]

PREDICTIONS = "predictions.jsonl"
_ROW_PREFIX = '{"method": '  # how every row this module writes begins


# Every status an eval row can have: the loop's, the failures', and a baseline's answer without its tag.
ROW_STATUSES = frozenset(STATUSES) | FAILED_STATUSES | {"untagged"}


def prediction_problem(row: Mapping[str, Any]) -> str | None:
    """What makes a predictions row unscorable, or None: the one rule of `score` and of an `eval` resuming its
    own file (a row eval kept as done but score refused would leave the folder's tables unreproducible). A
    status, where a row has one, must be one eval writes: the reports count failures by it."""
    from prompt_r1.core.text import lone_surrogate
    from prompt_r1.scoring.rewards import golden_answers_of

    if "prediction" not in row:
        return "no prediction (use null for a question left unanswered)"
    if row["prediction"] is not None and not isinstance(row["prediction"], str):
        return f"its prediction is not text (got {type(row['prediction']).__name__} {row['prediction']!r})"
    if row.get("status") is not None and row["status"] not in ROW_STATUSES:
        return f"its status {row.get('status')!r} is not one eval writes ({', '.join(sorted(ROW_STATUSES))})"
    for what in ("prediction", "method", "dataset"):  # the names are written to the reports
        problem = None if row.get(what) is None else lone_surrogate(str(row[what]))
        if problem is not None:
            return f"its {what} is not valid Unicode text ({problem})"
    try:
        golden_answers_of(row)
    except (KeyError, TypeError) as exc:
        return str(exc.args[0])
    return None


def _key(row: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(row["method"]), str(row["dataset"]), str(row["id"]))


def _ledger_key(item: EvalItem) -> str:
    """A row's episode in the call ledger, the same with Ray or without (so either replays the other's calls)."""
    return "/".join(item.key)


def read_predictions(
    path: str | Path,
    *,
    strict: bool = False,
    repeats: list[tuple[int, tuple[str, str, str]]] | None = None,
) -> list[dict[str, Any]]:
    """The rows of a predictions file; when a key (method, dataset, id) appears twice (a retried row), the later
    row wins.

    A last line cut short (the process was killed mid-write) is dropped, as a run resuming its own file needs;
    with `strict` it is an error like any other bad line (a file to score must be whole). Bad lines, a file that
    is not UTF-8 or not a file are `DataError`s naming the file and line. When `repeats` is a list, (line
    number, key) of every row whose key an earlier row already had is appended to it.
    """
    path = Path(path)
    if not path.exists():
        return []
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for line_no, row in jsonl_rows(path, allow_cut_last_line=not strict):
        for key, default in (("method", "predictions"), ("dataset", path.stem), ("id", f"line-{line_no}")):
            if row.get(key) is None:
                row[key] = default
        row_key = _key(row)
        if repeats is not None and row_key in rows:
            repeats.append((line_no, row_key))
        rows[row_key] = row
    return list(rows.values())


@dataclass
class RunOutcome(RunTally):
    """What one call of `run_evaluation` did: the pool's tally (written, skipped, failed, cancelled, conflicts,
    stopped, seconds, the keys kept from an earlier run for another question) and the spending; with Ray, its
    figures (actors, start-up seconds, rows retried, calls replayed from the ledger)."""

    usage: dict[str, Any] = field(default_factory=dict)
    ray: dict[str, Any] | None = None


async def run_evaluation(
    out_dir: str | Path,
    methods: Sequence[str],
    samples: Sequence[Sample],
    *,
    agent: AgentBackend | None = None,
    environment: Any = None,
    loop: LoopConfig | None = None,
    agent_config: Any = None,
    environment_config: Any = None,
    concurrency: int = 16,
    max_failures: int | None = None,
    budget: float | None = None,
    prices: PriceTable | None = None,
    progress: bool = True,
    log: TextIO | None = None,
    instructions: Mapping[tuple[str, str], str] | None = None,
    search: dict | None = None,
    meter: UsageMeter | None = None,
    ray: RaySettings | None = None,
) -> RunOutcome:
    """Run every method on every sample not yet finished in `out_dir`, appending rows as they finish (see the
    module docstring). A prompt optimiser's method answers under `instructions[(method, dataset)]`, found by the
    search whose settings are `search` (prompt_r1.evaluation.optimizers.search). `meter`: the run's meter when
    something before the rows already spent from the budget (the searches); else a new one. Returns the outcome,
    also when stopped early.

    With `ray` (`RaySettings`), the rows are made in Ray actors that build their own players from `agent_config`
    and `environment_config` (prompt_r1.runs.ray_batch: one limit, one budget, the call ledger); `agent` and
    `environment` are then not needed."""
    loop = loop or LoopConfig()
    redact = Redactor()
    log = RedactedStream(log if log is not None else sys.stderr, redact)
    check_limits(concurrency, max_failures, budget)
    if ray is not None:  # the actors build the players: only their settings are needed here
        if environment is None and environment_config is not None:
            from prompt_r1.clients.environment import EnvironmentClient

            environment = EnvironmentClient(environment_config)  # no connection: its key and prices checked
        agent = SimpleNamespace(config=agent_config) if agent_config is not None else None
    for method in methods:
        info = METHODS[method]
        if info.needs_agent and agent is None:
            raise ConfigError(
                f"method {method} needs an agent" + (" (agent_config, with ray)" if ray else "")
            )
        if info.needs_environment and environment is None:
            raise ConfigError(
                f"method {method} needs an environment" + (" (environment_config, with ray)" if ray else "")
            )
    for method in methods:
        if method in OPTIMIZERS:
            missing = sorted(
                {str(s.dataset) for s in samples} - {d for m, d in instructions or {} if m == method}
            )
            if missing:
                raise ConfigError(
                    f"method {method} has no instruction for {', '.join(missing)}: search it first"
                )
    prices = prices or PriceTable.load()
    if environment is not None:
        environment = as_environment(environment)
    if budget is not None:
        check_budget_prices(prices, environment, agent)
    out_dir = Path(out_dir)
    # One writer per folder (re-entered when `prompt-r1 eval` already holds it), held to the end.
    with hold_output(out_dir, "--out", folder=True), contextlib.ExitStack() as files:
        # Without Ray, an `eval --ray` run's ledger (that run killed, or stopped mid-row) answers the calls it
        # holds; an existing one only (none is made here), opened before the settings or a row are written, so one
        # that is damaged is refused with them untouched. With Ray, its keeper opens it.
        ledger = earlier_ledger(out_dir / PREDICTIONS) if ray is None else None
        if ledger is not None:
            files.callback(ledger.close)  # a run that ends closes it: no -wal or -shm file left
        record_settings(
            out_dir,
            methods,
            agent_config=agent_config,
            environment_config=environment_config,
            loop=loop,
            search=search,
        )
        # The folder's rows are checked before anything is appended: a file there that is not ours is left untouched.
        store = ResultStore.open(
            out_dir / PREDICTIONS, row_prefix=_ROW_PREFIX, what="predictions file", key=_key, redact=redact,
            check=prediction_problem,
        )  # fmt: skip
        meter = meter if meter is not None else UsageMeter(prices)
        agent_config = agent_config if agent_config is not None else getattr(agent, "config", None)
        agent_model = str(getattr(agent_config, "model", None) or "agent")
        # A served agent's tokens are paid for; a local model's cost nothing unless the price table says otherwise.
        agent_paid = getattr(agent_config, "resolved_backend", None) == "served"
        options = dict(methods=list(methods), agent_model=agent_model, agent_paid=agent_paid,
                       instructions=dict(instructions or {}))  # fmt: skip
        async with contextlib.AsyncExitStack() as stack:
            if (
                ray is not None
            ):  # the rows are made in Ray actors, by the same row maker (prompt_r1.runs.ray_batch)
                from prompt_r1.runs.ray_batch import RayEpisodes

                episodes = stack.enter_context(
                    RayEpisodes(ray, eval_work, out=out_dir / PREDICTIONS, concurrency=concurrency, budget=budget,
                                agent_config=agent_config, environment_config=environment_config, loop=loop,
                                prices=prices, meter=meter, options=options, key=_ledger_key)
                )  # fmt: skip
                work, after_write, stop = episodes.work, episodes.after_write, episodes.stop_rule()
            else:
                agent = MeteredAgent(agent, meter, agent_model, redact) if agent is not None else None
                environment = (
                    MeteredEnvironment(environment, meter, redact) if environment is not None else None
                )
                # Outermost: a call replayed from the ledger is neither sent nor metered (nor against --budget).
                if ledger is not None and environment is not None:
                    environment = LedgeredEnvironment(environment, ledger.answer)
                work = eval_work(agent, environment, loop, prices, **options)
                after_write = None
                if ledger is not None:
                    work, after_write = _replaying(work, ledger)
                episodes, stop = None, budget_rule(meter, budget)
            outcome = await _run_rows(samples, methods, store, work, after_write, stop, meter, concurrency,
                                      max_failures, progress, log)  # fmt: skip
            if episodes is not None:
                outcome.ray = episodes.figures()
        return outcome


def _replaying(work, ledger: EpisodeLedger):
    """`work` with each row's environment calls its episode's in `ledger` (answered from it where an earlier run
    paid for them), and the pool's `after_write`: a finished row's calls leave the ledger (a rerun skips the row);
    a failed row's stay, to be replayed by the next run (as the Ray path's keeper does)."""

    async def replaying(item: EvalItem) -> dict[str, Any]:
        with ledger_episode(_ledger_key(item)):
            return await work(item)

    async def forget_finished(item: EvalItem, row: dict[str, Any]) -> None:
        if row["status"] not in FAILED_STATUSES:
            ledger.forget(_ledger_key(item))

    return replaying, forget_finished


async def _run_rows(samples, methods, store, work, after_write, stop, meter, concurrency, max_failures, progress,
                    log) -> RunOutcome:  # fmt: skip
    """The rows not yet finished, through the shared worker pool, with one progress line."""
    from tqdm.auto import tqdm

    pending = len(samples) * len(methods) - sum(
        store.is_finished((m, str(s.dataset), str(s.id))) for s in samples for m in methods
    )
    bar = tqdm(total=pending, desc="eval", unit="row", disable=not progress, dynamic_ncols=True, file=log)
    running: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # method → [n, Σ EM, Σ F1]
    outcome = RunOutcome()

    def postfix(row: dict[str, Any], in_flight: int) -> None:
        if row["status"] not in FAILED_STATUSES:
            stats = running[row["method"]]
            stats[0] += 1
            stats[1] += row["metrics"]["em"]
            stats[2] += row["metrics"]["f1"]
        bar.set_postfix_str(
            " · ".join(f"{m} EM {s[1] / s[0]:.3f} F1 {s[2] / s[0]:.3f}" for m, s in running.items())
            + (f" · failed {outcome.failed}" if outcome.failed else ""),
            refresh=False,
        )

    def failure_row(item: EvalItem, exc: Exception) -> dict[str, Any]:
        """The row of an item whose own bookkeeping (its scoring, its reward) raised: failed, so rerun."""
        return {
            **row_head(item),
            "prediction": "",
            "status": "internal_error",
            "error": describe_exception(exc),
            "latency_s": 0.0,
        }

    items = (EvalItem(method, sample) for sample in samples for method in methods)
    try:
        await run_many(
            items,
            work,
            store,
            failure_row=failure_row,
            concurrency=concurrency,
            key=lambda item: item.key,
            describe=EvalItem.describe,
            max_failures=max_failures,
            stop=stop,
            after_write=after_write,
            on_row=postfix,
            tally=outcome,
            progress=bar,
            log=log,
        )
    finally:
        bar.close()
        outcome.usage = meter.to_dict()
    return outcome
