"""The manifest beside every output (`results.manifest.json`, `OUT/manifest.json`, `output_dir/manifest.json`): it
says what made the output, round-trips, and a run that would add results made under other settings is refused,
naming them, unless it is allowed."""

from __future__ import annotations

import json

import pytest
from batch_setup import SECRET, cli_args
from helpers import run_cli, tiny_grpo_config, write_questions

from prompt_r1.clients.costs import PriceTable
from prompt_r1.runs.manifest import (
    LIBRARIES,
    ManifestError,
    build_manifest,
    check_manifest,
    manifest_path,
    read_manifest,
    write_manifest,
)

pytestmark = pytest.mark.usefixtures("batch_key")


def test_the_manifest_round_trips_and_says_what_made_the_output(tmp_path):
    from prompt_r1.core import redaction

    redaction.register(SECRET)
    settings = {"environment": {"model": "env", "temperature": 0.0}, "note": f"key {SECRET}"}
    manifest = build_manifest("batch", settings, {"out": tmp_path / "r.jsonl"}, seeds={"agent": 3},
                              prices=PriceTable.load(), command_line=["prompt-r1", "batch", SECRET])  # fmt: skip
    path = manifest_path(results_file=tmp_path / "results.jsonl")
    assert path == tmp_path / "results.manifest.json"
    write_manifest(path, manifest)
    read = read_manifest(path)
    assert SECRET not in path.read_text()
    assert read["settings"]["measured"] == {
        "environment": {"model": "env", "temperature": 0.0},
        "note": "key ***",
    }
    assert read["settings"]["operational"] == {"out": str(tmp_path / "r.jsonl")}
    assert read["seeds"] == {"agent": 3} and read["command_line"] == ["prompt-r1", "batch", "***"]
    assert set(read["libraries"]) == set(LIBRARIES) and read["prompt_r1"]["version"]
    assert read["prices"]["usd_per_1m_tokens"]["gpt-4o-mini"]["input"] > 0
    assert read["machine"]["cpus"] >= 1 and isinstance(read["machine"]["gpus"], list)
    assert len(read["runs"]) == 1
    # The same settings resume; another is named, and allowed only when asked.
    assert check_manifest(path, read["settings"]["measured"], allow_changed=False, flag="--x") == (read, [])
    changed = {**read["settings"]["measured"], "environment": {"model": "env", "temperature": 0.7}}
    with pytest.raises(ManifestError, match=r"environment.temperature: 0.0 → 0.7\); .* or --x to mix them"):
        check_manifest(path, changed, allow_changed=False, flag="--x")
    earlier, changes = check_manifest(path, changed, allow_changed=True, flag="--x")
    write_manifest(path, build_manifest("batch", changed), earlier, changes)
    runs = read_manifest(path)["runs"]
    assert len(runs) == 2 and runs[1]["changed"] == ["environment.temperature: 0.0 → 0.7"]


def test_batch_writes_its_manifest_and_a_rerun_names_a_changed_setting(tmp_path, relay_server):
    inp = write_questions(tmp_path / "q.jsonl", 2)
    out = tmp_path / "results.jsonl"
    assert run_cli(cli_args(relay_server.base_url, inp, out))[0] == 0
    manifest = json.loads((tmp_path / "results.manifest.json").read_text())
    assert (
        manifest["command"] == "batch" and manifest["settings"]["measured"]["environment"]["model"] == "env"
    )
    assert SECRET not in (tmp_path / "results.manifest.json").read_text()
    # Endpoints, limits and memory bounds may change on a rerun; what the rows measure may not, unless allowed.
    assert run_cli(cli_args(relay_server.base_url, inp, out, "--concurrency", "3",
                            "--agent-generate-memory-mb", "512"))[0] == 0  # fmt: skip
    sent = len(relay_server.requests)
    code, _, err = run_cli(cli_args(relay_server.base_url, inp, out, "--env-temperature", "0.3"))
    assert code == 2 and "environment.temperature: None → 0.3" in err and "concurrency" not in err
    assert len(relay_server.requests) == sent
    code, _, err = run_cli(
        cli_args(relay_server.base_url, inp, out, "--env-temperature", "0.3", "--allow-changed-settings")
    )
    assert code == 0, err
    runs = json.loads((tmp_path / "results.manifest.json").read_text())["runs"]
    assert [r.get("changed") for r in runs] == [None, None, ["environment.temperature: None → 0.3"]]


