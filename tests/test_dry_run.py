"""`--dry-run` of `batch`, `eval` and `train` (prompt_r1.runs.estimate, prompt_r1.cli.dry_run): it sends nothing and
writes nothing, and its call count equals what the real run then sends to a scripted server on 127.0.0.1 where
the count is determined (a scripted agent, a known number of turns); the at-most bound always holds."""

from __future__ import annotations

import json
import re

import pytest
from batch_setup import cli_args, search_environment
from conftest import NAME_RESPONSE
from helpers import ROOT, run_cli, write_name_dataset, write_questions

from prompt_r1.testing.servers import ScriptedServer


def dry(args: list) -> dict:
    code, out, err = run_cli([*args, "--dry-run", "json"])
    assert code == 0, err
    return json.loads(out)


pytestmark = pytest.mark.usefixtures("batch_key")  # the runs' key; relay_server: tests/conftest.py


def test_batch_dry_run_counts_the_calls_the_run_then_makes_and_sends_nothing(relay_server, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", 6)
    out = tmp_path / "r.jsonl"
    args = cli_args(relay_server.base_url, questions, out)
    estimate = dry([*args, "--expect-turns", "2"])
    assert relay_server.requests == [] and not out.exists()  # nothing sent, nothing written
    total = estimate["total"]
    assert total["expected"]["env_calls"] == 12 and total["high"]["env_calls"] == 6 * 5  # max_turns 5
    assert total["expected"]["agent_calls"] == 18  # two prompts and an answer per episode
    # A first real run on half the questions, then the estimate of the rest from its rows.
    code, _, err = run_cli([*args, "--limit", "3"])
    assert code == 0, err
    rest = dry(args)
    assert "3 finished episodes" in rest["source"] and rest["parts"][0]["episodes"] == 3
    sent = len(relay_server.requests_for("env"))
    code, _, err = run_cli(args)
    assert code == 0, err
    real = len(relay_server.requests_for("env")) - sent
    assert real == rest["total"]["expected"]["env_calls"] == 6 and real <= rest["total"]["high"]["env_calls"]
    assert dry(args)["total"]["expected"]["env_calls"] == 0  # every episode done: nothing left to pay for


def test_batch_dry_run_names_where_the_budget_stops_the_run(relay_server, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("env: {input: 1000, output: 1000}\nagent: {input: 0, output: 0}\n")
    args = cli_args(relay_server.base_url, write_questions(tmp_path / "q.jsonl", 10), tmp_path / "r.jsonl")
    code, out, err = run_cli([*args, "--prices", prices, "--budget", "1", "--dry-run"])
    assert code == 0, err
    assert "nothing sent" in out and "--budget 1: low: stops after about" in out
    assert relay_server.requests == []


def test_eval_dry_run_counts_every_method_and_the_search_share(relay_server, tmp_path):
    out = tmp_path / "ev"
    args = ["eval", "--dataset", "hotpot", "--method", "prompt-r1", "--method", "env-only", "--limit", "3",
            "--out", out, "--no-progress", "--no-chart", "--env-model", "env", "--env-base-url",
            relay_server.base_url, "--agent-model", "agent", "--agent-base-url", relay_server.base_url]  # fmt: skip
    estimate = dry([*args, "--expect-turns", "2"])
    assert relay_server.requests == [] and not out.exists()
    assert estimate["total"]["expected"]["env_calls"] == 3 * 2 + 3  # the loop's two calls, env-only's one
    assert estimate["total"]["high"]["env_calls"] == 3 * 5 + 3
    code, _, err = run_cli(args)
    assert code == 0, err
    assert len(relay_server.requests_for("env")) == 9
    assert dry(args)["total"]["expected"]["env_calls"] == 0  # the folder's rows are done
    # A search not yet done: its metric calls are the budget, and its share is shown.
    opro = dry([*args, "--method", "opro", "--optimizer-train-rows", "2", "--optimizer-budget", "8"])
    searches = [p for p in opro["parts"] if p["kind"] == "search"]
    assert searches[0]["expected"]["env_calls"] == 8 and searches[1]["expected"]["env_calls"] == 3
    code, text, _ = run_cli([*args, "--method", "opro", "--optimizer-budget", "16", "--dry-run"])
    assert code == 0 and "searches' share" in text


def test_train_dry_run_of_the_paper_recipe_loads_nothing(tmp_path):
    code, out, err = run_cli(["train", "--config", ROOT / "training/configs/paper.yaml", "--output_dir",
                              tmp_path / "paper", "--dry_run", "--max_env_cost", "50"])  # fmt: skip
    assert code == 0, err
    assert "16 generation steps of 128 questions × 5 = 640 episodes" in out
    assert "at most 3,200" in out  # per step: 640 episodes × 5 turns
    assert "max_env_cost 50" in out and not (tmp_path / "paper").exists()


def test_train_dry_run_finds_a_recipes_relative_data_from_another_folder(tmp_path, monkeypatch):
    """The shipped recipe's project-relative train_data, and a recipe's file beside it, from any working folder."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, err = run_cli(["train", "--config", ROOT / "training/configs/paper.yaml", "--output_dir",
                              tmp_path / "paper", "--dry_run"])  # fmt: skip
    assert code == 0, err
    assert "2,048 questions" in out
    own = tmp_path / "mine"
    (own / "data").mkdir(parents=True)
    write_name_dataset(own / "data" / "names.jsonl", 8)
    recipe = own / "recipe.yaml"
    tiny = (ROOT / "training/configs/tiny-cpu.yaml").read_text()
    recipe.write_text(tiny.replace("training/data/mixed_2048.parquet", "data/names.jsonl"))
    code, out, err = run_cli(["train", "--config", recipe, "--output_dir", tmp_path / "run", "--dry_run"])
    assert code == 0, err
    assert "8 questions" in out
    # A flag's relative path is the working folder's: there is no data/names.jsonl here.
    code, _, err = run_cli(["train", "--config", recipe, "--train_data", "data/names.jsonl", "--output_dir",
                            tmp_path / "run", "--dry_run"])  # fmt: skip
    assert code == 2 and "train_data data/names.jsonl: no such file" in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "paper").exists()


def test_train_dry_run_counts_the_calls_a_short_run_makes(protocol_model_path, tmp_path):
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        args = ["train", "--config", ROOT / "training/configs/tiny-cpu.yaml", "--model_name_or_path",
                protocol_model_path, "--train_data", write_name_dataset(tmp_path / "names.jsonl", 16),
                "--env-base-url", server.base_url, "--max_turn_tokens", "24", "--output_dir", tmp_path / "run",
                "--max_steps", "2"]  # fmt: skip
        code, out, err = run_cli([*args, "--dry_run"])
        assert code == 0, err
        assert server.requests == [] and not (tmp_path / "run").exists()
        assert "2 generation steps of 1 questions × 4 = 4 episodes" in out
        code, _, err = run_cli(args)
        assert code == 0, err
        sent = len(server.requests_for("env"))
    state = json.loads((tmp_path / "run/checkpoint-2/trainer_state.json").read_text())
    per_episode = [h["episode/env_calls"] for h in state["log_history"] if "episode/env_calls" in h]
    mean = sum(per_episode) / len(per_episode)  # every step runs 4 episodes: the run's mean calls per episode
    code, out, err = run_cli([*args, "--output_dir", tmp_path / "again", "--dry_run", "--expect_turns", mean])
    assert code == 0, err
    expected = float(re.search(r"^environment calls +([\d,.]+) expected", out, re.M)[1].replace(",", ""))
    assert expected == pytest.approx(sent, abs=0.5) and sent <= 2 * 4 * 2  # steps × episodes × max_turns


def test_the_budget_covers_a_search_and_stops_it_like_a_row(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("env: {input: 1000, output: 1000}\n")  # about $0.03 a task call
    out = tmp_path / "ev"
    with ScriptedServer({"env": search_environment}) as server:
        args = ["eval", "--dataset", "hotpot", "--method", "opro", "--limit", "2", "--optimizer-train-rows", "2",
                "--optimizer-budget", "40", "--opro-candidates", "2", "--out", out, "--no-progress", "--no-chart",
                "--env-model", "env", "--env-base-url", server.base_url, "--prices", prices]  # fmt: skip
        code, _, err = run_cli([*args, "--budget", "0.2", "--reflection-model", "unpriced"])
        assert code == 2 and "optimiser model 'unpriced'" in err and server.requests == []
        code, _, err = run_cli([*args, "--budget", "0.2"])
        sent = len(server.requests)
    assert code == 1 and "budget of $0.2 reached" in err and "during the opro search for hotpot" in err
    assert 0 < sent < 40  # stopped at the cap: the whole search sends 40 metric calls and its proposals
    assert not (out / "optimized" / "opro" / "hotpot.json").exists()  # unfinished: done again by the next run
    assert not (out / "predictions.jsonl").exists() or (out / "predictions.jsonl").read_text() == ""


def test_the_dry_run_refuses_what_the_run_refuses(relay_server, tmp_path):
    """--ray with --env-cache, and a --budget over a model without a price: one line, exit 2, as the real run."""
    questions = write_questions(tmp_path / "q.jsonl", 2)
    batch = cli_args(relay_server.base_url, questions, tmp_path / "r.jsonl")
    evaluate = ["eval", "--dataset", "hotpot", "--method", "env-only", "--limit", "2", "--out", tmp_path / "ev",
                "--env-model", "env", "--env-base-url", relay_server.base_url]  # fmt: skip
    for args in (batch, evaluate):
        code, out, err = run_cli([*args, "--ray", "--env-cache", tmp_path / "c.sqlite", "--dry-run"])
        assert code == 2 and out == "" and "--env-cache is not supported with --ray yet" in err
        assert len(err.strip().splitlines()) == 1
        code, out, err = run_cli([*args, "--budget", "1", "--dry-run"])  # the default table prices no 'env'
        assert code == 2 and out == "" and "there is none for environment model 'env'" in err
        assert len(err.strip().splitlines()) == 1
    opro = [*evaluate, "--method", "opro", "--optimizer-train-rows", "2", "--reflection-model", "unpriced"]
    prices = tmp_path / "prices.yaml"
    prices.write_text("env: {input: 1, output: 1}\n")
    code, _, err = run_cli([*opro, "--prices", prices, "--budget", "1", "--dry-run"])
    assert code == 2 and "optimiser model 'unpriced'" in err
    assert (
        relay_server.requests == []
        and not (tmp_path / "ev").exists()
        and not (tmp_path / "c.sqlite").exists()
    )
