"""The evaluation harness behind `prompt-r1 eval` and `prompt-r1 score`: the paper's Tables 2–4 on your models.

A run evaluates methods on datasets and keeps everything in one output folder:

    predictions.jsonl   one row per (method, dataset, sample), appended as each finishes; a rerun skips the
                        finished ones (rows that failed on the environment or agent are retried)
    run.json            the settings each method ran with; a rerun with different ones is refused
    summary.csv         per dataset and method: rows scored, rows failed, EM, SM, F1, SSim, math equivalence
    table.md            the paper's Table 2 layout: methods × (dataset, metric), with averages
    chart.png           F1 per dataset, one bar per method

Methods: `prompt-r1` (the agent ⇄ environment loop, through the same graph and client as `prompt-r1 run`),
`env-only` (the question straight to the environment: the paper's "w/o agent"), `agent-only` (the agent answers
alone: "w/o env"), `env-cot` (a chain-of-thought prompt to the environment). The baselines ask for the answer in
`<answer>` tags; a reply without them is scored as a whole and marked `answer_tagged: false`.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prompt_r1 import redaction
from prompt_r1.agents.base import AgentBackend, AgentRequest
from prompt_r1.config import LoopConfig
from prompt_r1.data import DATASETS, Sample, dataset_info, jsonl_rows
from prompt_r1.errors import (
    AgentError,
    AgentRefused,
    ConfigError,
    ContextOverflow,
    EnvironmentCallError,
    EnvironmentRefused,
)
from prompt_r1.metrics import METRICS, SemanticScorer, as_answer_list
from prompt_r1.prompts import CHAIN_OF_THOUGHT_TEMPLATE, DIRECT_ANSWER_TEMPLATE
from prompt_r1.protocol import ANSWER_CLOSE, last_answer
from prompt_r1.results_file import open_results_file
from prompt_r1.rewards import PRESETS, score_episode

__all__ = [
    "FAILED_STATUSES",
    "METHODS",
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

PREDICTIONS, MANIFEST = "predictions.jsonl", "run.json"
# Rows with these statuses are infrastructure failures: not scored, and retried by a rerun.
FAILED_STATUSES = frozenset({"environment_error", "agent_error"})


@dataclass(frozen=True)
class MethodInfo:
    title: str  # the row label of the tables
    needs_agent: bool
    needs_environment: bool


METHODS: dict[str, MethodInfo] = {
    "prompt-r1": MethodInfo("Prompt-R1", needs_agent=True, needs_environment=True),
    "env-only": MethodInfo("Env only (w/o agent)", needs_agent=False, needs_environment=True),
    "agent-only": MethodInfo("Agent only (w/o env)", needs_agent=True, needs_environment=False),
    "env-cot": MethodInfo("Env CoT", needs_agent=False, needs_environment=True),
}


@dataclass(frozen=True)
class Suite:
    datasets: tuple[str, ...]
    methods: tuple[str, ...]  # used when no --method is given
    description: str


_MAIN = tuple(name for name, info in DATASETS.items() if info.split == "main")
_OOD = tuple(name for name, info in DATASETS.items() if info.split == "ood")
SUITES: dict[str, Suite] = {
    "paper-main": Suite(_MAIN, ("prompt-r1", "env-only", "env-cot"), "the 8 in-distribution sets (Table 2)"),
    "paper-ood": Suite(
        _OOD, ("prompt-r1", "env-only", "env-cot"), "the 4 out-of-distribution sets (Table 3)"
    ),
    "ablation": Suite(_MAIN, ("prompt-r1", "agent-only", "env-only"), "w/o agent and w/o env (Table 4)"),
}


def resolve_plan(
    suite: str | None, datasets: Sequence[str] | None, methods: Sequence[str] | None
) -> tuple[list[str], list[str]]:
    """The datasets and methods of a run: a suite's, extended by explicit datasets; explicit methods win."""
    if suite is not None and suite not in SUITES:
        raise ConfigError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    chosen = list(SUITES[suite].datasets) if suite else []
    for name in datasets or []:
        if name not in chosen:
            chosen.append(name)
    if not chosen:
        raise ConfigError("nothing to evaluate: give --suite or at least one --dataset")
    picked = list(dict.fromkeys(methods or (SUITES[suite].methods if suite else ("prompt-r1",))))
    unknown = [m for m in picked if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    return chosen, picked


def _key(row: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(row["method"]), str(row["dataset"]), str(row["id"]))


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


# Settings that change how a run reaches its endpoints but not what it measures; a resumed run may change them
# (a server that moved to another port keeps its model name).
_OPERATIONAL = {
    "base_url",
    "api_key_env",
    "rate_limit",
    "rate_period",
    "max_in_flight",
    "tokens_per_minute",
    "timeout",
    "max_retries",
    "backoff_initial",
    "backoff_max",
    "max_retry_after",
    "device",
}


def _measured(config: Any) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in _OPERATIONAL}


