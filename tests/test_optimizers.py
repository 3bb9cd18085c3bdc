"""Prompt-optimiser baselines (prompt_r1.evaluation.optimizers.opro, prompt_r1.evaluation.optimizers.search): OPRO's meta-prompt loop, and `eval --method
opro` end to end against a scripted environment on 127.0.0.1 that answers right only under a good instruction."""

from __future__ import annotations

import asyncio
import csv
import itertools
import json

import pytest

from prompt_r1.cli.main import main
from prompt_r1.core.errors import ConfigError
from prompt_r1.data.datasets import load_samples
from prompt_r1.evaluation.harness import read_predictions
from prompt_r1.evaluation.optimizers.opro import OproSettings, meta_prompt, opro_search, parse_instruction
from prompt_r1.evaluation.optimizers.search import SearchSettings, training_rows
from prompt_r1.testing.servers import ScriptedServer

GOLD = {s.question: s.golden_answers[0] for s in load_samples("hotpot", limit=12)}
GOOD = "Read the question carefully."


def environment():
    """Task requests are answered right only under an instruction with "carefully" in it; optimiser requests
    propose, in turn, the good instruction and a useless one."""
    proposals = itertools.cycle([f"Sure. <INS>{GOOD}</INS>", "<INS>Answer.</INS>"])

    def respond(body: dict) -> str:
        text = body["messages"][-1]["content"]
        if text.startswith("Your task is to generate the instruction <INS>"):
            return next(proposals)
        question = next(q for q in GOLD if q in text)
        return f"<answer>{GOLD[question] if 'carefully' in text else 'no idea'}</answer>"

    return respond


def test_the_meta_prompt_lists_the_best_instructions_ascending_then_the_problems():
    prompt = meta_prompt([("b", 0.5), ("a", 0.9), ("c", 0.1), ("b", 0.2)], [("Q1?", ["x"])], keep=2)
    assert prompt.index("text:\nb\nscore:\n50") < prompt.index("text:\na\nscore:\n90")
    assert "text:\nc" not in prompt  # only the best two, each instruction once
    assert "input:\nQ: <INS>\nQ1?\nA:\nGround truth answer:\nx" in prompt  # the OPRO code's exemplar format
    assert prompt.endswith("all problems above.")
    assert parse_instruction("x <INS> Be brief. </INS> y") == "Be brief."
    assert (
        parse_instruction("[Think first.]") == "Think first."
        and parse_instruction(" Just this. ") == "Just this."
    )
    assert parse_instruction("   ") is None


def test_opro_keeps_to_its_budget_and_returns_the_best_instruction():
    async def evaluate(instruction: str) -> tuple[float, int]:
        return (1.0 if "carefully" in instruction else 0.2), 4

    replies = itertools.cycle([f"<INS>{GOOD}</INS>", "<INS>Hurry.</INS>", "<INS>Be brief.</INS>"])

    async def propose(prompt: str) -> str:
        return next(replies)

    rows = [(f"Q{i}?", ["a"]) for i in range(4)]
    state = asyncio.run(opro_search(evaluate, propose, rows, budget=14, settings=OproSettings(candidates=3)))
    assert state.metric_calls <= 14 and state.best() == (GOOD, 1.0)
    assert [i for i, _ in state.scored] == ["", GOOD, "Hurry.", "Be brief."][: len(state.scored)]


def test_training_rows_are_the_rows_after_the_evaluated_ones_and_never_an_evaluated_question(tmp_path):
    rows = training_rows("hotpot", 64, SearchSettings(train_rows=3))
    assert [r.index for r in rows] == [64, 65, 66]
    with pytest.raises(ConfigError, match="no rows apart from the 128 evaluated ones"):
        training_rows("hotpot", 128, SearchSettings())
    # DAPO-Math holds one question at rows 62 and 71: evaluating rows 0-63, row 71 is left out of the training.
    dapo = load_samples("dapo")
    assert dapo[62].question == dapo[71].question
    evaluated = [s.question for s in dapo[:64]]
    train = training_rows("dapo", 64, SearchSettings(train_rows=16), exclude=evaluated)
    assert 71 not in [r.index for r in train] and len(train) == 16
    mine = tmp_path / "train.jsonl"  # a file of the user's is checked the same way
    mine.write_text(json.dumps({"question": evaluated[0], "answer": "x"}) + "\n")
    with pytest.raises(ConfigError, match="no rows apart from"):
        training_rows("dapo", 64, SearchSettings(train_file=str(mine)), exclude=evaluated)


