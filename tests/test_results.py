"""The results store (prompt_r1.runs.result_store, prompt_r1.runs.output_files): resumable JSONL rows, the conflict rule, compaction."""

from __future__ import annotations

import json

import pytest

from prompt_r1.core.errors import OutputError
from prompt_r1.runs.output_files import compact_output, open_results_file
from prompt_r1.runs.result_store import ResultStore


def rows_of(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_output_state_finished_failed_superseded_and_a_torn_last_line(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(
        '{"id": "a", "question": "q", "status": "environment_error"}\n'
        '{"id": "b", "question": "q", "status": "answered"}\n'
        '{"id": "a", "question": "q", "status": "answered"}\n'
        '{"id": "c", "question": "q", "status": "agent_error"}\n{"id": "d", "sta'
    )
    state = open_results_file(out, row_prefix='{"id": ')
    assert set(state.finished) == {"a", "b"} and state.failed == {"c"} and state.superseded == 1
    assert compact_output(out) == 1
    assert [r["id"] for r in rows_of(out)] == ["b", "a", "c"]


def test_the_store_keeps_a_finished_row_of_another_question_and_reruns_a_failed_one(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [
        {"id": "a", "question": "A?", "status": "answered"},
        {"id": "b", "question": "B?", "status": "environment_error"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = ResultStore.open(path, row_prefix='{"id": ')
    assert (
        store.plan("a", "A?") == "done" and store.plan("b", "B?") == "run" and store.plan("c", "C?") == "run"
    )
    assert store.plan("a", "A changed?") == "conflict" and store.conflicts == ["a"]
    with store.appending():
        store.write({"id": "b", "question": "B?", "status": "answered"})
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "b"]  # compacted
    with pytest.raises(RuntimeError, match="appending"):
        store.write({"id": "c", "question": "C?", "status": "answered"})
    (tmp_path / "other.jsonl").write_text('{"not": "a row"}\n')
    with pytest.raises(OutputError, match="not a results row"):
        ResultStore.open(tmp_path / "other.jsonl", row_prefix='{"id": ')
