"""Every refusal as exact as the run's (issue 51, item 4): `batch --dry-run` refuses what the run refuses, with the
same line and exit 2; `--summary NAME.manifest.json` is refused before anything is written; the async trainer's
dry run prints its schedule; `max_inflight_tasks` 0 or below -1 is refused; an empty model folder is one line,
exit 2. Real files, a real scripted server on 127.0.0.1, the real CLI."""

from __future__ import annotations

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
