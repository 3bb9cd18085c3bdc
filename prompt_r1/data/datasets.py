"""Datasets: the paper's 12 bundled evaluation sets and user files (the training mix: prompt_r1.data.training_mix).

    >>> samples = load_samples("hotpot", limit=2)            # a bundled set, by name
    >>> samples = load_samples("my_questions.jsonl")  # any parquet/JSONL/JSON file  # doctest: +SKIP

A row is accepted in the release's schema (`prompt` = [{"role": "user", "content": "Question: …\\n<template>"}],
`reward_model.ground_truth`) or flat (`question` plus `golden_answers`, `answers` or `answer`). A row that is
neither stops the load with a `DataError` naming the file and row; nothing is silently skipped.

The bundled sets live in `evals/data/` of the project checkout (128 rows each, from the paper's release); set
`PROMPT_R1_DATA_DIR` to read them from elsewhere.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from prompt_r1.core.errors import BackendUnavailable, DataError
from prompt_r1.core.prompts import extract_question
from prompt_r1.core.text import lone_surrogate
from prompt_r1.scoring.metrics import answer_list, answer_values, table_metrics

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "Sample",
    "bundled_data_dir",
    "count_rows",
    "dataset_info",
    "iter_rows",
    "iter_samples",
    "jsonl_rows",
    "load_samples",
    "read_rows",
    "resolve_source",
]

Task = Literal["qa", "math", "text"]


@dataclass(frozen=True)
class DatasetInfo:
    """A bundled evaluation set: file, the name the paper's tables use, its task, and its split of Table 2/3."""

    name: str
    file: str
    title: str
    task: Task
    split: Literal["main", "ood"]

    @property
    def metrics(self) -> tuple[str, ...]:
        """The paper's metrics for this set: EM and F1 for QA and math, F1 and SSim for text generation."""
        return table_metrics(self.task)


DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo("hotpot", "hotpot.parquet", "HotpotQA", "qa", "main"),
        DatasetInfo("2wiki", "2WikiMultihopQA.parquet", "2WikiMQA", "qa", "main"),
        DatasetInfo("musique", "MusiQue.parquet", "MuSiQue", "qa", "main"),
        DatasetInfo("popqa", "PopQA.parquet", "PopQA", "qa", "main"),
        DatasetInfo("gsm8k", "gsm8k.parquet", "GSM8K", "math", "main"),
        DatasetInfo("dapo", "DAPO-Math.parquet", "DAPO-Math", "math", "main"),
        DatasetInfo("booksum", "BookSum.parquet", "BookSum", "text", "main"),
        DatasetInfo("writingprompts", "WritingPrompts.parquet", "WritingPrompts", "text", "main"),
        DatasetInfo("mathqa", "MathQA_ood.parquet", "MathQA", "math", "ood"),
        DatasetInfo("squad_v2", "squad_v2_ood.parquet", "SQuAD v2", "qa", "ood"),
        DatasetInfo("triviaqa", "triviaqa_ood.parquet", "TriviaQA", "qa", "ood"),
        DatasetInfo("xsum", "Xsum_ood.parquet", "XSum", "text", "ood"),
    )
}


def dataset_info(name: str) -> DatasetInfo | None:
    """The bundled set called `name` (case-insensitive), or None for a file path or an unknown name."""
    return DATASETS.get(name.lower())


@dataclass(frozen=True)
class Sample:
    """One evaluation or training question. `id` is stable across runs: `<dataset>-<row index>` unless the row
    has its own `id`."""

    id: str
    dataset: str
    index: int
    question: str
    golden_answers: list[str] = field(default_factory=list)


def bundled_data_dir() -> Path:
    """Where the bundled evaluation sets are: `$PROMPT_R1_DATA_DIR`, else `evals/data` of the checkout."""
    override = os.environ.get("PROMPT_R1_DATA_DIR")
    path = Path(override) if override else Path(__file__).resolve().parents[2] / "evals" / "data"
    if not path.is_dir():
        raise DataError(
            f"the bundled evaluation sets are not at {path}: run from a checkout of the project, or set "
            "PROMPT_R1_DATA_DIR to a folder holding them"
        )
    return path


def _check_file(path: Path, what: str = "dataset file") -> None:
    """A `DataError` unless `path` is a file: missing, or a folder (or other non-file) given where a file goes."""
    if not path.exists():
        raise DataError(f"no such {what}: {path}")
    if not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file"
        raise DataError(f"{path} is not a file ({kind}); give the path of a {what}")


def _unreadable(path: Path, exc: OSError) -> DataError:
    return DataError(f"cannot read {path}: {exc.strerror or exc}")


