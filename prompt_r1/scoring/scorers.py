"""The two scorers of an evaluation: `paper`, the paper's definitions (the default), and `release`, the rules of
the reference release's scripts, which produced its published numbers.

    summary = summarize(read_rows("release", rows), scoring="release")   # prompt_r1.evaluation.reports

`paper` (prompt_r1.scoring.metrics, Appendix F): substring match asks whether a golden answer is inside the prediction,
and a row without an answer earns nothing on any metric.

`release` (the public repository QwenQKing/Prompt-R1, `eval_scores.py` and `batch_inference.py`):
- substring match is two-way: the normalised golden answer inside the normalised prediction, or the prediction
  inside the golden answer; so an empty prediction (inside every text) scores SM = 1;
- semantic similarity is 1.0 when either side is empty after stripping, else the embeddings' cosine;
- exact match and token F1 are the paper's (two empty answers agree for F1; an empty against a non-empty one
  does not), with no rule that an empty prediction earns nothing;
- semantic similarity's best per row starts at 0, so a negative cosine counts 0;
- the prediction of a Prompt-R1 episode is read from its last agent turn as `batch_inference.py` reads it: the
  first `<answer>…</answer>` in it, stripped, else ""; an episode that ran out of turns is "Maximum turns
  reached without final answer" (also when it answered only because the loop asked it once more, which the
  release never does), and one whose context filled up "Maximum context length exceeded". Any other row (a
  baseline's, or a `score` file's) keeps its `prediction` as it is.

The release's loop also counts its turn budget differently (agent generations, where ours counts environment
calls): to run episodes the way its inference did, use `--no-force-final-answer` and a `--max-turns` one below
the release's.

Every report names the scorer it was made with, so tables from the two are never mixed up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from prompt_r1.core.errors import ConfigError
from prompt_r1.scoring.metrics import (
    METRICS,
    SemanticScorer,
    as_answer_list,
    default_semantic_scorer,
    normalize_answer,
    per_row_metrics,
)

__all__ = [
    "CONTEXT_EXCEEDED",
    "MAX_TURNS_REACHED",
    "SCORERS",
    "check_scorer",
    "metric_scores",
    "paper_scores",
    "read_rows",
    "release_prediction",
    "release_rows",
    "release_scores",
    "row_metrics",
]

SCORERS = {
    "paper": "the paper's definitions",
    "release": "the reference release's eval_scores.py and batch_inference.py",
}
MAX_TURNS_REACHED = "Maximum turns reached without final answer"
CONTEXT_EXCEEDED = "Maximum context length exceeded"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def check_scorer(name: str) -> str:
    if name not in SCORERS:
        raise ConfigError(f"unknown scorer {name!r}; choose from {', '.join(SCORERS)}")
    return name


def release_prediction(row: Mapping[str, Any]) -> str:
    """The prediction `batch_inference.py` would have recorded for this row (see the module docstring)."""
    if row.get("status") == "context_overflow":  # also when the very first turn did not fit
        return CONTEXT_EXCEEDED
    turns = row.get("turns")
    if not turns:
        return str(row.get("prediction") or "")
    last = turns[-1]
    # Turns used up: still prompting, or answering only because it was asked once more (force_final_answer),
    # which the release never does.
    if row.get("status") == "max_turns" or last.get("kind") == "prompt" or last.get("after_final_request"):
        return MAX_TURNS_REACHED
    found = _ANSWER.search(str(last.get("text") or ""))
    return found.group(1).strip() if found else ""


def release_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows with their `prediction` as the release reads it."""
    return [{**row, "prediction": release_prediction(row)} for row in rows]


def _two_way_substring(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction), normalize_answer(gold)
    return float(g in p or p in g)


def _best(score, prediction: str, golds: Sequence[str]) -> float:
    return max((score(prediction, gold) for gold in as_answer_list(golds)), default=0.0)


def _release_sm(predictions: Sequence[str], golds: Sequence[Sequence[str]], _semantic) -> list[float]:
    return [_best(_two_way_substring, p, gs) for p, gs in zip(predictions, golds, strict=True)]


def _release_ssim(predictions: Sequence[str], golds: Sequence[Sequence[str]], semantic) -> list[float]:
    # Each row's best starts at 0 there, so a negative cosine counts 0.
    scores = (semantic or default_semantic_scorer()).similarity_batch(predictions, golds, empty_score=1.0)
    return [max(0.0, score) for score in scores]


# Where the release's rules differ from the registry's metric; every other metric is scored as the registry does
# (its exact match and F1 are the paper's, without the rule that an empty prediction earns nothing; it has no
# math-aware column, so ours is reported beside EM as it is).
_RELEASE_RULES = {"sm": _release_sm, "ssim": _release_ssim}


def release_scores(
    name: str,
    predictions: Sequence[str],
    golds: Sequence[Sequence[str]],
    semantic: SemanticScorer | None = None,
) -> list[float]:
    """Metric `name` per row under the release's rules (see the module docstring)."""
    if name in _RELEASE_RULES:
        return _RELEASE_RULES[name](predictions, golds, semantic)
    if name not in METRICS:
        raise ConfigError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}")
    return METRICS[name](predictions, golds)


def paper_scores(
    name: str,
    predictions: Sequence[str],
    golds: Sequence[Sequence[str]],
    semantic: SemanticScorer | None = None,
) -> list[float]:
    """Metric `name` per row under the paper's definitions: a row without an answer earns nothing, even against a
    golden answer that normalises to "" (which an empty prediction would otherwise match)."""
    if name not in METRICS:
        raise ConfigError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}")
    if name == "ssim" and semantic is not None:  # a caller's own embedding model
        values = semantic.similarity_batch(predictions, golds)
    else:
        values = METRICS[name](predictions, golds)
    return [
        value if prediction.strip() else 0.0 for value, prediction in zip(values, predictions, strict=True)
    ]


# Each scorer: how it reads a row's prediction, and how it scores a metric.
_READINGS = {"paper": lambda rows: [dict(row) for row in rows], "release": release_rows}
_RULES = {"paper": paper_scores, "release": release_scores}


def read_rows(scoring: str, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows with their `prediction` as scorer `scoring` reads it."""
    return _READINGS[check_scorer(scoring)](rows)


def metric_scores(
    scoring: str,
    name: str,
    predictions: Sequence[str],
    golds: Sequence[Sequence[str]],
    semantic: SemanticScorer | None = None,
) -> list[float]:
    """Metric `name` per row under scorer `scoring`'s rules."""
    return _RULES[check_scorer(scoring)](name, predictions, golds, semantic)


def row_metrics(prediction: str, golden_answers: Sequence[str]) -> dict[str, float]:
    """The cheap metrics (`per_row_metrics()`: EM, SM, F1) of one row under the paper's definitions, stored with
    each result row of `batch` and `eval` for the progress bar and quick inspection.

    >>> row_metrics("Paris", ["Paris", "Lyon"])
    {'em': 1.0, 'sm': 1.0, 'f1': 1.0}
    """
    return {name: paper_scores(name, [prediction], [golden_answers])[0] for name in per_row_metrics()}
