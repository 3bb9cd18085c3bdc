"""The charts of an evaluation's summary: a metric per dataset and method, and accuracy against dollars.

    write_chart(summary, "eval-results/chart.png")      # F1 per dataset, one bar per method
    write_cost_chart(summary, "eval-results/cost.png")  # F1 (EM where there is none) against $ per row

They read the summary rows of prompt_r1.evaluation.reports (dataset, method, scores, spend, scoring) and draw with matplotlib
on its file-only backend, so no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prompt_r1.data.datasets import dataset_info
from prompt_r1.evaluation.plan import METHODS, ordered
from prompt_r1.scoring.metrics import METRICS

__all__ = ["write_chart", "write_cost_chart"]


def _title(method: str) -> str:
    return METHODS[method].title if method in METHODS else method


def _dataset_title(dataset: str) -> str:
    info = dataset_info(dataset)
    return info.title if info else dataset


def write_chart(summary: Sequence[Any], path: str | Path, metric: str = "f1") -> Path | None:
    """A grouped bar chart of `metric` per dataset, one bar per method; None if nothing has that metric."""
    points = [s for s in summary if metric in s.scores]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(s.dataset for s in points))
    methods = list(dict.fromkeys(s.method for s in ordered(points)))
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
        ax.bar(positions, values, width, label=_title(method))
    ax.set_xticks(range(len(datasets)))
    ax.set_xticklabels([_dataset_title(d) for d in datasets], rotation=30, ha="right")
    ax.set_ylabel(f"{METRICS[metric].label} (%)")
    scoring = points[0].scoring
    ax.set_title(
        f"{METRICS[metric].label} by dataset and method"
        + (f" (scorer: {scoring})" if scoring != "paper" else "")
    )
    return _save(fig, ax, path)


def write_cost_chart(summary: Sequence[Any], path: str | Path) -> Path | None:
    """Accuracy against dollars per row: one point per dataset and method (F1, else EM); None when no group is
    both priced and scored."""
    points = [
        s
        for s in summary
        if s.spend.get("usd_per_row") is not None and ("f1" in s.scores or "em" in s.scores)
    ]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    methods = list(dict.fromkeys(s.method for s in ordered(points)))
    markers = "osD^v<>px*"
    for i, method in enumerate(methods):
        mine = [s for s in points if s.method == method]
        xs = [s.spend["usd_per_row"] for s in mine]
        ys = [100 * s.scores.get("f1", s.scores.get("em", 0.0)) for s in mine]
        ax.scatter(
            xs,
            ys,
            marker=markers[i % len(markers)],
            label=_title(method),
        )
        for s, x, y in zip(mine, xs, ys, strict=True):
            ax.annotate(
                _dataset_title(s.dataset),
                (x, y),
                fontsize="x-small",
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.set_xlabel("estimated $ per row")
    ax.set_ylabel("F1 (%) (EM where there is no F1)")
    ax.set_title("Accuracy against cost")
    return _save(fig, ax, path)


def _save(fig: Any, ax: Any, path: str | Path) -> Path:
    """The legend, a tight layout, the PNG written and the figure closed (pyplot keeps every open one)."""
    import matplotlib.pyplot as plt

    ax.legend(fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
