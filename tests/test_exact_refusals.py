"""Every refusal as exact as the run's (issue 51, item 4): `batch --dry-run` refuses what the run refuses, with the
same line and exit 2; `--summary NAME.manifest.json` is refused before anything is written; the async trainer's
dry run prints its schedule; `max_inflight_tasks` 0 or below -1 is refused; an empty model folder is one line,
exit 2, for `train` and `run` alike. Real files, a real scripted server on 127.0.0.1, the real CLI."""

from __future__ import annotations

import json

import pytest
from batch_setup import cli_args
from helpers import run_cli, tiny_grpo_config, tiny_train_args, write_name_dataset, write_questions

from prompt_r1.core.errors import ConfigError

pytestmark = pytest.mark.usefixtures("batch_key")


def test_the_dry_run_refuses_an_input_without_rows_as_the_run_does(tmp_path, relay_server):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    run = run_cli(cli_args(relay_server.base_url, empty, tmp_path / "a.jsonl"))
    dry = run_cli(cli_args(relay_server.base_url, empty, tmp_path / "b.jsonl", "--dry-run"))
    assert run[0] == dry[0] == 2 and run[2] == dry[2] and dry[2].count("\n") == 1, (run, dry)
    assert "has no rows" in dry[2] and dry[1] == ""


def test_a_summary_named_as_the_manifest_is_refused_before_anything_is_written(tmp_path, relay_server):
    inp, out = write_questions(tmp_path / "q.jsonl", 2), tmp_path / "out.jsonl"
    for other in ("out.manifest.json", "out.calls.sqlite"):
        code, _, err = run_cli(cli_args(relay_server.base_url, inp, out, "--summary", tmp_path / other))
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["q.jsonl"] and relay_server.requests == []
    assert run_cli(cli_args(relay_server.base_url, inp, out))[0] == 0  # a rerun is not blocked


def test_the_async_trainers_dry_run_prints_its_schedule(tmp_path):
    data = write_name_dataset(tmp_path / "d.jsonl", 8)
    args = tiny_train_args("unused", "http://127.0.0.1:9/v1", data, tmp_path / "out", "--async", "--dry-run")
    code, out, err = run_cli(args)
    assert code == 0, err
    assert "optimizer steps" in out and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [0, -5])
def test_max_inflight_tasks_zero_or_negative_is_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="max_inflight_tasks"):
        tiny_grpo_config(tmp_path / "run", async_grpo=True, max_inflight_tasks=value)
    tiny_grpo_config(tmp_path / "run", async_grpo=True, max_inflight_tasks=-1)  # auto stays allowed


def test_an_empty_model_folder_is_one_line_exit_2(tmp_path, relay_server):
    data = write_name_dataset(tmp_path / "d.jsonl", 4)
    (tmp_path / "model").mkdir()
    code, _, err = run_cli(tiny_train_args(tmp_path / "model", relay_server.base_url, data, tmp_path / "out"))
    lines = [line for line in err.splitlines() if "Triton" not in line]
    assert code == 2 and len(lines) == 1 and "holds no model" in lines[0], err


def test_run_with_an_empty_model_folder_is_one_line_exit_2_as_train(tmp_path, relay_server):
    """An empty model folder is the user's to fix: `run` says so in one line and exits 2, as `train` does."""
    (tmp_path / "model").mkdir()
    args = ["run", "q", "--agent-model", tmp_path / "model", "--env-model", "env", "--env-base-url",
            relay_server.base_url, "--env-api-key-env", "BATCH_TEST_KEY"]  # fmt: skip
    code, out, err = run_cli(args)
    lines = [line for line in err.splitlines() if "Triton" not in line]
    assert code == 2 and len(lines) == 1 and "holds no model" in lines[0], err
    assert "Traceback" not in err and out == "" and relay_server.requests == []


