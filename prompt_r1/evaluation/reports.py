"""Scoring an evaluation's rows and writing its reports: per (dataset, method) means, the summary CSV, the paper's
Table 2 layout in Markdown, and a bar chart.

    summary = summarize(read_predictions("eval-results/predictions.jsonl"))
    write_reports(summary, "eval-results")   # summary.csv, table.md, chart.png
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prompt_r1.core.errors import ConfigError
from prompt_r1.data.datasets import dataset_info
from prompt_r1.evaluation.charts import write_chart, write_cost_chart
from prompt_r1.evaluation.plan import METHODS, ordered
from prompt_r1.runs.episode import FAILED_STATUSES
from prompt_r1.scoring.metrics import METRICS, SemanticScorer, as_answer_list, default_metrics
from prompt_r1.scoring.scorers import SCORERS, check_scorer, metric_scores, row_metrics

__all__ = [
    "SummaryRow",
    "markdown_table",
    "render_markdown",
    "row_metrics",
    "summarize",
    "write_reports",
    "write_summary_csv",
]


def _scores(
    name: str,
    predictions: Sequence[str],
    golds: Sequence[Sequence[str]],
    scorer: SemanticScorer | None = None,
    scoring: str = "paper",
) -> list[float]:
    """Metric `name` per row under the scorer's rules (prompt_r1.scoring.scorers)."""
    return metric_scores(scoring, name, predictions, golds, scorer)


@dataclass
class SummaryRow:
    dataset: str
    method: str
    n: int  # rows scored
    failed: int  # rows left out because the environment or agent failed
    scores: dict[str, float]  # metric name → mean over the scored rows (0–1)
    scoring: str = "paper"  # the scorer's name (prompt_r1.scoring.scorers.SCORERS)
    # What the rows cost, failed ones included (they were paid for): calls and tokens summed, `cost_usd` the
    # estimated dollars (None when a row is unpriced), `usd_per_row` that over every row.
    spend: dict[str, Any] = field(default_factory=dict)


def _metrics_for(dataset: str, requested: Sequence[str] | None) -> list[str]:
    if requested:
        return list(requested)
    info = dataset_info(dataset)
    return default_metrics(info.task if info is not None else None)


def summarize(
    rows: Iterable[Mapping[str, Any]],
    *,
    metrics: Sequence[str] | None = None,
    scorer: SemanticScorer | None = None,
    scoring: str = "paper",
) -> list[SummaryRow]:
    """Mean scores per (dataset, method). By default: EM, SM and F1 everywhere, SSim on the text-generation
    sets, math equivalence on the math sets; `metrics` picks the metrics for every dataset instead. `scoring`:
    the paper's definitions or the release's rules (prompt_r1.scoring.scorers; the rows' predictions are scored as they
    are: `release_rows` reads an episode's prediction the release's way first)."""
    check_scorer(scoring)
    unknown = [m for m in metrics or () if m not in METRICS]
    if unknown:
        raise ConfigError(f"unknown metric(s) {', '.join(unknown)}; choose from {', '.join(METRICS)}")
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    failed: dict[tuple[str, str], int] = defaultdict(int)
    spend: dict[tuple[str, str], dict[str, Any]] = defaultdict(_no_spend)
    for row in rows:
        key = (str(row["dataset"]), str(row["method"]))
        _add_spend(spend[key], row)
        if row.get("status") in FAILED_STATUSES:
            failed[key] += 1
        else:
            groups[key].append(row)
    for key in failed:
        groups.setdefault(key, [])

    summary = []
    for (dataset, method), members in groups.items():
        predictions = [str(r.get("prediction") or "") for r in members]
        golds = [as_answer_list(r["golden_answers"]) for r in members]
        scores = {}
        for name in _metrics_for(dataset, metrics):
            if not members:
                continue
            values = _scores(name, predictions, golds, scorer, scoring)
            scores[name] = sum(values) / len(values)
        cost = _closed_spend(spend[(dataset, method)])
        summary.append(
            SummaryRow(dataset, method, len(members), failed[(dataset, method)], scores, scoring, cost)
        )
    return ordered(summary)


SPEND_COLUMNS = (
    "env_calls",
    "env_input_tokens",
    "env_output_tokens",
    "agent_input_tokens",
    "agent_output_tokens",
    "cost_usd",
    "usd_per_row",
    "rows_without_cost",  # written before costs were kept, or failed in this code: in neither figure above
    "search_calls",  # a prompt optimiser's search: its metric and optimiser-model calls,
    "search_input_tokens",  # their tokens (task and optimiser model together),
    "search_output_tokens",
    "search_usd",  # and their dollars (prompt_r1.evaluation.optimizers.search)
)


def _no_spend() -> dict[str, Any]:
    return {name: 0 for name in SPEND_COLUMNS[:5]} | {
        "rows": 0,
        "cost_usd": 0.0,
        "unpriced": 0,
        "unrecorded": 0,
    }