def test_a_search_with_failed_calls_is_done_again_and_a_budget_below_one_pass_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    failing = {"fail": True}

    def flaky(body: dict) -> str:
        if failing["fail"] and body["messages"][-1]["content"].startswith("Your task is to generate"):
            raise RuntimeError("down")  # the scripted server answers 500
        return environment()(body)

    with ScriptedServer({"env": flaky}) as server:
        args = ["eval", "--dataset", "hotpot", "--method", "opro", "--limit", "2", "--optimizer-train-rows", "2",
                "--optimizer-budget", "6", "--opro-candidates", "2", "--out", str(out), "--no-progress",
                "--no-chart", "--env-model", "env", "--env-base-url", server.base_url, "--env-max-retries", "0"]  # fmt: skip
        assert main(args) == 0
        first = json.loads((out / "optimized" / "opro" / "hotpot.json").read_text())
        assert first["calls"]["failed"] > 0 and "failed after their retries" in capsys.readouterr().err
        failing["fail"] = False
        assert main(args) == 0  # the search is done again; the rows, finished, are not
        second = json.loads((out / "optimized" / "opro" / "hotpot.json").read_text())
        assert second["calls"]["failed"] == 0 and second["instruction"] == GOOD
        assert main([*args, "--optimizer-budget", "1"]) == 2
    assert "cannot score one instruction on --optimizer-train-rows 2" in capsys.readouterr().err


def test_eval_opro_searches_on_other_rows_then_answers_the_same_rows_as_every_method(tmp_path, capsys):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"env": {"input": 1.0, "output": 2.0}}))
    out = tmp_path / "run"
    with ScriptedServer({"env": environment()}) as server:
        args = ["eval", "--dataset", "hotpot", "--method", "env-only", "--method", "opro", "--limit", "3",
                "--optimizer-train-rows", "2", "--optimizer-budget", "8", "--opro-candidates", "2",
                "--out", str(out), "--no-progress", "--no-chart", "--prices", str(prices),
                "--env-model", "env", "--env-base-url", server.base_url]  # fmt: skip
        assert main(args) == 0
        sent = len(server.requests)
        assert main(args) == 0  # a rerun: the search is read back and every row is done
        assert len(server.requests) == sent
    record = json.loads((out / "optimized" / "opro" / "hotpot.json").read_text())
    assert record["instruction"] == GOOD and record["score"] == 1.0
    assert record["metric_calls"] <= 8 and record["calls"]["task"] == record["metric_calls"]
    assert record["calls"]["reflection"] >= 2 and record["cost_usd"] > 0
    evaluated = {r["id"] for r in read_predictions(out / "predictions.jsonl")}
    assert evaluated == {"hotpot-0", "hotpot-1", "hotpot-2"} and not evaluated & set(record["train_ids"])
    with (out / "summary.csv").open() as handle:
        table = {r["method"]: r for r in csv.DictReader(handle)}
    assert float(table["opro"]["em"]) == 1.0 and float(table["env-only"]["em"]) == 0.0
    assert int(table["opro"]["search_calls"]) == record["metric_calls"] + record["calls"]["reflection"]
    assert float(table["opro"]["search_usd"]) == pytest.approx(record["cost_usd"])
    assert table["env-only"]["search_calls"] == ""
    assert "| Search calls | Search $ |" in (out / "table.md").read_text()
    # Another search budget is another search: the folder's rows were made under this one.
    assert main([*args[:-2], "--optimizer-budget", "6", "--env-base-url", "http://127.0.0.1:9/v1"]) == 2
    assert "search.budget: 8 → 6" in capsys.readouterr().err


def gepa_environment():
    """As `environment`, but the optimiser's requests are GEPA's reflection prompts, answered with a new
    instruction in a ``` block, as GEPA asks."""

    def respond(body: dict) -> str:
        text = body["messages"][-1]["content"]
        if "Your task is to write a new instruction for the assistant." in text:
            return f"```\n{GOOD}\n```"
        question = next(q for q in GOLD if q in text)
        return f"<answer>{GOLD[question] if 'carefully' in text else 'no idea'}</answer>"

    return respond