def _not_utf8(path: Path, exc: UnicodeDecodeError, data: bytes, line_no: int = 1) -> DataError:
    """Where `data` (a whole file, or line `line_no` of one) stops being UTF-8, as a `DataError`."""
    line_no += data.count(b"\n", 0, exc.start)
    column = exc.start - data.rfind(b"\n", 0, exc.start)
    byte = data[exc.start : exc.start + 1].hex()
    return DataError(
        f"{path} line {line_no}: not UTF-8 text (byte 0x{byte} at column {column}); save the file as UTF-8"
    )


def _jsonl_objects(path: Path, *, allow_cut_last_line: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file, read line by line.

    Lines end at "\n" only: U+2028 and other characters `str.splitlines` breaks on are text inside a JSON string
    (`json.dumps(..., ensure_ascii=False)` writes them raw). A UTF-8 byte order mark before the first line is
    skipped. With `allow_cut_last_line`, a last line that is not valid JSON or not UTF-8 (a writer killed
    mid-line, possibly mid-character) is dropped; any other bad line is a `DataError` naming the file and line.
    """
    _check_file(path)
    pending: DataError | None = None  # a bad line: an error unless no non-blank line follows it
    try:
        with path.open("rb") as handle:
            for line_no, raw in enumerate(handle, 1):
                if not raw.strip():
                    continue
                if pending is not None:
                    raise pending
                try:
                    row = json.loads(raw.decode("utf-8-sig" if line_no == 1 else "utf-8"))
                except UnicodeDecodeError as exc:
                    pending = _not_utf8(path, exc, raw, line_no)
                    continue
                except json.JSONDecodeError as exc:
                    pending = DataError(f"{path} line {line_no}: not valid JSON ({exc.msg})")
                    continue
                except (ValueError, RecursionError) as exc:  # nested too deep, an integer too long for Python
                    raise DataError(
                        f"{path} line {line_no}: JSON this reader cannot take ({_json_limit(exc)})"
                    ) from None
                if not isinstance(row, dict):
                    raise DataError(
                        f"{path} line {line_no}: expected a JSON object, got {type(row).__name__}"
                    )
                yield line_no, row
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if pending is not None and not allow_cut_last_line:
        raise pending


def _json_limit(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return " ".join(str(exc).split())[:120]


def jsonl_rows(path: Path, *, allow_cut_last_line: bool = False) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file.

    `allow_cut_last_line` drops a last line that is not valid JSON (or not UTF-8), as a process killed mid-write
    leaves it; any other bad line, a file that is not UTF-8, a folder or an unreadable file is a `DataError`
    naming it.
    """
    return list(_jsonl_objects(Path(path), allow_cut_last_line=allow_cut_last_line))


def _json_rows(path: Path) -> list[dict[str, Any]]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _unreadable(path, exc) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc, data) from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except (ValueError, RecursionError) as exc:
        raise DataError(f"{path}: JSON this reader cannot take ({_json_limit(exc)})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{path}: expected a JSON list of objects")
    return rows


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a .parquet, .jsonl or .json (a list of objects) file, as plain dicts."""
    return list(iter_rows(path))


def _row_question(row: Mapping[str, Any]) -> str:
    if isinstance(row.get("question"), str):
        return row["question"]
    prompt = row.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], Mapping):
        content = prompt[-1].get("content")
        if isinstance(content, str):
            question = extract_question(content)
            if question is None:
                raise ValueError(
                    "its prompt is not 'Question: …' followed by the Prompt-R1 instruction template"
                )
            return question
    if isinstance(prompt, str):
        return extract_question(prompt) or prompt
    raise ValueError("it has no question (expected a 'question' string or the release's 'prompt' messages)")


def _row_answers(row: Mapping[str, Any]) -> list[str]:
    """The first golden-answers field the row holds; an empty or unusable one is an error, not skipped."""
    for _, value in answer_values(row):
        try:
            answers = answer_list(value)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        if not answers:
            raise ValueError("its golden answers are an empty list")
        return answers
    raise ValueError(
        "it has no golden answers (golden_answers, answers, reward_model.ground_truth or answer)"
    )


def resolve_source(name_or_path: str | Path) -> tuple[Path, str]:
    """(file, dataset name) of a bundled set's name or a file path."""
    info = dataset_info(str(name_or_path))
    if info is not None:
        return bundled_data_dir() / info.file, info.name
    path = Path(name_or_path)
    if not path.exists() and path.suffix == "":
        raise DataError(
            f"unknown dataset {str(name_or_path)!r}: use one of {', '.join(DATASETS)} or a path to a "
            ".parquet/.jsonl/.json file"
        )
    if path.exists():
        _check_file(path)  # a folder named x.jsonl: refused here, before anyone opens it
    return path, path.stem