def _add_spend(spend: dict[str, Any], row: Mapping[str, Any]) -> None:
    usage = row.get("usage") or {}
    spend["rows"] += 1
    spend["env_calls"] += usage.get("env_calls", 0)
    spend["env_input_tokens"] += usage.get("env_input_tokens", 0)
    spend["env_output_tokens"] += usage.get("env_output_tokens", 0)
    spend["agent_input_tokens"] += usage.get("agent_prompt_tokens", 0)
    spend["agent_output_tokens"] += usage.get("agent_completion_tokens", 0)
    if "cost_usd" not in row:  # written before costs were kept, or by a row that failed in this code
        spend["unrecorded"] += 1
    elif row["cost_usd"] is None:  # a model the price table lacks
        spend["unpriced"] += 1
    else:
        spend["cost_usd"] += row["cost_usd"]


def _closed_spend(spend: dict[str, Any]) -> dict[str, Any]:
    """The group's spending: `cost_usd` and `usd_per_row` None when a row was unpriced; rows with no cost recorded
    at all are left out of both and counted in `rows_without_cost`."""
    closed = {name: spend[name] for name in SPEND_COLUMNS[:5]}
    recorded = spend["rows"] - spend["unrecorded"]
    priced = recorded > 0 and spend["unpriced"] == 0
    closed["cost_usd"] = spend["cost_usd"] if priced else None
    closed["usd_per_row"] = spend["cost_usd"] / recorded if priced else None
    closed["rows_without_cost"] = spend["unrecorded"]
    return closed


def write_summary_csv(summary: Sequence[SummaryRow], path: str | Path) -> Path:
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        columns = list(METRICS)
        writer.writerow(["dataset", "title", "method", "n", "failed", *columns, *SPEND_COLUMNS, "scorer"])
        for s in summary:
            info = dataset_info(s.dataset)
            writer.writerow(
                [
                    s.dataset,
                    info.title if info else s.dataset,
                    s.method,
                    s.n,
                    s.failed,
                    *(f"{s.scores[c]:.6f}" if c in s.scores else "" for c in columns),
                    *("" if s.spend.get(c) is None else s.spend[c] for c in SPEND_COLUMNS),
                    s.scoring,
                ]
            )
    return path


def _table_metrics(dataset: str, scores_seen: set[str], requested: Sequence[str] | None) -> list[str]:
    """A dataset's columns: the requested metrics, else the paper's (EM+F1 for QA and math, F1+SSim for text),
    else, for a dataset of the user's own, every metric computed (math equivalence has its own table)."""
    info = dataset_info(dataset)
    if requested:
        wanted = list(requested)
    elif info is not None:
        wanted = list(info.metrics)
    else:
        wanted = [name for name, metric in METRICS.items() if metric.own_table is None]
    return [m for m in wanted if m in scores_seen]


def markdown_table(header: list[str], body: list[list[str]], best_columns: range | None = None) -> list[str]:
    """A Markdown table's lines: the header, right-aligned numeric columns, and the best value of each of
    `best_columns` in bold."""
    if best_columns is not None:
        for col in best_columns:
            values = [float(r[col].rstrip("†")) for r in body if r[col] not in ("", "–")]
            if len(values) > 1 and len(set(values)) > 1:  # a tie across every method marks nothing
                top = max(values)
                for r in body:
                    if r[col] not in ("", "–") and float(r[col].rstrip("†")) == top:
                        r[col] = f"**{r[col]}**"
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return lines


def render_markdown(summary: Sequence[SummaryRow], metrics: Sequence[str] | None = None) -> str:
    """Methods × (dataset, metric) in percent, averages per metric, best per column in bold (paper Table 2)."""
    datasets = list(dict.fromkeys(s.dataset for s in summary))
    methods = list(dict.fromkeys(s.method for s in ordered(list(summary))))
    by_key = {(s.dataset, s.method): s for s in summary}
    columns: list[tuple[str, str]] = []
    for dataset in datasets:
        seen = {m for s in summary if s.dataset == dataset for m in s.scores}
        columns += [(dataset, metric) for metric in _table_metrics(dataset, seen, metrics)]
    averaged = [m for m in METRICS if any(metric == m for _, metric in columns)]

    header = ["Method"]
    for dataset, metric in columns:
        info = dataset_info(dataset)
        header.append(f"{info.title if info else dataset} {METRICS[metric].label}")
    header += [f"Avg. {METRICS[m].label}" for m in averaged]
    body = []
    for method in methods:
        cells = [METHODS[method].title if method in METHODS else method]
        per_metric: dict[str, list[float]] = defaultdict(list)
        for dataset, metric in columns:
            s = by_key.get((dataset, method))
            if s is None or metric not in s.scores:
                cells.append("–")
                continue
            per_metric[metric].append(s.scores[metric])
            cells.append(f"{100 * s.scores[metric]:.2f}" + ("†" if s.failed else ""))
        for metric in averaged:
            complete = len(per_metric[metric]) == sum(1 for _, m in columns if m == metric)
            values = per_metric[metric]
            cells.append(f"{100 * sum(values) / len(values):.2f}" if values and complete else "–")
        body.append(cells)
    lines = markdown_table(header, body, range(1, len(header)))

    for name, metric in METRICS.items():  # a metric with a table of its own (math equivalence)
        if metric.own_table is not None:
            lines += _own_table(summary, methods, by_key, name, metric.own_table)

    if len({s.n for s in summary}) == 1 and not any(s.failed for s in summary):
        counts = f"{summary[0].n} per dataset and method" if summary else "none"
    else:
        counts = ", ".join(
            f"{s.dataset}/{s.method} {s.n}" + (f" ({s.failed} failed, left out)" if s.failed else "")
            for s in summary
        )
    lines += _cost_table(summary, methods)
    scoring = summary[0].scoring if summary else "paper"
    lines += [
        "",
        f"Scores in percent, scorer `{scoring}` ({SCORERS[scoring]}). Rows scored: {counts}.",
    ]
    if any(s.failed for s in summary):
        lines.append(
            "† some rows failed on the environment or agent and are left out: rerun the command to retry them."
        )
    return "\n".join(lines) + "\n"