def _rows_file(path, rows, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def test_the_dry_runs_counts_agree_with_the_run_under_limit(tmp_path, relay_server):
    """Issue 51 item 4: the dry run counted a repeated id twice and every finished row of --out (those past
    --limit, and ids the input lacks) as this run's; it now counts as the run's pool decides."""
    ids = ["a", "b", "b", "c", "d", "e", "f"]
    inp = _rows_file(tmp_path / "q.jsonl", [{"id": i, "question": f"question {i}?"} for i in ids])
    done = [
        {"id": "a", "question": "question a?", "status": "answered"},  # done
        {"id": "c", "question": "question c?", "status": "environment_error"},  # failed: run again
        {"id": "d", "question": "an older question?", "status": "answered"},  # kept for its question
        {"id": "e", "question": "question e?", "status": "answered"},  # past --limit 5
        {"id": "z", "question": "question z?", "status": "answered"},  # not in the input
    ]
    args = cli_args(relay_server.base_url, inp, tmp_path / "out.jsonl", "--limit", "5")
    _rows_file(tmp_path / "out.jsonl", done, tail='{"id": "f", "sta')  # a row cut mid-write
    code, out, err = run_cli([*args, "--dry-run", "json"])
    assert code == 0, err
    estimate = json.loads(out)
    assert relay_server.requests == []
    code, _, err = run_cli([*args, "--summary", tmp_path / "summary.json"])
    assert code == 1, err  # d kept for its older question: not every episode finished
    run = json.loads((tmp_path / "summary.json").read_text())
    assert run["written"] == 2 and run["skipped"] == 1 and run["duplicates"] == 1 and run["conflicts"] == 1
    assert estimate["counts"] == {
        "to_run": run["written"], "already_done": run["skipped"], "duplicates": run["duplicates"],
        "conflicts": run["conflicts"],
    }  # fmt: skip
    assert estimate["parts"][0]["episodes"] == run["written"]
    assert estimate["header"]["episodes"].startswith("2 to run · 1 already done in ")
    assert "1 duplicate ids" in estimate["header"]["episodes"]


def test_the_dry_run_refuses_a_results_file_with_a_bad_row_as_the_run_does(tmp_path, relay_server):
    inp = write_questions(tmp_path / "q.jsonl", 3)
    out = _rows_file(tmp_path / "out.jsonl", [{"id": "q0", "status": "answered"}, {"not": "a row"}])
    before = out.read_bytes()
    dry = run_cli(cli_args(relay_server.base_url, inp, out, "--dry-run"))
    run = run_cli(cli_args(relay_server.base_url, inp, out))
    assert run[0] == dry[0] == 2 and run[2] == dry[2] and dry[2].count("\n") == 1, (run, dry)
    assert "line 2 is not a results row" in dry[2] and out.read_bytes() == before


def _strict(text: str) -> dict:
    def refuse(name):
        raise AssertionError(f"{name} in the dry run's JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_dry_runs_json_never_prints_infinity(tmp_path, relay_server):
    """Issue 51 item 4: `--env-rate-period 1e308` made the time the limits impose Infinity in the JSON (no JSON
    reader takes it); a --env-max-tokens past 1e308 tokens, or earlier rows whose usage says Infinity, gave a
    traceback. Beyond-measure figures are null in JSON and 'beyond measure' in text."""
    inp = write_questions(tmp_path / "q.jsonl", 3)
    args = cli_args(relay_server.base_url, inp, tmp_path / "out.jsonl", "--env-rate-period", "1e308",
                    "--env-rate-limit", "1")  # fmt: skip
    code, out, err = run_cli([*args, "--dry-run", "json"])
    assert code == 0, err
    assert _strict(out)["limit_seconds"] == {"low": None, "expected": None, "high": None}
    code, out, err = run_cli([*args, "--dry-run"])
    assert code == 0 and "beyond measure" in out, (out, err)
    huge = cli_args(relay_server.base_url, inp, tmp_path / "out.jsonl", "--env-max-tokens", "1" + "0" * 310)
    code, out, err = run_cli([*huge, "--dry-run", "json"])
    assert code == 0 and "Traceback" not in err, err
    assert _strict(out)["total"]["high"]["env_in"] is None
    earlier = _rows_file(tmp_path / "earlier.jsonl", [{
        "id": "x", "question": "q?", "status": "answered", "usage": {"agent_calls": 2, "agent_completion_tokens": 3},
        "turns": [{"kind": "prompt", "text": "<think>a</think>", "prompt": "p", "response": "r",
                   "environment_call": {"output_tokens": float("inf")}}, {"kind": "answer", "text": "a"}],
    }])  # fmt: skip
    code, out, err = run_cli([*cli_args(relay_server.base_url, inp, tmp_path / "o.jsonl"), "--expect-from", earlier,
                              "--dry-run", "json"])  # fmt: skip
    assert code == 0, err
    _strict(out)


@pytest.mark.parametrize("extra", [(), ("--dry-run",)])
def test_an_empty_ray_address_is_refused_not_taken_for_a_local_ray(tmp_path, relay_server, extra):
    """Issue 51 item 5: `--ray ''` (an unset shell variable) started a local Ray; it is refused in one line, exit
    2, nothing written or sent. `--ray` alone still means a local Ray (its dry run estimates)."""
    inp = write_questions(tmp_path / "q.jsonl", 2)
    code, _, err = run_cli(cli_args(relay_server.base_url, inp, tmp_path / "out.jsonl", "--ray", "", *extra))
    assert code == 2 and err.count("\n") == 1 and "--ray '' names no cluster" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.jsonl"] and relay_server.requests == []
    code, _, err = run_cli(cli_args(relay_server.base_url, inp, tmp_path / "out.jsonl", "--ray", "--dry-run"))
    assert code == 0, err
