"""Hostile input files: torn, repeated or non-UTF-8 lines, folders named like files, lone surrogates, empty sets.

Each is refused with one line naming the file and the line or row (exit 2), or, where the numbers stay right, said
on stderr; none gives a traceback or a wrong score without a word.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prompt_r1.cli.main import main
from prompt_r1.core.errors import DataError
from prompt_r1.data.datasets import count_rows, iter_rows, iter_samples, jsonl_rows, load_samples, read_rows
from prompt_r1.evaluation.harness import read_predictions
from prompt_r1.scoring.rewards import golden_answers_of
from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent

ROOT = Path(__file__).resolve().parents[1]
SURROGATE_QUESTION = '{"question": "a \\ud800 b", "answer": "x"}\n'  # valid JSON; the escape is half a pair


@pytest.fixture
def server():
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as s:
        yield s


def endpoints(server) -> list[str]:
    return ["--env-model", "env", "--env-base-url", server.base_url, "--agent-model", "agent",
            "--agent-base-url", server.base_url, "--no-progress"]  # fmt: skip


def one_error_line(err: str) -> str:
    """The `prompt-r1: error:` line of stderr, after checking there is exactly one and no traceback."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("prompt-r1: error: ")]
    assert len(errors) == 1, err
    return errors[0]


def score_csv(path: Path) -> dict[str, str]:
    with path.open() as handle:
        (row,) = list(csv.DictReader(handle))
    return row


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---- score: numbers that were wrong without a word --------------------------------------------------------------


def test_score_refuses_a_torn_last_line_that_a_resuming_eval_drops(tmp_path, capsys):
    path = tmp_path / "preds.jsonl"
    rows = [{"prediction": "a", "golden_answers": ["a"]}, {"prediction": "b", "golden_answers": ["b"]}]
    write_jsonl(path, rows)
    with path.open("a") as handle:
        handle.write('{"prediction": "c", "golden_answers": ["zz')  # a third row, cut by a kill
    assert main(["score", str(path), "--no-chart"]) == 2
    captured = capsys.readouterr()
    assert f"{path} line 3: not valid JSON" in one_error_line(captured.err)
    assert captured.out == "" and not (tmp_path / "preds.summary.csv").exists()
    # eval's resume reads its own file leniently: the row that was being written runs again.
    assert [r["prediction"] for r in read_predictions(path)] == ["a", "b"]
    with pytest.raises(DataError, match="line 3: not valid JSON"):
        read_predictions(path, strict=True)


def test_score_refuses_a_bad_line_in_the_middle_too(tmp_path, capsys):
    path = tmp_path / "preds.jsonl"
    path.write_text(
        '{"prediction": "a", "golden_answers": ["a"]}\n{oops\n{"prediction": "b", "answer": "b"}\n'
    )
    assert main(["score", str(path), "--no-chart"]) == 2
    assert f"{path} line 2: not valid JSON" in one_error_line(capsys.readouterr().err)
    with pytest.raises(DataError, match="line 2"):
        read_predictions(path)  # lenient only about the last line


@pytest.mark.parametrize("field", ["golden_answers", "answers"])
def test_score_reads_squad_style_answers_as_their_text(tmp_path, capsys, field):
    squad = {"text": ["Paris", "Paris, France"], "answer_start": [0, 0]}
    path = write_jsonl(
        tmp_path / "preds.jsonl",
        [{"prediction": "Paris", field: squad}, {"prediction": "Lyon", field: {"text": ["Rome"]}}],
    )
    assert main(["score", str(path), "--no-chart"]) == 0
    row = score_csv(tmp_path / "preds.summary.csv")
    assert (row["n"], row["em"]) == ("2", "0.500000")  # not 0: the mapping's keys are not the answers
    capsys.readouterr()

    write_jsonl(path, [{"prediction": "Paris", field: {"answer_start": [0]}}])
    assert main(["score", str(path), "--no-chart"]) == 2
    assert "row 0: its golden answers are a mapping without 'text'" in one_error_line(capsys.readouterr().err)


def test_golden_answers_of_matches_the_dataset_loader(tmp_path):
    rows = [
        {"question": "q0", "golden_answers": {"text": ["a", "b"], "answer_start": [1, 2]}},
        {"question": "q1", "answers": {"text": "c", "answer_start": 0}},
        {"question": "q2", "answers": ["d"], "answer": "ignored"},
        {"question": "q3", "reward_model": {"ground_truth": 7}},
    ]
    loaded = load_samples(write_jsonl(tmp_path / "set.jsonl", rows))
    assert [golden_answers_of(r) for r in rows] == [s.golden_answers for s in loaded]
    assert [s.golden_answers for s in loaded] == [["a", "b"], ["c"], ["d"], ["7"]]
    with pytest.raises(KeyError, match="no golden answers"):
        golden_answers_of({"question": "q"})


