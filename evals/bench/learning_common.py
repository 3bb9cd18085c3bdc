"""What the learning benchmark's tasks share (`evals/bench/learning.py`, `learning_hops.py`): the windows, the
held-out table, the GRPO fields recorded per seed, and the async run's staleness figures."""

from __future__ import annotations

import math
import statistics

WINDOW = 10  # steps averaged at each end of the curve
HELD_OUT_STEP = 10**9  # the evaluation's table: one no training run reaches
COLLAPSE = 0.3  # reward drop from the best ten-step window that counts as a collapse
GRPO_FIELDS = (
    "learning_rate",
    "beta",
    "loss_type",
    "epsilon",
    "num_iterations",
    "mask_truncated_completions",
    "temperature",
)


def async_figures(log_history: list[dict]) -> dict:
    """The async run's staleness, drops and importance ratios over its steps."""

    def values(key: str) -> list[float]:
        return [row[key] for row in log_history if row.get(key) is not None and "step" in row]

    ratio = values("ratio")
    return {
        "staleness_mean": statistics.fmean(values("sample/staleness_mean") or [math.nan]),
        "staleness_max": max(values("sample/staleness_max"), default=math.nan),
        "dropped_stale": sum(values("sample/dropped_stale_total")),
        "ratio_range": [min(ratio, default=math.nan), max(ratio, default=math.nan)],
    }
