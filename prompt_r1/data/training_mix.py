"""The paper's training mix: 8 tasks × 5,120 questions in the release's row schema, built from the source
datasets (files you have, or the hub), and written as parquet or JSONL.

    rows = build_training_mix(per_source=5120, seed=0)
    write_rows(rows, "training/data/mix.parquet")
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prompt_r1.core.errors import BackendUnavailable, DataError
from prompt_r1.core.prompts import question_message
from prompt_r1.data.datasets import read_rows
from prompt_r1.scoring.metrics import as_answer_list

__all__ = ["SOURCES", "SourceSpec", "build_training_mix", "release_row", "write_rows"]


def release_row(question: str, golden_answers: Sequence[str], data_source: str) -> dict[str, Any]:
    """A row in the release's schema: the question wrapped in the instruction template, the answers as the
    reward model's ground truth."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question_message(question)}],
        "ability": "multihop_qa",  # the release's value for every row, kept for compatibility
        "reward_model": {"style": "rule", "ground_truth": [str(a) for a in golden_answers]},
    }


def _flashrag(row: Mapping[str, Any]) -> tuple[str, list[str]]:
    return row["question"], as_answer_list(row["golden_answers"], numbers=True)


def _gsm8k(row: Mapping[str, Any]) -> tuple[str, list[str]]:
    # GSM8K answers are worked solutions ending in "#### 72"; the golden answer is that final number.
    final = str(row["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")
    return row["question"], [final]


def _dapo(row: Mapping[str, Any]) -> tuple[str, list[str]]:
    prompt = row["prompt"]
    question = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
    truth = row["reward_model"]["ground_truth"]
    return question, [truth] if isinstance(truth, str) else list(truth)


_ARTICLE_REQUEST = "Please write a short article based on the given title: {title}"


def _titled(title_key: str, text_key: str) -> Callable[[Mapping[str, Any]], tuple[str, list[str]]]:
    def convert(row: Mapping[str, Any]) -> tuple[str, list[str]]:
        return _ARTICLE_REQUEST.format(title=str(row[title_key]).strip()), [str(row[text_key])]

    return convert


@dataclass(frozen=True)
class SourceSpec:
    """Where one task of the training mix comes from on the Hugging Face hub and how a row becomes
    (question, golden answers). Local files in the same raw format go through the same `convert`."""

    hub_id: str
    config: str | None
    split: str
    convert: Callable[[Mapping[str, Any]], tuple[str, list[str]]]


# The paper's eight training tasks. QA sets come from FlashRAG's preprocessed collection (question,
# golden_answers), which is what the release's preprocessing reads; the text-generation sets become
# "write a short article based on the given title", as in the bundled BookSum and WritingPrompts rows.
SOURCES: dict[str, SourceSpec] = {
    "hotpot": SourceSpec("RUC-NLPIR/FlashRAG_datasets", "hotpotqa", "train", _flashrag),
    "2wiki": SourceSpec("RUC-NLPIR/FlashRAG_datasets", "2wikimultihopqa", "train", _flashrag),
    "musique": SourceSpec("RUC-NLPIR/FlashRAG_datasets", "musique", "train", _flashrag),
    "popqa": SourceSpec("RUC-NLPIR/FlashRAG_datasets", "popqa", "test", _flashrag),
    "gsm8k": SourceSpec("openai/gsm8k", "main", "train", _gsm8k),
    "dapo": SourceSpec("BytedTsinghua-SIA/DAPO-Math-17k", None, "train", _dapo),
    "booksum": SourceSpec("kmfoda/booksum", None, "train", _titled("summary_name", "summary_text")),
    "writingprompts": SourceSpec("euclaise/writingprompts", None, "train", _titled("prompt", "story")),
}


def _hub_rows(spec: SourceSpec) -> Iterable[Mapping[str, Any]]:
    try:
        import datasets
    except ImportError as exc:
        raise BackendUnavailable(
            "building the training mix from the hub needs `datasets` (train extra)"
        ) from exc
    return datasets.load_dataset(spec.hub_id, spec.config, split=spec.split)


def build_training_mix(
    *,
    per_source: int = 5120,
    seed: int = 0,
    files: Mapping[str, str | Path] | None = None,
    sources: Sequence[str] | None = None,
    specs: Mapping[str, SourceSpec] | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """The paper's training mix: `per_source` questions from each task, shuffled together, in release rows.

    `files` maps a task to a local file in that task's raw format (used instead of the hub); other tasks are
    read from the hub with `datasets`. Sampling is seeded and per task, so the same arguments give the same mix.
    A task with fewer usable rows than `per_source` is an error naming it.
    """
    specs = dict(SOURCES if specs is None else specs)
    files = dict(files or {})
    chosen = list(sources or specs)
    unknown = [name for name in [*chosen, *files] if name not in specs]
    if unknown:
        raise DataError(f"unknown training task(s) {', '.join(unknown)}; known: {', '.join(specs)}")
    mix: list[dict[str, Any]] = []
    iterator = chosen
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(chosen, desc="training mix", unit="task")
    for name in iterator:
        spec = specs[name]
        raw = read_rows(files[name]) if name in files else _hub_rows(spec)
        converted = []
        for index, row in enumerate(raw):
            try:
                question, answers = spec.convert(row)
            except (KeyError, TypeError, IndexError, AttributeError) as exc:
                where = files.get(name, f"{spec.hub_id}:{spec.split}")
                raise DataError(f"{name} ({where}) row {index}: cannot read it ({exc!r})") from None
            if not isinstance(question, str):
                where = files.get(name, f"{spec.hub_id}:{spec.split}")
                raise DataError(f"{name} ({where}) row {index}: the question is not text ({question!r})")
            if question.strip() and answers and all(str(a).strip() for a in answers):
                converted.append((question, answers))
        if len(converted) < per_source:
            raise DataError(f"{name} has {len(converted)} usable rows, fewer than per_source={per_source}")
        # One generator per task, so a task's sample does not depend on which other tasks are chosen.
        for question, answers in random.Random(f"{seed}:{name}").sample(converted, per_source):
            mix.append(release_row(question, answers, f"{name}-train"))
    random.Random(seed).shuffle(mix)
    return mix


def write_rows(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows to .parquet or .jsonl (by suffix)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        # from_pylist takes its columns from the first row; give every row every column so none is dropped.
        columns = list(dict.fromkeys(key for row in rows for key in row))
        pq.write_table(pa.Table.from_pylist([{key: row.get(key) for key in columns} for row in rows]), path)
    elif path.suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        raise DataError(f"{path}: write .parquet or .jsonl")
    return path
