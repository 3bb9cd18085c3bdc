"""Datasets: the bundled evaluation sets, user files with errors that name the row, the training-mix builder."""

from __future__ import annotations

import json

import pytest

from prompt_r1.core.errors import DataError
from prompt_r1.core.prompts import INSTRUCTION_TEMPLATE, extract_question
from prompt_r1.data.datasets import DATASETS, load_samples, read_rows
from prompt_r1.data.training_mix import SOURCES, build_training_mix, release_row, write_rows


def test_every_bundled_set_loads_by_name():
    assert len(DATASETS) == 12
    for name, info in DATASETS.items():
        samples = load_samples(name)
        assert len(samples) == 128, name
        assert all(s.question.strip() and s.golden_answers for s in samples), name
        assert INSTRUCTION_TEMPLATE not in samples[0].question
        assert info.metrics == (("f1", "ssim") if info.task == "text" else ("em", "f1"))


def test_bundled_rows_keep_question_and_answers():
    first = load_samples("hotpot", limit=1)[0]
    assert first.id == "hotpot-0" and first.dataset == "hotpot" and first.index == 0
    assert first.question.startswith("Which virus that causes respiratory problems")
    assert first.golden_answers == ["SARS coronavirus"]
    assert len(load_samples("PopQA", limit=5)) == 5  # names are case-insensitive
    assert max(len(s.golden_answers) for s in load_samples("popqa")) > 1


def test_flat_jsonl_and_release_rows_from_files(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [
        {"question": "Capital of France?", "golden_answers": ["Paris"]},
        {"id": "q7", "question": "2+2?", "answer": 4},
        release_row("Who wrote Hamlet?", ["Shakespeare"], "custom"),
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    samples = load_samples(path)
    assert [s.id for s in samples] == ["mine-0", "q7", "mine-2"]
    assert samples[1].golden_answers == ["4"]
    assert samples[2].question == "Who wrote Hamlet?"
    squad = tmp_path / "squad.jsonl"
    squad.write_text(
        json.dumps({"question": "q", "answers": {"text": ["a", "b"], "answer_start": [1, 2]}}) + "\n"
    )
    assert load_samples(squad)[0].golden_answers == ["a", "b"]
    parquet = write_rows(rows[:1] + rows[2:], tmp_path / "mine.parquet")
    assert [s.question for s in load_samples(parquet)] == ["Capital of France?", "Who wrote Hamlet?"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ['{"question": "q", "golden_answers": ["a"]}', '{"question": "q2"}'],
            r"row 1: it has no golden answers",
        ),
        (['{"question": "q", "golden_answers": ["a"]}', "{not json"], r"line 2: not valid JSON"),
        (['{"question": " ", "answer": "a"}'], r"row 0: its question is empty"),
        (['{"question": "q", "golden_answers": []}'], r"row 0: its golden answers are an empty list"),
        (['{"question": "q", "golden_answers": [{"x": 1}]}'], r"row 0: a golden answer is not text"),
        (
            ['{"prompt": [{"role": "user", "content": "no template"}], "answer": "a"}'],
            r"row 0: its prompt is not",
        ),
        (["[1, 2]"], r"line 1: expected a JSON object"),
        (
            ['{"id": 1, "question": "q", "answer": "a"}', '{"id": 1, "question": "r", "answer": "b"}'],
            r"row 1: id '1' repeats row 0",
        ),
        (
            ['{"question": "q", "answers": {"answer_start": [1]}}'],
            r"row 0: its golden answers are a mapping without 'text'",
        ),
    ],
)
def test_malformed_rows_are_named(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        load_samples(path)


def test_unknown_names_and_files(tmp_path):
    with pytest.raises(DataError, match="unknown dataset 'hotpotqa'.*hotpot, 2wiki"):
        load_samples("hotpotqa")
    with pytest.raises(DataError, match="no such dataset file"):
        load_samples(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type .csv"):
        load_samples(tmp_path / "x.csv")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="not a readable parquet file"):
        read_rows(tmp_path / "broken.parquet")


def test_data_dir_override(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMPT_R1_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="PROMPT_R1_DATA_DIR"):
        load_samples("hotpot")


# Raw rows in each training source's own format, as the hub serves them.
RAW = {
    "hotpot": lambda i: {"id": str(i), "question": f"hotpot q{i}?", "golden_answers": [f"h{i}"]},
    "2wiki": lambda i: {"question": f"2wiki q{i}?", "golden_answers": [f"w{i}", f"w{i}b"]},
    "musique": lambda i: {"question": f"musique q{i}?", "golden_answers": [f"m{i}"]},
    "popqa": lambda i: {"question": f"popqa q{i}?", "golden_answers": [f"p{i}"]},
    "gsm8k": lambda i: {"question": f"gsm8k q{i}?", "answer": f"3 + 4 = 7\n#### 1,00{i}"},
    "dapo": lambda i: {
        "prompt": [{"role": "user", "content": f"Solve {i}. Answer: $Answer"}],
        "reward_model": {"ground_truth": str(i), "style": "rule-lighteval/MATH_v2"},
    },
    "booksum": lambda i: {
        "summary_name": f"Chapter {i}",
        "summary_text": f"A summary {i}.",
        "chapter": "...",
    },
    "writingprompts": lambda i: {"prompt": f"[ WP ] Prompt {i}", "story": f"Once {i}."},
}


@pytest.fixture
def raw_files(tmp_path):
    files = {}
    for name, make in RAW.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(make(i)) + "\n" for i in range(6)))
        files[name] = path
    return files


