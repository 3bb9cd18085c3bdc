"""The worker pool under batch and eval (prompt_r1.runs.pool), driven directly: items, a `work` coroutine and a real
results file, no model and no network."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from prompt_r1.core.errors import ConfigError, DataError
from prompt_r1.runs.pool import check_limits, named_keys, run_many
from prompt_r1.runs.result_store import ResultStore


@dataclass(frozen=True)
class Item:
    id: str
    question: str


def _items(n: int, prefix: str = "q") -> list[Item]:
    return [Item(f"{prefix}{i}", f"question {i}") for i in range(n)]


def _store(path: Path) -> ResultStore:
    return ResultStore.open(path, row_prefix='{"id": ')


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _row(item: Item, status: str = "answered") -> dict:
    return {"id": item.id, "question": item.question, "status": status}


def test_every_item_runs_once_with_at_most_concurrency_in_flight(tmp_path):
    in_flight, most = 0, 0

    async def work(item: Item) -> dict:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001 * (int(item.id[1:]) % 3))  # uneven: a slow item holds no other back
        in_flight -= 1
        return _row(item)

    out = tmp_path / "r.jsonl"
    tally = asyncio.run(run_many(_items(40), work, _store(out), concurrency=4, signals=False))
    assert most == 4
    assert tally.written == 40 and tally.statuses == {"answered": 40} and tally.stopped is None
    assert sorted(r["id"] for r in _rows(out)) == sorted(i.id for i in _items(40))


def test_a_rerun_skips_finished_items_and_retries_failed_ones(tmp_path):
    out = tmp_path / "r.jsonl"
    calls: list[str] = []

    async def first(item: Item) -> dict:
        calls.append(item.id)
        return _row(item, "environment_error" if item.id in ("q1", "q3") else "answered")

    tally = asyncio.run(run_many(_items(5), first, _store(out), concurrency=2, signals=False))
    assert tally.failed == 2
    calls.clear()

    async def second(item: Item) -> dict:
        calls.append(item.id)
        return _row(item)

    tally = asyncio.run(run_many(_items(5), second, _store(out), concurrency=2, signals=False))
    assert sorted(calls) == ["q1", "q3"] and tally.skipped == 3 and tally.failed == 0
    rows = _rows(out)  # compacted: the failed rows were superseded
    assert sorted(r["id"] for r in rows) == ["q0", "q1", "q2", "q3", "q4"]
    assert all(r["status"] == "answered" for r in rows)


def test_max_failures_cancels_the_items_in_flight_and_leaves_no_row_for_them(tmp_path):
    out = tmp_path / "r.jsonl"
    slow_started = asyncio.Event()

    async def work(item: Item) -> dict:
        if item.id == "q0":
            await slow_started.wait()
            return _row(item, "internal_error")
        slow_started.set()
        await asyncio.sleep(30)  # cancelled by the stop, long before this
        return _row(item)

    tally = asyncio.run(run_many(_items(2), work, _store(out), concurrency=2, max_failures=1, signals=False))
    assert tally.failed == 1 and tally.cancelled == 1
    assert tally.stopped == "1 failed episodes reached --max-failures 1"
    assert [r["id"] for r in _rows(out)] == ["q0"]


def test_a_stop_rule_stops_starting_items_and_keeps_what_was_written(tmp_path):
    out = tmp_path / "r.jsonl"
    done: list[str] = []

    async def work(item: Item) -> dict:
        done.append(item.id)
        return _row(item)

    def stop() -> str | None:
        return "enough" if len(done) >= 3 else None

    tally = asyncio.run(run_many(_items(10), work, _store(out), concurrency=1, stop=stop, signals=False))
    assert tally.stopped == "enough" and tally.written == 3 and len(_rows(out)) == 3


def test_a_repeated_key_runs_once_and_a_changed_question_is_kept_and_named(tmp_path, capsys):
    out = tmp_path / "r.jsonl"

    async def work(item: Item) -> dict:
        return _row(item)

    asyncio.run(run_many(_items(3), work, _store(out), concurrency=1, signals=False))
    changed = [Item("q0", "another question"), Item("q1", "question 1"), Item("q1", "question 1")]
    tally = asyncio.run(run_many(changed, work, _store(out), concurrency=1, signals=False))
    assert tally.conflicts == 1 and tally.conflict_keys == ["q0"]
    assert tally.skipped == 1 and tally.duplicates == 1 and tally.written == 0
    err = capsys.readouterr().err
    assert "id 'q0' was finished" in err and "duplicate id 'q1'" in err
    assert {r["question"] for r in _rows(out) if r["id"] == "q0"} == {"question 0"}  # the old row stands


def test_an_input_error_stops_the_run_with_its_message(tmp_path):
    def items():
        yield Item("q0", "question 0")
        raise DataError("row 2: no question")

    async def work(item: Item) -> dict:
        return _row(item)

    tally = asyncio.run(run_many(items(), work, _store(tmp_path / "r.jsonl"), concurrency=1, signals=False))
    assert tally.written == 1 and tally.input_error == "row 2: no question"
    assert tally.stopped == "input error: row 2: no question"


def test_limits_are_checked_under_the_names_the_caller_uses():
    with pytest.raises(ConfigError, match="^concurrency must be an integer ≥ 1, got 0"):
        check_limits(0)
    with pytest.raises(ConfigError, match="^--max-failures must be an integer ≥ 1, got 0"):
        check_limits(1, 0, flags=True)
    with pytest.raises(ConfigError, match=r"^--budget \(dollars\) must be a finite number > 0, got -1.0"):
        check_limits(1, None, -1.0, flags=True)


def test_named_keys_names_the_first_ten_and_counts_the_rest():
    assert named_keys(["a", "b"]) == "'a', 'b'"
    assert named_keys([f"k{i}" for i in range(12)]).endswith("'k9' and 2 more")


def test_what_work_raises_is_that_items_failure_row_and_the_others_go_on(tmp_path):
    out = tmp_path / "r.jsonl"

    async def work(item: Item) -> dict:
        if item.id == "q1":
            raise KeyError("a scoring bug")
        return _row(item)

    def failure_row(item: Item, exc: Exception) -> dict:
        return {**_row(item, "internal_error"), "error": repr(exc)}

    tally = asyncio.run(
        run_many(_items(3), work, _store(out), concurrency=1, failure_row=failure_row, signals=False)
    )
    assert tally.written == 3 and tally.failed == 1
    assert {r["id"]: r["status"] for r in _rows(out)} == {
        "q0": "answered",
        "q1": "internal_error",
        "q2": "answered",
    }
    with pytest.raises(KeyError):  # without a failure row, a bug stops the run
        asyncio.run(run_many([Item("q9", "question 9")], work_raising, _store(out), signals=False))


async def work_raising(item: Item) -> dict:
    raise KeyError("a bug")