def iter_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """The rows of a .parquet, .jsonl or .json file, read lazily: parquet by record batch, JSONL by line, so
    memory does not grow with the file (a .json list is one document and is read whole)."""
    path = Path(path)
    _check_file(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise BackendUnavailable("reading parquet needs pyarrow: pip install 'prompt-r1[eval]'") from exc
        try:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
                yield from batch.to_pylist()
        except Exception as exc:  # pyarrow's errors for bad files vary by version
            raise DataError(f"{path}: not a readable parquet file ({exc})") from exc
    elif suffix == ".jsonl":
        for _, row in _jsonl_objects(path):
            yield row
    elif suffix == ".json":
        yield from _json_rows(path)
    else:
        raise DataError(f"{path}: unsupported file type {suffix or '(none)'}; use .parquet, .jsonl or .json")


def count_rows(path: str | Path) -> int:
    """How many rows `iter_rows` will yield, without holding them: parquet metadata, or one pass over the lines."""
    path = Path(path)
    _check_file(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows
        except Exception as exc:
            raise DataError(f"{path}: not a readable parquet file ({exc})") from exc
    if suffix == ".jsonl":
        try:
            with path.open("rb") as handle:
                return sum(1 for line in handle if line.strip())
        except OSError as exc:
            raise _unreadable(path, exc) from None
    return len(read_rows(path))


def iter_samples(
    name_or_path: str | Path, *, limit: int | None = None, require_answers: bool = True
) -> Iterator[Sample]:
    """Samples of a bundled set or a file, one at a time. Ids are not checked for repeats here (`load_samples`
    refuses them; a batch run reports them); a row that cannot be read is a `DataError` naming it, and so is one
    whose id, question or golden answers hold text that cannot be written as UTF-8 (a lone surrogate).

    require_answers=False accepts rows without golden answers (batch inference over unlabelled questions).
    """
    if limit is not None and limit < 0:
        raise DataError(f"limit must be ≥ 0, got {limit}")
    path, name = resolve_source(name_or_path)
    for index, row in enumerate(iter_rows(path)):
        if limit is not None and index >= limit:
            return
        try:
            question = _row_question(row)
            if not question.strip():
                raise ValueError("its question is empty")
            try:
                answers = _row_answers(row)
            except ValueError:
                if require_answers or _has_answer_field(row):
                    raise
                answers = []
            row_id = row.get("id")
            # An id names the row in results and reruns: text or an integer. A boolean, a number with a fraction,
            # a list or an object would be turned into some text ("True", "{'a': 1}") without a word.
            if row_id is not None and (isinstance(row_id, bool) or not isinstance(row_id, str | int)):
                raise ValueError(f"its id must be text or an integer, got {type(row_id).__name__} {row_id!r}")
            if isinstance(row_id, str) and not row_id.strip():
                raise ValueError("its id is empty text (leave the id out to number the row)")
            sample_id = str(row_id) if row_id is not None else f"{name}-{index}"
            _check_writable(sample_id, question, answers)
        except ValueError as exc:
            raise DataError(f"{path} row {index}: {exc}") from None
        yield Sample(id=sample_id, dataset=name, index=index, question=question, golden_answers=answers)


def _check_writable(sample_id: str, question: str, answers: Sequence[str]) -> None:
    """Refuse, at load, text that would crash the run later, when its row is written or sent."""
    for what, text in [("its id", sample_id), ("its question", question)] + [
        (f"golden answer {i}", answer) for i, answer in enumerate(answers)
    ]:
        problem = lone_surrogate(text)
        if problem is not None:
            raise ValueError(f"{what} is not valid Unicode text ({problem}); fix the file's \\u escapes")


def _has_answer_field(row: Mapping[str, Any]) -> bool:
    """A row that names golden answers but whose value is unusable is an error even where answers are optional."""
    return next(answer_values(row), None) is not None


def load_samples(name_or_path: str | Path, *, limit: int | None = None) -> list[Sample]:
    """Load a bundled set by name (see `DATASETS`) or any parquet/JSONL/JSON file; `limit` keeps the first rows.

    A file without a single row is a `DataError` (limit=0 asks for none and gets an empty list)."""
    path, _ = resolve_source(name_or_path)
    samples = []
    seen: dict[str, int] = {}
    for sample in iter_samples(name_or_path, limit=limit):
        if sample.id in seen:
            raise DataError(
                f"{path} row {sample.index}: id {sample.id!r} repeats row {seen[sample.id]}; ids must be unique"
            )
        seen[sample.id] = sample.index
        samples.append(sample)
    if not samples and limit != 0:
        raise DataError(f"{path} has no rows: nothing to load")
    return samples
