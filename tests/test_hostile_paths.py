"""Paths and files a careless user names: nothing that is not the command's own is ever changed, and each
problem is one line naming the file (exit 2). Complements test_hostile_servers.py and test_hostile_inputs.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from prompt_r1.cli.main import main
from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent


@pytest.fixture
def server():
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(1)}) as s:
        yield s


@pytest.fixture
def questions(tmp_path) -> Path:
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"q{i}", "question": f"Item {i}?"}) for i in range(2)) + "\n")
    return path


def flags(server: ScriptedServer) -> list[str]:
    return [
        "--agent-model", "agent", "--agent-base-url", server.base_url,
        "--env-model", "env", "--env-base-url", server.base_url, "--env-backoff-initial", "0.01",
    ]  # fmt: skip


def batch(server, inp: Path, out: Path, *extra: str) -> list[str]:
    return ["batch", str(inp), "--out", str(out), "--no-progress", *flags(server), *extra]


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("prompt-r1: error: "), err
    return lines[0]


@pytest.mark.parametrize("target", ["input", "out"])
def test_a_log_file_that_is_another_file_of_the_run_is_refused_untouched(
    target, server, questions, tmp_path, capsys
):
    out = tmp_path / "r.jsonl"
    log = questions if target == "input" else out
    before = questions.read_bytes()
    assert main(batch(server, questions, out, "--log-file", str(log))) == 2
    assert not server.requests
    assert "--log-file" in one_error_line(capsys.readouterr().err)
    assert questions.read_bytes() == before and not out.exists()


def test_a_one_line_file_of_someone_else_without_a_newline_is_refused_untouched(
    server, questions, tmp_path, capsys
):
    other = tmp_path / "other.jsonl"
    other.write_bytes(b'{"id": "q9", "question": "precious data", "golden_answers": ["y"]}')
    assert main(batch(server, questions, other)) == 2
    assert "line 1 is not a results row" in one_error_line(capsys.readouterr().err)
    assert other.read_bytes() == b'{"id": "q9", "question": "precious data", "golden_answers": ["y"]}'


def test_a_checkpoint_that_is_someone_elses_database_is_refused_untouched(
    server, questions, tmp_path, capsys
):
    db = tmp_path / "mine.sqlite"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE users (name TEXT)")
    before = db.read_bytes()
    assert main(batch(server, questions, tmp_path / "r.jsonl", "--checkpoint", str(db))) == 2
    assert "a database with other tables (users)" in one_error_line(capsys.readouterr().err)
    assert db.read_bytes() == before and not (tmp_path / "r.jsonl").exists()


def test_a_checkpoint_that_is_the_input_leaves_no_output_behind(server, questions, tmp_path, capsys):
    assert main(batch(server, questions, tmp_path / "r.jsonl", "--checkpoint", str(questions))) == 2
    assert "is the input file" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("row", ["deep", "huge-int"])
def test_input_json_that_python_cannot_take_is_one_line(row, server, tmp_path, capsys):
    inp = tmp_path / "q.jsonl"
    value = "[" * 100_000 + "]" * 100_000 if row == "deep" else "1" * 5000
    inp.write_text('{"id": "q0", "question": "Item?", "extra": ' + value + "}\n")
    assert main(batch(server, inp, tmp_path / "r.jsonl")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{inp} line 1: JSON this reader cannot take" in line


@pytest.mark.parametrize("content", [b"{not json", b'{"a": 1}'])
def test_an_eval_folder_whose_settings_file_is_not_ours_is_one_line(content, server, tmp_path, capsys):
    data = tmp_path / "qs.jsonl"
    data.write_text(json.dumps({"id": "1", "question": "Where?", "golden_answers": ["Paris"]}) + "\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "run.json").write_bytes(content)
    code = main(
        ["eval", "--dataset", str(data), "--out", str(tmp_path / "out"), "--no-progress", *flags(server)]
    )
    assert code == 2 and "is not the settings file" in one_error_line(capsys.readouterr().err)
    assert (tmp_path / "out" / "run.json").read_bytes() == content and not server.requests


def test_an_eval_input_inside_its_own_out_folder_is_refused(server, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    data = out / "predictions.jsonl"
    data.write_text(json.dumps({"id": "1", "question": "Where?", "golden_answers": ["Paris"]}) + "\n")
    before = data.read_bytes()
    code = main(["eval", "--dataset", str(data), "--out", str(out), "--no-progress", *flags(server)])
    assert code == 2 and "is inside the --out folder" in one_error_line(capsys.readouterr().err)
    assert data.read_bytes() == before


@pytest.mark.parametrize("flag", ["--config", "--prices", "--env-pool"])
@pytest.mark.parametrize("problem", ["not-utf8", "bad-yaml"])
def test_settings_files_that_cannot_be_read_are_one_line(flag, problem, server, questions, tmp_path, capsys):
    path = tmp_path / "settings.yaml"
    path.write_bytes(b"loop:\n  max_turns: \xff\n" if problem == "not-utf8" else b"loop: [unclosed\n  x: {\n")
    code = main(batch(server, questions, tmp_path / "r.jsonl", flag, str(path)))
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and str(path) in line
    assert ("is not UTF-8 text" if problem == "not-utf8" else "is not valid YAML/JSON") in line


@pytest.mark.parametrize("name", ["./my-trained-agent", "no//such//id", "/no/such/folder"])
def test_loading_a_model_that_is_not_there_is_one_line_from_any_caller(name, tmp_path, monkeypatch):
    """Not only the CLI: a Python caller of the loader gets the same one line naming the model, never the hub
    client's HFValidationError for a path that is no hub id."""
    from prompt_r1.agents.local import load_transformers_model
    from prompt_r1.core.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="agent model .*no such model folder"):
        load_transformers_model(name)
