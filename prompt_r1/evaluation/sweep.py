"""An evaluation over several environments (the paper's Figures 4 and 5): the same methods against each endpoint,
one output folder each, then one report of datasets × environments, each with and without the agent.

    prompt-r1 eval --suite paper-main --method prompt-r1 --method env-only \
        --env-model gpt-4o-mini --env-base-url https://api.openai.com/v1 --env-api-key-env OPENAI_API_KEY \
        --env-model my-llama --env-base-url http://127.0.0.1:8000/v1 --env-api-key-env NO_KEY

A sweep is not `--env-pool`: a pool routes each episode to one of several endpoints to spread load, where a sweep
runs every row against every endpoint to compare them. Each environment's folder (`OUT/<name>/`) is an ordinary
eval folder: resumable, with its own settings file, predictions and reports.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from prompt_r1.core.config import EnvironmentConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.data.datasets import dataset_info
from prompt_r1.evaluation.reports import markdown_table
from prompt_r1.scoring.metrics import METRICS, table_metrics

__all__ = ["SWEEP_FIELDS", "environment_sweep", "write_sweep_report"]

# The environment settings that may be given once per environment (the rest are shared by all of them).
SWEEP_FIELDS = ("model", "base_url", "api_key_env")
WITH, WITHOUT = "prompt-r1", "env-only"  # the paper's "w/ Prompt-R1" and "w/o" of Figures 4 and 5


def _name(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-.") or "environment"


def environment_sweep(
    base: EnvironmentConfig, given: Mapping[str, Sequence[str] | None]
) -> list[tuple[str, EnvironmentConfig]]:
    """(folder name, settings) per environment: the i-th `--env-model` with the i-th `--env-base-url` and
    `--env-api-key-env`; one of those given once applies to every environment. A single environment is a list
    of one."""
    models = list(given.get("model") or [base.model])
    lists = {"model": models}
    for name in SWEEP_FIELDS[1:]:
        values = list(given.get(name) or [])
        if len(values) not in (0, 1, len(models)):
            flag = "--env-" + name.replace("_", "-")
            raise ConfigError(
                f"{len(models)} --env-model given but {len(values)} {flag}: give one {flag} per --env-model, "
                "in the same order, or one for all"
            )
        lists[name] = values * len(models) if len(values) == 1 else values
    configs = [
        dataclasses.replace(base, **{n: v[i] for n, v in lists.items() if v}) for i in range(len(models))
    ]
    names = [_name(model) for model in models]
    sweep = []
    for name, config in zip(names, configs, strict=True):
        if names.count(name) > 1:
            # The same model at several endpoints: each folder is named by its endpoint too, so a rerun that lists
            # them in another order resumes each from its own rows (a folder's settings leave the URL out).
            digest = hashlib.sha256(str(config.base_url).encode()).hexdigest()[:8]
            name = f"{name}-{digest}"
        sweep.append((name, config))
    if len({name for name, _ in sweep}) < len(sweep):
        raise ConfigError("the same environment (model and --env-base-url) is listed twice in the sweep")
    return sweep


def _primary(dataset: str) -> str:
    """The metric a dataset's figure shows, the paper's first column: F1 for text generation, else EM (a dataset of
    the user's own is read as QA)."""
    info = dataset_info(dataset)
    return table_metrics(info.task if info is not None else "qa")[0]


def write_sweep_report(
    summaries: Mapping[str, Sequence], out_dir: str | Path, *, chart: bool = True, scoring: str = "paper"
) -> dict[str, Path]:
    """sweep.csv (every environment × dataset × method score and cost), sweep.md (environments × datasets, with
    and without the agent, the paper's Figure 4/5 layout) and sweep.png, from each environment's summary rows
    (prompt_r1.evaluation.reports.SummaryRow). A scorer other than the paper's names itself in the file names
    (sweep.release.md), as the folders' own reports do."""
    out_dir = Path(out_dir)
    tail = "" if scoring == "paper" else f".{scoring}"
    csv_path, md_path = out_dir / f"sweep{tail}.csv", out_dir / f"sweep{tail}.md"
    rows = [(env, s) for env, summary in summaries.items() for s in summary]
    metrics = sorted({m for _, s in rows for m in s.scores})
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["environment", "dataset", "method", "n", "failed", *metrics, "usd_per_row", "scorer"]
        )
        for env, s in rows:
            per_row = s.spend.get("usd_per_row")
            writer.writerow(
                [
                    env,
                    s.dataset,
                    s.method,
                    s.n,
                    s.failed,
                    *(f"{s.scores[m]:.6f}" if m in s.scores else "" for m in metrics),
                    "" if per_row is None else per_row,
                    s.scoring,
                ]  # fmt: skip
            )
    datasets = list(dict.fromkeys(s.dataset for _, s in rows))
    by_key = {(env, s.dataset, s.method): s for env, s in rows}
    header = ["Environment"]
    for dataset in datasets:
        info = dataset_info(dataset)
        title = f"{info.title if info else dataset} {METRICS[_primary(dataset)].label}"
        header += [f"{title} w/ agent", f"{title} w/o"]
    body = []
    for env in summaries:
        cells = [env]
        for dataset in datasets:
            for method in (WITH, WITHOUT):
                s = by_key.get((env, dataset, method))
                metric = _primary(dataset)
                cells.append(f"{100 * s.scores[metric]:.2f}" if s and metric in s.scores else "–")
        body.append(cells)
    lines = markdown_table(header, body)
    lines += ["", f"Scores in percent, scorer `{scoring}`; w/ agent: `{WITH}`, w/o: `{WITHOUT}`. Each "
              "environment's own tables, costs and predictions are in its folder."]  # fmt: skip
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    written = {"csv": csv_path, "markdown": md_path}
    png = _sweep_chart(summaries, datasets, out_dir / f"sweep{tail}.png") if chart else None
    if png is not None:
        written["chart"] = png
    return written


def _sweep_chart(summaries: Mapping[str, Sequence], datasets: list[str], path: Path) -> Path | None:
    """One panel per dataset: each environment's score with and without the agent, side by side."""
    if not datasets:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(summaries)
    fig, axes = plt.subplots(1, len(datasets), figsize=(max(4.0, 2.6 * len(datasets)), 3.6), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        metric = _primary(dataset)
        for offset, method in ((-0.2, WITH), (0.2, WITHOUT)):
            values = []
            for env in envs:
                s = next((s for s in summaries[env] if s.dataset == dataset and s.method == method), None)
                values.append(100 * s.scores[metric] if s and metric in s.scores else float("nan"))
            label = "w/ agent" if method == WITH else "w/o agent"
            ax.bar([i + offset for i in range(len(envs))], values, 0.4, label=label)
        info = dataset_info(dataset)
        ax.set_title(f"{info.title if info else dataset} {METRICS[metric].label}", fontsize="small")
        ax.set_xticks(range(len(envs)))
        ax.set_xticklabels(envs, rotation=30, ha="right", fontsize="x-small")
    axes[0][0].legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