def test_eval_gepa_runs_the_gepa_package_with_every_call_through_our_client(tmp_path):
    pytest.importorskip("gepa")
    out = tmp_path / "run"
    with ScriptedServer({"env": gepa_environment()}) as server:
        args = ["eval", "--dataset", "hotpot", "--method", "gepa", "--limit", "3", "--optimizer-train-rows", "3",
                "--optimizer-budget", "12", "--out", str(out), "--no-progress", "--no-chart",
                "--env-model", "env", "--env-base-url", server.base_url]  # fmt: skip
        assert main(args) == 0
        requests = server.requests_for("env")
    record = json.loads((out / "optimized" / "gepa" / "hotpot.json").read_text())
    assert record["instruction"] == GOOD and record["score"] == 1.0
    assert (
        record["calls"]["reflection"] >= 1 and 0 < record["metric_calls"] <= 12 + 3
    )  # GEPA may finish a batch
    # Every call of the search and of the rows reached our server through the environment client.
    assert len(requests) == record["calls"]["task"] + record["calls"]["reflection"] + 3
    with (out / "summary.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["method"] == "gepa" and float(row["em"]) == 1.0


def textgrad_environment():
    """As `environment`, but the optimiser's requests are TextGrad's (its backward and update prompts): the update
    is answered with the good instruction between TextGrad's tags, any other with feedback."""

    def respond(body: dict) -> str:
        text = body["messages"][-1]["content"]
        if "<IMPROVED_VARIABLE>" in text:
            return f"<IMPROVED_VARIABLE>{GOOD}</IMPROVED_VARIABLE>"
        if "<LM_SYSTEM_PROMPT>" in text or "<FEEDBACK>" in text or "evaluation" in text.lower()[:400]:
            return "Ask the model to read the question carefully."
        question = next(q for q in GOLD if q in text)
        return f"<answer>{GOLD[question] if 'carefully' in text else 'no idea'}</answer>"

    return respond


def test_eval_textgrad_runs_the_textgrad_package_with_every_call_through_our_client(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "LITELLM_LOCAL_MODEL_COST_MAP", "True"
    )  # textgrad imports litellm: no price list fetched
    monkeypatch.setenv("TEXTGRAD_LOG_DIR", str(tmp_path / "textgrad-logs"))  # its log, opened on import
    pytest.importorskip("textgrad")
    out = tmp_path / "run"
    with ScriptedServer({"env": textgrad_environment()}) as server:
        args = ["eval", "--dataset", "hotpot", "--method", "textgrad", "--limit", "3", "--optimizer-train-rows",
                "3", "--optimizer-budget", "9", "--out", str(out), "--no-progress", "--no-chart",
                "--env-model", "env", "--env-base-url", server.base_url]  # fmt: skip
        assert main(args) == 0
        requests = server.requests_for("env")
    record = json.loads((out / "optimized" / "textgrad" / "hotpot.json").read_text())
    assert record["instruction"] == GOOD and record["score"] == 1.0 and record["metric_calls"] <= 9
    assert record["calls"]["reflection"] >= 2  # TextGrad's backward pass and its update
    assert len(requests) == record["calls"]["task"] + record["calls"]["reflection"] + 3
    with (out / "summary.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["method"] == "textgrad" and float(row["em"]) == 1.0


def test_a_textgrad_step_whose_update_has_no_tags_keeps_the_instruction(tmp_path, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.setenv("TEXTGRAD_LOG_DIR", str(tmp_path / "textgrad-logs"))
    pytest.importorskip("textgrad")
    from prompt_r1.evaluation.optimizers.textgrad_search import SEED_INSTRUCTION, textgrad_search

    async def reply(instruction: str, question: str) -> str:
        return "<answer>no idea</answer>"

    async def propose(prompt: str) -> str:
        return "I would rather not say."  # never TextGrad's <IMPROVED_VARIABLE> tags

    rows = [(q, [a]) for q, a in list(GOLD.items())[:3]]
    best, score, calls, tried = asyncio.run(
        textgrad_search(reply, lambda text, golds: 0.0, propose, rows, budget=12)
    )
    assert best == SEED_INSTRUCTION and calls <= 12 and [i for i, _ in tried] == [SEED_INSTRUCTION]