def _method_settings(method: str, agent_config: Any, environment_config: Any, loop: LoopConfig) -> dict:
    info = METHODS[method]
    settings: dict[str, Any] = {}
    if info.needs_agent and agent_config is not None:
        settings["agent"] = _measured(agent_config)
    if info.needs_environment and environment_config is not None:
        settings["environment"] = _measured(environment_config)
    if method == "prompt-r1":
        settings["loop"] = dataclasses.asdict(loop)
    return settings


def _read_settings(path: Path) -> dict[str, Any]:
    """The settings file of an evaluation folder, or a `ConfigError` when the file there is not one."""
    if not path.exists():
        return {"methods": {}}
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        recorded = None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("methods"), dict):
        raise ConfigError(
            f"{path} is not the settings file of a prompt-r1 eval folder; it was left untouched: use another --out"
        )
    return recorded


def record_settings(
    out_dir: str | Path,
    methods: Sequence[str],
    *,
    agent_config: Any = None,
    environment_config: Any = None,
    loop: LoopConfig | None = None,
) -> None:
    """Refuse to mix rows produced under different settings in one folder; record the settings otherwise.

    Only what changes results is compared (models, sampling, loop); endpoints, limits and retries may change.
    """
    loop = loop or LoopConfig()
    settings = {m: _method_settings(m, agent_config, environment_config, loop) for m in methods}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / MANIFEST
    recorded = _read_settings(path)
    for method, current in settings.items():
        before = recorded["methods"].get(method)
        if before is None or before == current:
            continue
        changes = []
        for section in sorted(set(before) | set(current)):
            old, new = before.get(section, {}), current.get(section, {})
            for name in sorted(set(old) | set(new)):
                if old.get(name) != new.get(name):
                    changes.append(f"{section}.{name}: {old.get(name)!r} → {new.get(name)!r}")
        raise ConfigError(
            f"{out_dir} holds {method} rows made with other settings ({'; '.join(changes)}); "
            "use another --out folder, or the same settings to resume"
        )
    recorded["methods"].update(settings)
    path.write_text(json.dumps(recorded, indent=2, ensure_ascii=False) + "\n")


def _scores(
    name: str,
    predictions: Sequence[str],
    golds: Sequence[Sequence[str]],
    scorer: SemanticScorer | None = None,
) -> list[float]:
    """Metric `name` per row; a row without an answer earns nothing, even against a golden answer that
    normalises to "" (which an empty prediction would otherwise match)."""
    if name == "ssim" and scorer is not None:
        values = scorer.similarity_batch(predictions, golds)
    else:
        values = METRICS[name](predictions, golds)
    return [
        value if prediction.strip() else 0.0 for value, prediction in zip(values, predictions, strict=True)
    ]


def _row_metrics(prediction: str, golden_answers: Sequence[str]) -> dict[str, float]:
    """The cheap metrics, stored with each row for the progress bar and quick inspection."""
    return {name: _scores(name, [prediction], [golden_answers])[0] for name in ("em", "sm", "f1")}


