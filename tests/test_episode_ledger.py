"""The batch call ledger on disk (prompt_r1.runs.call_ledger): kept across a reopen, made whole before it appears,
earlier files still read, and anything else refused in one line with the file left as it was."""

from __future__ import annotations

import sqlite3

import pytest

from prompt_r1.core.errors import OutputError
from prompt_r1.runs.call_ledger import EpisodeLedger, ledger_path_for, request_key


def test_calls_are_kept_across_a_reopen_until_forgotten(tmp_path):
    path = ledger_path_for(tmp_path / "out.jsonl")
    assert path.name == "out.calls.sqlite"
    key = request_key("env", "second", [("first", "reply")])
    ledger = EpisodeLedger.open(path)
    ledger.record("q1", 1, key, {"content": "réponse"})
    ledger.close()
    assert not path.with_name(path.name + ".creating").exists()  # made under another name, then renamed
    ledger = EpisodeLedger.open(path)
    assert ledger.lookup("q1", 1, key) == {"content": "réponse"}
    assert ledger.lookup("q1", 1, request_key("env", "second")) is None  # another history, another call
    ledger.forget("q1")
    assert ledger.calls() == 0
    ledger.close()


def test_a_ledger_in_the_earlier_layout_is_still_replayed(tmp_path):
    path = tmp_path / "out.calls.sqlite"
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    connection.execute("INSERT INTO meta VALUES ('format', 'prompt-r1 episode call ledger 1')")
    connection.execute(
        "CREATE TABLE calls (episode TEXT, turn INTEGER, request TEXT, reply TEXT, "
        "PRIMARY KEY (episode, turn, request))"
    )
    connection.execute("INSERT INTO calls VALUES ('q1', 0, 'k', '{\"content\": \"paid\"}')")
    connection.close()
    ledger = EpisodeLedger.open(path)
    assert ledger.lookup("q1", 0, "k") == {"content": "paid"}
    ledger.close()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "not a prompt-r1 call ledger"),  # an empty file is not taken as a new ledger
        (b"results, not a database\n" * 100, "file is not a database"),
    ],
)
def test_a_file_that_is_not_a_ledger_is_refused_and_left_alone(tmp_path, content, says):
    path = tmp_path / "out.calls.sqlite"
    path.write_bytes(content)
    with pytest.raises(OutputError, match=says) as refused:
        EpisodeLedger.open(path)
    assert "move it away" in str(refused.value) and "\n" not in str(refused.value)
    assert path.read_bytes() == content


def test_another_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "out.calls.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    connection.execute("INSERT INTO meta VALUES ('format', 'prompt-r1 response cache')")
    connection.commit()
    connection.close()
    with pytest.raises(OutputError, match="not a prompt-r1 call ledger"):
        EpisodeLedger.open(path)


def _ledger_with_calls(path, n: int = 300) -> EpisodeLedger:
    ledger = EpisodeLedger.open(path)
    for i in range(n):
        ledger.record(f"q{i}", 0, request_key("env", f"prompt {i}"), {"content": "paid " * 40})
    return ledger


def test_a_damaged_ledger_is_refused_in_one_line(tmp_path):
    path = tmp_path / "out.calls.sqlite"
    _ledger_with_calls(path).close()
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 8192] = b"\xff" * 8192  # pages in the middle overwritten
    path.write_bytes(bytes(data))
    with pytest.raises(OutputError) as refused:
        EpisodeLedger.open(path)
    message = str(refused.value)
    assert "\n" not in message and len(message) < 400, message
    assert "damaged" in message or "malformed" in message
    assert path.read_bytes() == bytes(data)


def test_a_write_ahead_log_left_without_its_ledger_is_not_taken_into_a_new_one(tmp_path):
    # A ledger moved away while its -wal stayed: a new file at the path would replay the old calls into it.
    first = tmp_path / "first" / "out.calls.sqlite"
    first.parent.mkdir()
    ledger = _ledger_with_calls(first, 20)  # still open: its calls are in the -wal
    wal = first.with_name(first.name + "-wal")
    assert wal.stat().st_size > 0
    path = tmp_path / "out.calls.sqlite"
    path.with_name(path.name + "-wal").write_bytes(wal.read_bytes())
    ledger.close()
    with pytest.raises(OutputError, match=r"out\.calls\.sqlite-wal is there without the file it belongs to"):
        EpisodeLedger.open(path)
    assert not path.exists()