def _own_table(
    summary: Sequence[SummaryRow], methods: list[str], by_key: dict, name: str, caption: str
) -> list[str]:
    """Metric `name` per method and dataset, in a table of its own under `caption`; nothing when no row has it."""
    rows = [s for s in summary if name in s.scores]
    if not rows:
        return []
    label = METRICS[name].label
    sets = list(dict.fromkeys(s.dataset for s in rows))
    header = ["Method"] + [f"{dataset_info(d).title if dataset_info(d) else d} {label}" for d in sets]
    body = []
    for method in methods:
        cells = [METHODS[method].title if method in METHODS else method]
        for dataset in sets:
            s = by_key.get((dataset, method))
            cells.append(f"{100 * s.scores[name]:.2f}" if s and name in s.scores else "–")
        body.append(cells)
    return ["", caption, "", *markdown_table(header, body, range(1, len(header)))]


def _cost_table(summary: Sequence[SummaryRow], methods: list[str]) -> list[str]:
    """Dollars per row for each dataset and method, the environment calls per row, and each method's total: what
    a point of accuracy costs. Nothing when no row recorded any usage (a `score` file without it)."""
    if not any(s.spend.get("env_calls") or s.spend.get("agent_input_tokens") for s in summary):
        return []
    datasets = list(dict.fromkeys(s.dataset for s in summary))
    by_key = {(s.dataset, s.method): s for s in summary}
    header = ["Method", *(f"{dataset_info(d).title if dataset_info(d) else d} $/row" for d in datasets)]
    header += ["Env calls/row", "Total $"]
    searched = any("search_calls" in s.spend for s in summary)
    if searched:
        header += ["Search calls", "Search $"]
    body = []
    for method in methods:
        groups = [by_key[(d, method)] for d in datasets if (d, method) in by_key]
        cells = [METHODS[method].title if method in METHODS else method]
        for dataset in datasets:
            s = by_key.get((dataset, method))
            per_row = s.spend.get("usd_per_row") if s else None
            cells.append("–" if per_row is None else f"{per_row:.6f}")
        rows = sum(s.n + s.failed for s in groups)
        calls = sum(s.spend.get("env_calls", 0) for s in groups)
        cells.append(f"{calls / rows:.2f}" if rows else "–")
        costs = [s.spend.get("cost_usd") for s in groups]
        cells.append("unpriced" if not costs or None in costs else f"{sum(costs):.6f}")
        if searched:
            found = [s for s in groups if "search_calls" in s.spend]
            dollars = [s.spend["search_usd"] for s in found]
            cells.append(str(sum(s.spend["search_calls"] for s in found)) if found else "–")
            cells.append("–" if not found else "unpriced" if None in dollars else f"{sum(dollars):.6f}")
        body.append(cells)
    lines = ["", "Cost (estimated from the price table; failed rows included, they were paid for):", ""]
    lines += markdown_table(header, body)
    missing = sum(s.spend.get("rows_without_cost", 0) for s in summary)
    if missing:
        lines += ["", f"{missing} rows have no recorded cost (written before costs were kept, or failed in this "
                  "code) and are left out of the dollars."]  # fmt: skip
    return lines


def write_reports(
    summary: Sequence[SummaryRow],
    out_dir: str | Path,
    *,
    stem: str = "",
    chart: bool = True,
    metrics: Sequence[str] | None = None,
    scoring: str | None = None,
) -> dict[str, Path]:
    """summary.csv, table.md and (with matplotlib) chart.png in `out_dir`; `stem` prefixes the file names, and a
    scorer other than the paper's names itself in them (summary.release.csv), so its tables never replace the
    paper scorer's."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scoring = scoring or (summary[0].scoring if summary else "paper")
    tail = "" if scoring == "paper" else f".{scoring}"
    written = {
        "csv": write_summary_csv(summary, out_dir / f"{stem}summary{tail}.csv"),
        "markdown": out_dir / f"{stem}table{tail}.md",
    }
    written["markdown"].write_text(render_markdown(summary, metrics), encoding="utf-8")
    if chart:
        png = write_chart(summary, out_dir / f"{stem}chart{tail}.png")
        if png is not None:
            written["chart"] = png
        png = write_cost_chart(summary, out_dir / f"{stem}cost{tail}.png")
        if png is not None:
            written["cost_chart"] = png
    return written