def test_training_mix_from_local_files(raw_files, tmp_path):
    assert set(SOURCES) == set(RAW)
    mix = build_training_mix(per_source=4, seed=1, files=raw_files)
    assert len(mix) == 8 * 4
    by_task = {}
    for row in mix:
        assert set(row) == {"data_source", "prompt", "ability", "reward_model"}
        question = extract_question(row["prompt"][0]["content"])
        assert question and row["reward_model"]["ground_truth"]
        by_task.setdefault(row["data_source"], []).append((question, row["reward_model"]["ground_truth"]))
    assert {k: len(v) for k, v in by_task.items()} == {f"{n}-train": 4 for n in RAW}
    gsm = dict(by_task["gsm8k-train"])
    assert all(
        answers == [f"100{q[len('gsm8k q') : -1]}"] for q, answers in gsm.items()
    )  # "#### 1,00i" → "100i"
    assert all(
        q.startswith("Please write a short article based on the given title: Chapter")
        for q, _ in by_task["booksum-train"]
    )
    # Seeded: the same arguments give the same rows; a different seed another sample or order.
    assert build_training_mix(per_source=4, seed=1, files=raw_files) == mix
    assert build_training_mix(per_source=4, seed=2, files=raw_files) != mix
    # Each task's sample is its own: choosing fewer tasks does not change the rows drawn for the others.
    alone = build_training_mix(per_source=4, seed=1, files=raw_files, sources=["gsm8k"])
    assert sorted(map(str, alone)) == sorted(str(r) for r in mix if r["data_source"] == "gsm8k-train")
    # The built file loads back through the same loader as the evaluation sets.
    samples = load_samples(write_rows(mix, tmp_path / "mix.parquet"))
    assert len(samples) == 32 and samples[0].golden_answers == mix[0]["reward_model"]["ground_truth"]


def test_training_mix_errors_name_the_task(raw_files, tmp_path):
    with pytest.raises(DataError, match="gsm8k has 6 usable rows, fewer than per_source=10"):
        build_training_mix(per_source=10, files=raw_files, sources=["gsm8k"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(DataError, match=r"hotpot \(.*bad.jsonl\) row 0: cannot read it"):
        build_training_mix(per_source=1, files={"hotpot": bad}, sources=["hotpot"])
    with pytest.raises(DataError, match="unknown training task"):
        build_training_mix(files={"nq": bad})