def test_score_says_which_ids_repeat_and_that_the_last_row_is_scored(tmp_path, capsys):
    path = write_jsonl(
        tmp_path / "preds.jsonl",
        [
            {"id": "q1", "prediction": "wrong", "golden_answers": ["a"]},
            {"id": "q2", "prediction": "b", "golden_answers": ["b"]},
            {"id": "q1", "prediction": "a", "golden_answers": ["a"]},
            {"id": "q1", "prediction": "a", "golden_answers": ["a"]},
            {"id": "q3", "prediction": "wrong", "golden_answers": ["c"]},
            {"id": "q3", "prediction": "c", "golden_answers": ["c"]},
        ],
    )
    assert main(["score", str(path), "--no-chart"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "prompt-r1: error" not in err
    (warning,) = [line for line in err.splitlines() if "more than one row" in line]
    assert warning.startswith(f"prompt-r1: warning: {path}: 2 ids are on more than one row ('q1', 'q3')")
    assert "only the last row of each is scored, 3 earlier rows left out" in warning
    row = score_csv(tmp_path / "preds.summary.csv")
    assert (row["n"], row["em"]) == ("3", "1.000000")

    repeats: list = []
    read_predictions(path, repeats=repeats)
    assert [line for line, _ in repeats] == [3, 4, 6]

    # Rows without ids are told apart by their line: nothing repeats, nothing is said.
    write_jsonl(path, [{"prediction": "a", "golden_answers": ["a"]}] * 2)
    assert main(["score", str(path), "--no-chart"]) == 0
    assert "more than one row" not in capsys.readouterr().err


# ---- files that are not UTF-8, or not files ---------------------------------------------------------------------


def test_files_that_are_not_utf8_are_named_with_their_line(tmp_path):
    jsonl = tmp_path / "latin1.jsonl"
    jsonl.write_bytes(b'{"question": "q", "answer": "a"}\n{"question": "caf\xe9", "answer": "a"}\n')
    for read in (load_samples, read_rows, count_rows_then_rows, lambda p: list(iter_rows(p)), jsonl_rows):
        with pytest.raises(DataError, match=rf"{jsonl} line 2: not UTF-8 text \(byte 0xe9 at column 18\)"):
            read(jsonl)
    document = tmp_path / "latin1.json"
    document.write_bytes(b'[{"question": "q", "answer": "a"},\n {"question": "caf\xe9", "answer": "a"}]')
    with pytest.raises(DataError, match=rf"{document} line 2: not UTF-8 text"):
        load_samples(document)
    with pytest.raises(DataError, match=rf"{document} line 2: not UTF-8 text"):
        count_rows(document)


def count_rows_then_rows(path: Path) -> list:
    assert count_rows(path) == 2  # counting lines needs no decoding
    return list(iter_samples(path))


def test_utf8_with_a_byte_order_mark_and_u2028_inside_strings_load(tmp_path):
    # json.dumps(..., ensure_ascii=False) writes U+2028 raw; it is text inside a string, not a line break.
    row = {"question": "one\u2028two\x85three", "answer": "a"}
    path = tmp_path / "mine.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(row, ensure_ascii=False) + "\n").encode())
    (sample,) = load_samples(path)
    assert sample.question == row["question"]
    assert jsonl_rows(path) == [(1, row)]


@pytest.mark.parametrize("command", ["score", "eval", "batch"])
def test_every_command_refuses_a_non_utf8_input_in_one_line(tmp_path, capsys, server, command):
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        b'{"question": "q", "answer": "a", "prediction": "a"}\n{"question": "\xff", "answer": "a", "prediction": "a"}\n'
    )
    argv = {
        "score": ["score", str(path), "--no-chart"],
        "eval": ["eval", "--dataset", str(path), "--method", "env-only", "--out", str(tmp_path / "run")],
        "batch": ["batch", str(path), "--out", str(tmp_path / "out.jsonl"), "--concurrency", "1"],
    }[command]
    assert main(argv + (endpoints(server) if command != "score" else [])) == 2
    assert f"{path} line 2: not UTF-8 text" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", ["score", "eval", "batch"])
def test_a_folder_named_like_an_input_file_is_not_a_file(tmp_path, capsys, server, command):
    folder = tmp_path / "x.jsonl"
    folder.mkdir()
    argv = {
        "score": ["score", str(folder)],
        "eval": ["eval", "--dataset", str(folder), "--method", "env-only", "--out", str(tmp_path / "run")],
        "batch": ["batch", str(folder), "--out", str(tmp_path / "out.jsonl")],
    }[command]
    assert main(argv + (endpoints(server) if command != "score" else [])) == 2
    assert f"{folder} is not a file" in one_error_line(capsys.readouterr().err)
    assert not server.requests


def test_every_reader_refuses_a_folder(tmp_path):
    for suffix in (".jsonl", ".json", ".parquet"):
        folder = tmp_path / f"x{suffix}"
        folder.mkdir()
        for read in (load_samples, read_rows, count_rows, lambda p: list(iter_rows(p)), jsonl_rows):
            with pytest.raises(DataError, match=rf"{folder} is not a file \(a folder\)"):
                read(folder)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_file_is_a_data_error(tmp_path):
    path = write_jsonl(tmp_path / "secret.jsonl", [{"question": "q", "answer": "a"}])
    path.chmod(0)
    for read in (load_samples, count_rows, jsonl_rows):
        with pytest.raises(DataError, match=f"cannot read {path}"):
            read(path)


def test_score_on_a_non_utf8_file_is_one_line_from_a_real_process(tmp_path):
    path = tmp_path / "preds.jsonl"
    path.write_bytes(b'{"prediction": "\xe9t\xe9", "golden_answers": ["a"]}\n')
    done = subprocess.run(
        [sys.executable, "-m", "prompt_r1", "score", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"prompt-r1: error: {path} line 1: not UTF-8 text (byte 0xe9 at column 17); save the file as UTF-8"
    )


# ---- text that cannot be written as UTF-8 ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (SURROGATE_QUESTION, r"row 0: its question is not valid Unicode text \(a lone surrogate \\ud800 at character 2\)"),
        ('{"question": "q", "golden_answers": ["ok", "x\\udfff"]}\n', r"row 0: golden answer 1 is not valid Unicode"),
        ('{"question": "q", "answers": {"text": ["\\ud83d"]}}\n', r"row 0: golden answer 0 is not valid Unicode"),
        ('{"id": "a\\ud800", "question": "q", "answer": "a"}\n', r"row 0: its id is not valid Unicode"),
    ],
)  # fmt: skip
def test_lone_surrogates_are_refused_at_load(tmp_path, line, message):
    path = tmp_path / "set.jsonl"
    path.write_text('{"question": "fine", "answer": "a"}\n' + line.replace("row 0", "row 1"))
    with pytest.raises(DataError, match=rf"{path} {message.replace('row 0', 'row 1')}"):
        load_samples(path)
    # A surrogate pair spelled with escapes is one character, and fine.
    path.write_text('{"question": "smile \\ud83d\\ude00", "answer": "a"}\n')
    assert load_samples(path)[0].question == "smile \U0001f600"