@dataclass
class RunOutcome:
    """What one call of `run_evaluation` did."""

    written: int  # rows finished and written by this call
    failed: int  # rows written with a failed status (retried by the next run)
    skipped: int  # rows already finished in the folder
    seconds: float


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
    progress: bool = True,
) -> RunOutcome:
    """Run every method on every sample not yet finished in `out_dir`, appending rows as they finish."""
    from prompt_r1.graph import build_graph

    loop = loop or LoopConfig()
    if concurrency < 1:
        raise ConfigError(f"concurrency must be ≥ 1, got {concurrency}")
    for method in methods:
        info = METHODS[method]
        if info.needs_agent and agent is None:
            raise ConfigError(f"method {method} needs an agent")
        if info.needs_environment and environment is None:
            raise ConfigError(f"method {method} needs an environment")
    out_dir = Path(out_dir)
    record_settings(
        out_dir, methods, agent_config=agent_config, environment_config=environment_config, loop=loop
    )

    predictions_path = out_dir / PREDICTIONS
    # The folder's rows are checked before anything is appended: a file there that is not ours is left untouched.
    open_results_file(predictions_path, row_prefix='{"method": ', what="predictions file")
    questions = {(s.dataset, s.id): s.question for s in samples}
    finished = set()
    for row in read_predictions(predictions_path):
        key = (str(row["dataset"]), str(row["id"]))
        if key in questions and row.get("question") != questions[key]:
            raise ConfigError(
                f"{out_dir} has a row {row['dataset']}/{row['id']} for another question: the dataset changed, or "
                "another file has the same name; use another --out folder"
            )
        if row.get("status") not in FAILED_STATUSES:
            finished.add(_key(row))
    pending = [
        (method, sample)
        for sample in samples
        for method in methods
        if (method, sample.dataset, sample.id) not in finished
    ]
    skipped = len(samples) * len(methods) - len(pending)
    graph = None
    if "prompt-r1" in methods:
        graph = build_graph(agent, environment, **loop.graph_options())

    async def evaluate(method: str, sample: Sample) -> dict[str, Any]:
        row: dict[str, Any] = {
            "method": method,
            "dataset": sample.dataset,
            "id": sample.id,
            "index": sample.index,
            "question": sample.question,
            "golden_answers": sample.golden_answers,
        }
        started = time.monotonic()
        prediction, status, error = "", "answered", None
        try:
            if method == "prompt-r1":
                result = await graph.ainvoke(
                    {"question": sample.question, "golden_answers": sample.golden_answers}
                )
                status, error = result["status"], result.get("error")
                prediction = result.get("answer") or ""
                row["turns"] = result.get("turns", [])
                row["usage"] = result.get("usage", {})
                row["reward"] = {name: score_episode(result, preset=name).total for name in PRESETS}
            else:
                template = CHAIN_OF_THOUGHT_TEMPLATE if method == "env-cot" else DIRECT_ANSWER_TEMPLATE
                request = template.format(question=sample.question)
                if method == "agent-only":
                    output = await agent.generate(
                        AgentRequest(messages=[{"role": "user", "content": request}], stop=(ANSWER_CLOSE,))
                    )
                    text = output.text
                    row["usage"] = {
                        "agent_calls": 1,
                        "agent_prompt_tokens": output.prompt_tokens,
                        "agent_completion_tokens": output.completion_tokens,
                    }
                else:
                    reply = await environment.respond(request)
                    text = reply.text
                    row["usage"] = {
                        "env_calls": 1,
                        "env_input_tokens": reply.input_tokens,
                        "env_output_tokens": reply.output_tokens,
                        "env_retries": reply.attempts - 1,
                    }
                row["response"] = text
                tagged = last_answer(text)
                row["answer_tagged"] = tagged is not None
                prediction = tagged if tagged is not None else text.strip()
                status = "answered" if tagged is not None else "untagged"
        except EnvironmentRefused as exc:  # an outcome, as in the loop: not retried by the next run
            status, error = "refused", str(exc)
        except EnvironmentCallError as exc:
            status, error = "environment_error", str(exc)
        except ContextOverflow as exc:
            status, error = "context_overflow", str(exc)
        except AgentRefused as exc:
            status, error = "refused", str(exc)
        except AgentError as exc:
            status, error = "agent_error", str(exc)
        row.update(
            prediction=prediction, status=status, error=error, latency_s=round(time.monotonic() - started, 3)
        )
        if status not in FAILED_STATUSES:
            row["metrics"] = _row_metrics(prediction, sample.golden_answers)
        return row

    from tqdm.auto import tqdm

    bar = tqdm(total=len(pending), desc="eval", unit="row", disable=not progress, dynamic_ncols=True)
    running: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # method → [n, Σ EM, Σ F1]
    failed = 0
    semaphore = asyncio.Semaphore(concurrency)
    started = time.monotonic()

    async def guarded(method: str, sample: Sample) -> dict[str, Any]:
        async with semaphore:
            return await evaluate(method, sample)

    written = 0
    with predictions_path.open("a", encoding="utf-8") as handle:
        tasks = [asyncio.create_task(guarded(m, s)) for m, s in pending]
        try:
            for next_done in asyncio.as_completed(tasks):
                row = await next_done
                handle.write(redaction.json_line(row))
                handle.flush()
                written += 1
                if row["status"] in FAILED_STATUSES:
                    failed += 1
                else:
                    stats = running[row["method"]]
                    stats[0] += 1
                    stats[1] += row["metrics"]["em"]
                    stats[2] += row["metrics"]["f1"]
                bar.update(1)
                bar.set_postfix_str(
                    " · ".join(f"{m} EM {s[1] / s[0]:.3f} F1 {s[2] / s[0]:.3f}" for m, s in running.items())
                    + (f" · failed {failed}" if failed else ""),
                    refresh=False,
                )
        finally:
            for task in tasks:
                task.cancel()
            bar.close()
    return RunOutcome(written=written, failed=failed, skipped=skipped, seconds=time.monotonic() - started)