def test_a_manifest_that_does_not_parse_is_one_line_and_left_as_it_is(tmp_path, relay_server):
    inp = write_questions(tmp_path / "q.jsonl", 1)
    out = tmp_path / "results.jsonl"
    broken = tmp_path / "results.manifest.json"
    broken.write_text('{"format": "prompt-r1 manifest", "settings": ')
    code, _, err = run_cli(cli_args(relay_server.base_url, inp, out))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "does not parse as a manifest" in err
    assert relay_server.requests == [] and not out.exists()
    assert broken.read_text() == '{"format": "prompt-r1 manifest", "settings": '
    folder = tmp_path / "eval"
    folder.mkdir()
    args = ["eval", "--dataset", str(inp), "--method", "env-only", "--out", str(folder), "--env-model", "env",
            "--env-base-url", relay_server.base_url, "--env-api-key-env", "BATCH_TEST_KEY",
            "--no-progress"]  # fmt: skip
    for text, says in (
        ("[1, 2]", "is not a prompt-r1 manifest"),
        ('{"format": ', "does not parse as a manifest"),
    ):
        (folder / "manifest.json").write_text(text)
        code, _, err = run_cli(args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
        assert relay_server.requests == [] and (folder / "manifest.json").read_text() == text
        assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"]


def test_eval_writes_its_manifest_and_allows_changed_settings_only_when_asked(tmp_path, relay_server):
    inp = write_questions(tmp_path / "q.jsonl", 1)
    args = ["eval", "--dataset", str(inp), "--method", "env-only", "--out", str(tmp_path / "out"), "--env-model",
            "env", "--env-base-url", relay_server.base_url, "--env-api-key-env", "BATCH_TEST_KEY",
            "--no-progress", "--no-chart"]  # fmt: skip
    assert run_cli(args)[0] == 0
    manifest = read_manifest(tmp_path / "out/manifest.json")
    assert manifest["settings"]["measured"]["methods"]["env-only"]["environment"]["model"] == "env"
    code, _, err = run_cli([*args, "--env-max-tokens", "50"])
    assert code == 2 and "environment.max_tokens: None → 50" in err and "--allow-changed-settings" in err
    assert run_cli([*args, "--env-max-tokens", "50", "--allow-changed-settings"])[0] == 0
    runs = read_manifest(tmp_path / "out/manifest.json")["runs"]
    assert runs[-1]["changed"] == ["env-only environment.max_tokens: None → 50"]


def test_eval_goes_on_to_more_rows_and_names_a_dataset_loaded_from_elsewhere(tmp_path, relay_server):
    """--limit and the scorer are operational (a run on the first rows goes on to more; a scorer rescores the same
    rows); a dataset label now loaded from another file is a changed setting, in the folder's one check."""
    inp = write_questions(tmp_path / "q.jsonl", 3)
    args = ["eval", "--method", "env-only", "--out", str(tmp_path / "out"), "--env-model", "env",
            "--env-base-url", relay_server.base_url, "--env-api-key-env", "BATCH_TEST_KEY",
            "--no-progress", "--no-chart"]  # fmt: skip
    assert run_cli([*args, "--dataset", str(inp), "--limit", "1"])[0] == 0
    code, _, err = run_cli([*args, "--dataset", str(inp), "--limit", "3", "--scorer", "release"])
    assert code == 0, err
    assert len((tmp_path / "out/predictions.jsonl").read_text().splitlines()) == 3
    manifest = read_manifest(tmp_path / "out/manifest.json")
    assert manifest["settings"]["measured"]["datasets"] == {"q": str(inp)} and len(manifest["runs"]) == 2
    assert manifest["settings"]["operational"]["limit"] == 3 and "changed" not in manifest["runs"][-1]
    (tmp_path / "other").mkdir()
    elsewhere = write_questions(tmp_path / "other" / "q.jsonl", 3)
    code, out, err = run_cli([*args, "--dataset", str(elsewhere)])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"dataset q: {str(inp)!r} → {str(elsewhere)!r}" in err and "--allow-changed-settings" in err
    assert len(read_manifest(tmp_path / "out/manifest.json")["runs"]) == 2  # nothing written
    assert run_cli([*args, "--dataset", str(elsewhere), "--allow-changed-settings"])[0] == 0
    assert read_manifest(tmp_path / "out/manifest.json")["runs"][-1]["changed"] == [
        f"dataset q: {str(inp)!r} → {str(elsewhere)!r}"
    ]


def test_train_resume_names_a_changed_setting(tmp_path):
    from prompt_r1.training.shared.run_manifest import train_manifest

    config = tiny_grpo_config(tmp_path / "run")
    train_manifest(config, resume=False)
    train_manifest(config, resume=False)  # a run afresh into the same folder: the history is kept
    written = read_manifest(tmp_path / "run/manifest.json")
    assert len(written["runs"]) == 2
    assert written["command"] == "train" and written["seeds"]["seed"] == 0
    assert written["settings"]["measured"]["learning_rate"] == config.learning_rate
    # A higher step count or spend cap is how a run is resumed; a new learning rate is another run.
    train_manifest(tiny_grpo_config(tmp_path / "run", max_steps=9, max_env_calls=100), resume=True)
    with pytest.raises(ManifestError, match=r"learning_rate: 0.001 → 0.01\).*--allow_changed_settings"):
        train_manifest(tiny_grpo_config(tmp_path / "run", learning_rate=1e-2), resume=True)
    train_manifest(tiny_grpo_config(tmp_path / "run", learning_rate=1e-2), resume=True, allow_changed=True)
    assert read_manifest(tmp_path / "run/manifest.json")["runs"][-1]["changed"] == [
        "learning_rate: 0.001 → 0.01"
    ]


def test_a_built_in_tasks_manifest_names_the_task_not_train_data(tmp_path):
    """`prompt-r1 train --task` trains through `train(config, task=...)` (prompt_r1/tasks/door_run.py): its
    manifest says which task made the rows, and a resume on another task's table is named."""
    from prompt_r1.training.shared.run_manifest import train_manifest

    task = {"name": "door-codes", "rows": 64, "environment": "scripted door table", "table_seed": 0}
    train_manifest(tiny_grpo_config(tmp_path / "run"), resume=False, task=task)
    written = read_manifest(tmp_path / "run/manifest.json")
    measured = written["settings"]["measured"]
    assert measured["task"] == task and "train_data" not in measured and written["command"] == "train"
    assert "train_data" not in written["settings"]["operational"]
    with pytest.raises(ManifestError, match=r"task.table_seed: 0 → 1\)"):
        train_manifest(tiny_grpo_config(tmp_path / "run"), resume=True, task={**task, "table_seed": 1})