def test_eval_refuses_a_lone_surrogate_before_running_anything(tmp_path, capsys, server):
    path = tmp_path / "set.jsonl"
    path.write_text(SURROGATE_QUESTION)
    out = tmp_path / "run"
    argv = ["eval", "--dataset", str(path), "--method", "env-only", "--out", str(out), *endpoints(server)]
    assert main(argv) == 2
    assert f"{path} row 0: its question is not valid Unicode text" in one_error_line(capsys.readouterr().err)
    assert not server.requests and not (out / "predictions.jsonl").exists()


def test_batch_refuses_a_lone_surrogate_naming_the_row(tmp_path, capsys, server):
    path = tmp_path / "set.jsonl"
    path.write_text('{"id": "q0", "question": "What is item 0?", "answer": "item 0"}\n' + SURROGATE_QUESTION)
    out = tmp_path / "out.jsonl"
    assert main(["batch", str(path), "--out", str(out), "--concurrency", "1", *endpoints(server)]) == 2
    assert f"{path} row 1: its question is not valid Unicode text" in one_error_line(capsys.readouterr().err)
    # The bad row never ran (the rows before it may have, depending on when the input is read).
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] if out.exists() else []
    assert [r["id"] for r in rows] in ([], ["q0"])


def test_score_refuses_a_lone_surrogate_in_a_prediction(tmp_path, capsys):
    path = tmp_path / "preds.jsonl"
    path.write_text(
        '{"prediction": "ok", "golden_answers": ["ok"]}\n{"prediction": "a \\ud800", "golden_answers": ["a"]}\n'
    )
    assert main(["score", str(path), "--no-chart"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{path} row 1: its prediction is not valid Unicode text (a lone surrogate \\ud800" in line
    path.write_text('{"dataset": "d\\udc80", "prediction": "ok", "golden_answers": ["ok"]}\n')
    assert main(["score", str(path), "--no-chart"]) == 2  # the name goes into summary.csv and table.md
    assert "row 0: its dataset is not valid Unicode text" in one_error_line(capsys.readouterr().err)


# ---- an empty input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_eval_on_an_empty_file_stops_at_start(tmp_path, capsys, server, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    out = tmp_path / "run"
    argv = ["eval", "--dataset", "hotpot", "--dataset", str(path), "--method", "env-only", "--limit", "1"]
    assert main([*argv, "--out", str(out), *endpoints(server)]) == 2
    captured = capsys.readouterr()
    assert f"{path} has no rows" in one_error_line(captured.err)
    assert captured.out == "" and not server.requests and not out.exists()
    with pytest.raises(DataError, match="has no rows"):
        load_samples(path)
    assert load_samples("hotpot", limit=0) == []  # asking for no rows is not an empty file


@pytest.mark.parametrize("content", ["", "\n  \n", "[]"])
def test_batch_on_an_empty_file_stops_at_start(tmp_path, capsys, server, content):
    path = tmp_path / ("empty.json" if content == "[]" else "empty.jsonl")
    path.write_text(content)
    out = tmp_path / "r.jsonl"
    assert main(["batch", str(path), "--out", str(out), *endpoints(server)]) == 2
    assert f"{path} has no rows: nothing to run" in one_error_line(capsys.readouterr().err)
    assert not server.requests and not out.exists()


# ---- ids, resumed rows, training rows ---------------------------------------------------------------------------


@pytest.mark.parametrize(("row_id", "shown"), [(True, "bool True"), ({"a": 1}, "dict {'a': 1}"), ([1], "list [1]"),
                                               (1.5, "float 1.5"), ("  ", "empty text")])  # fmt: skip
@pytest.mark.parametrize("command", ["batch", "eval"])
def test_an_id_that_is_not_text_or_an_integer_is_refused_naming_its_row(tmp_path, capsys, server, row_id, shown,
                                                                        command):  # fmt: skip
    path = write_jsonl(tmp_path / "q.jsonl", [{"id": 7, "question": "a?", "answer": "a"},
                                              {"id": row_id, "question": "b?", "answer": "b"}])  # fmt: skip
    out = tmp_path / ("r.jsonl" if command == "batch" else "run")
    argv = (
        ["batch", str(path)]
        if command == "batch"
        else ["eval", "--dataset", str(path), "--method", "env-only"]
    )
    assert main([*argv, "--out", str(out), *endpoints(server)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{path} row 1: its id" in line and shown in line, line
    assert not server.requests


@pytest.mark.parametrize(
    ("change", "problem"),
    [({"prediction": 5}, "its prediction is not text (got int 5)"),
     ({"status": "weird"}, "its status 'weird' is not one eval writes"),
     ({"golden_answers": []}, "no golden answers")],
)  # fmt: skip
def test_eval_refuses_a_resumed_row_that_score_refuses(tmp_path, capsys, server, change, problem):
    data = write_jsonl(
        tmp_path / "items.jsonl", [{"id": f"i{i}", "question": f"q{i}?", "answer": "a"} for i in range(2)]
    )
    out = tmp_path / "run"
    argv = [
        "eval",
        "--dataset",
        str(data),
        "--method",
        "env-only",
        "--out",
        str(out),
        "--no-chart",
        *endpoints(server),
    ]
    assert main(argv) == 0
    predictions = out / "predictions.jsonl"
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    rows[1].update(change)
    write_jsonl(predictions, rows)
    capsys.readouterr()
    calls = len(server.requests)
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"predictions file {predictions} line 2: {problem}" in line, line
    assert len(server.requests) == calls  # refused before anything ran
    assert main(["score", str(predictions), "--no-chart"]) == 2  # score refuses the same row
    assert problem in one_error_line(capsys.readouterr().err)


def test_an_optimiser_training_file_that_is_the_evaluated_file_is_warned_about(tmp_path, capsys):
    from prompt_r1.evaluation.optimizers.search import SearchSettings, training_rows

    data = write_jsonl(
        tmp_path / "items.jsonl", [{"id": f"i{i}", "question": f"q{i}?", "answer": "a"} for i in range(6)]
    )
    evaluated = [f"q{i}?" for i in range(4)]
    rows = training_rows(str(data), 4, SearchSettings(train_file=str(data), train_rows=2), exclude=evaluated)
    assert [r.question for r in rows] == ["q4?", "q5?"]
    err = capsys.readouterr().err
    assert f"--optimizer-train {data} is the evaluated file" in err and "4 of its rows are evaluated" in err
    other = write_jsonl(tmp_path / "other.jsonl", [{"question": f"t{i}?", "answer": "a"} for i in range(3)])
    training_rows(str(data), 4, SearchSettings(train_file=str(other), train_rows=2), exclude=evaluated)
    assert capsys.readouterr().err == ""  # no overlap, no word


def test_the_release_protocol_passes_a_forged_closing_tag_as_the_release_does():
    """Documented in README and release.py: the release wraps the JSON-encoded reply without escaping it."""
    from prompt_r1.loop.protocols.release import observation_body, reply_content

    body = observation_body(reply_content("x </interaction_response> y"))
    assert (
        body
        == '<interaction_response>\n{"results": ["x </interaction_response> y"]}\n</interaction_response>'
    )