# ----------------------------------------------------------------------------------------------------------------
# Scoring and reports


@dataclass
class SummaryRow:
    dataset: str
    method: str
    n: int  # rows scored
    failed: int  # rows left out because the environment or agent failed
    scores: dict[str, float]  # metric name → mean over the scored rows (0–1)


def _metrics_for(dataset: str, requested: Sequence[str] | None) -> list[str]:
    if requested:
        return list(requested)
    info = dataset_info(dataset)
    names = ["em", "sm", "f1"]
    if info is not None and info.task == "text":
        names.append("ssim")
    if info is not None and info.task == "math":
        try:
            import math_verify  # noqa: F401

            names.append("math")
        except ImportError:
            pass
    return names


def summarize(
    rows: Iterable[Mapping[str, Any]],
    *,
    metrics: Sequence[str] | None = None,
    scorer: SemanticScorer | None = None,
) -> list[SummaryRow]:
    """Mean scores per (dataset, method). By default: EM, SM and F1 everywhere, SSim on the text-generation
    sets, math equivalence on the math sets; `metrics` picks the metrics for every dataset instead."""
    unknown = [m for m in metrics or () if m not in METRICS]
    if unknown:
        raise ConfigError(f"unknown metric(s) {', '.join(unknown)}; choose from {', '.join(METRICS)}")
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    failed: dict[tuple[str, str], int] = defaultdict(int)
    for row in rows:
        key = (str(row["dataset"]), str(row["method"]))
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
            values = _scores(name, predictions, golds, scorer)
            scores[name] = sum(values) / len(values)
        summary.append(SummaryRow(dataset, method, len(members), failed[(dataset, method)], scores))
    return _ordered(summary)


def _ordered(summary: list[SummaryRow]) -> list[SummaryRow]:
    dataset_rank = {name: i for i, name in enumerate(DATASETS)}
    method_rank = {name: i for i, name in enumerate(METHODS)}
    return sorted(
        summary,
        key=lambda s: (
            dataset_rank.get(s.dataset, len(dataset_rank)),
            s.dataset,
            method_rank.get(s.method, len(method_rank)),
            s.method,
        ),
    )


_COLUMNS = ("em", "sm", "f1", "ssim", "math")
_LABELS = {"em": "EM", "sm": "SM", "f1": "F1", "ssim": "SSim", "math": "MathEq"}


def write_summary_csv(summary: Sequence[SummaryRow], path: str | Path) -> Path:
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["dataset", "title", "method", "n", "failed", *_COLUMNS])
        for s in summary:
            info = dataset_info(s.dataset)
            writer.writerow(
                [
                    s.dataset,
                    info.title if info else s.dataset,
                    s.method,
                    s.n,
                    s.failed,
                    *(f"{s.scores[c]:.6f}" if c in s.scores else "" for c in _COLUMNS),
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
        wanted = [m for m in _COLUMNS if m != "math"]
    return [m for m in wanted if m in scores_seen]


def _markdown_table(header: list[str], body: list[list[str]], best_columns: range | None = None) -> list[str]:
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
    methods = list(dict.fromkeys(s.method for s in _ordered(list(summary))))
    by_key = {(s.dataset, s.method): s for s in summary}
    columns: list[tuple[str, str]] = []
    for dataset in datasets:
        seen = {m for s in summary if s.dataset == dataset for m in s.scores}
        columns += [(dataset, metric) for metric in _table_metrics(dataset, seen, metrics)]
    averaged = [m for m in _COLUMNS if any(metric == m for _, metric in columns)]

    header = ["Method"]
    for dataset, metric in columns:
        info = dataset_info(dataset)
        header.append(f"{info.title if info else dataset} {_LABELS[metric]}")
    header += [f"Avg. {_LABELS[m]}" for m in averaged]
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
    lines = _markdown_table(header, body, range(1, len(header)))

    math_rows = [s for s in summary if "math" in s.scores]
    if math_rows:
        lines += ["", "Math-aware equivalence (math-verify), reported beside EM, never replacing it:", ""]
        math_sets = list(dict.fromkeys(s.dataset for s in math_rows))
        header = ["Method"] + [f"{dataset_info(d).title if dataset_info(d) else d} MathEq" for d in math_sets]
        body = []
        for method in methods:
            cells = [METHODS[method].title if method in METHODS else method]
            for dataset in math_sets:
                s = by_key.get((dataset, method))
                cells.append(f"{100 * s.scores['math']:.2f}" if s and "math" in s.scores else "–")
            body.append(cells)
        lines += _markdown_table(header, body, range(1, len(header)))

    if len({s.n for s in summary}) == 1 and not any(s.failed for s in summary):
        counts = f"{summary[0].n} per dataset and method" if summary else "none"
    else:
        counts = ", ".join(
            f"{s.dataset}/{s.method} {s.n}" + (f" ({s.failed} failed, left out)" if s.failed else "")
            for s in summary
        )
    lines += ["", f"Scores in percent. Rows scored: {counts}."]
    if any(s.failed for s in summary):
        lines.append(
            "† some rows failed on the environment or agent and are left out: rerun the command to retry them."
        )
    return "\n".join(lines) + "\n"


def write_chart(summary: Sequence[SummaryRow], path: str | Path, metric: str = "f1") -> Path | None:
    """A grouped bar chart of `metric` per dataset, one bar per method; None if nothing has that metric."""
    points = [s for s in summary if metric in s.scores]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(s.dataset for s in points))
    methods = list(dict.fromkeys(s.method for s in _ordered(points)))
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(datasets) + 2), 4.0))
    for i, method in enumerate(methods):
        # A (dataset, method) pair that was not scored gets no bar rather than a bar at 0.
        values = [
            next(
                (100 * s.scores[metric] for s in points if s.dataset == d and s.method == method),
                float("nan"),
            )
            for d in datasets
        ]
        positions = [x + (i - (len(methods) - 1) / 2) * width for x in range(len(datasets))]
        ax.bar(positions, values, width, label=METHODS[method].title if method in METHODS else method)
    ax.set_xticks(range(len(datasets)))
    ax.set_xticklabels(
        [dataset_info(d).title if dataset_info(d) else d for d in datasets], rotation=30, ha="right"
    )
    ax.set_ylabel(f"{_LABELS[metric]} (%)")
    ax.set_title(f"{_LABELS[metric]} by dataset and method")
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_reports(
    summary: Sequence[SummaryRow],
    out_dir: str | Path,
    *,
    stem: str = "",
    chart: bool = True,
    metrics: Sequence[str] | None = None,
) -> dict[str, Path]:
    """summary.csv, table.md and (with matplotlib) chart.png in `out_dir`; `stem` prefixes the file names."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {
        "csv": write_summary_csv(summary, out_dir / f"{stem}summary.csv"),
        "markdown": out_dir / f"{stem}table.md",
    }
    written["markdown"].write_text(render_markdown(summary, metrics), encoding="utf-8")
    if chart:
        png = write_chart(summary, out_dir / f"{stem}chart.png")
        if png is not None:
            written["chart"] = png
    return written
