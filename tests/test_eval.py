"""`prompt-r1 eval` and `prompt-r1 score` end to end on bundled rows against scripted HTTP servers."""

from __future__ import annotations

import csv
import json

import pytest

from prompt_r1.cli.main import main
from prompt_r1.core.errors import ConfigError
from prompt_r1.data.datasets import load_samples
from prompt_r1.evaluation.harness import read_predictions, resolve_plan
from prompt_r1.testing.servers import Fault, ScriptedServer

ROWS = {
    s.question: (s.index, s.golden_answers[0])
    for name in ("hotpot", "xsum")
    for s in load_samples(name, limit=3)
}


def answer_for(question: str) -> str:
    """Right on even rows, wrong on odd ones, so every method scores 2 of 3."""
    index, gold = ROWS[question]
    return gold if index % 2 == 0 else "zzz qqq"


def question_in(text: str) -> str:
    return next(q for q in ROWS if q in text)


def environment(body: dict) -> str:
    last = body["messages"][-1]["content"]
    if "<think>" in last or "Explain" in last:  # not a question: an interaction prompt from the agent
        return "some help"
    return f"Reasoning first. <answer>{answer_for(question_in(last))}</answer>"


def agent(body: dict) -> str:
    question = question_in(body["messages"][0]["content"])
    if (
        sum(m["role"] == "assistant" for m in body["messages"]) == 0
        and "First, provide" in body["messages"][0]["content"]
    ):
        return "<think>explain</think><interaction_prompt>Explain the question</interaction_prompt>"
    return f"<think>done</think><answer>{answer_for(question)}</answer>"


@pytest.fixture
def eval_server():
    with ScriptedServer({"env": environment, "agent": agent}) as server:
        yield server


def endpoint_flags(server) -> list[str]:
    return ["--env-model", "env", "--env-base-url", server.base_url, "--agent-model", "agent",
            "--agent-base-url", server.base_url, "--no-progress"]  # fmt: skip


def summary(out) -> dict[tuple[str, str], dict[str, str]]:
    with (out / "summary.csv").open() as handle:
        return {(r["dataset"], r["method"]): r for r in csv.DictReader(handle)}


def test_eval_writes_rows_tables_chart_and_resumes(eval_server, tmp_path, capsys):
    out = tmp_path / "run"
    methods = [
        "--method",
        "prompt-r1",
        "--method",
        "env-only",
        "--method",
        "agent-only",
        "--method",
        "env-cot",
    ]
    args = ["eval", "--dataset", "hotpot", "--dataset", "xsum", *methods, "--limit", "3", "--out", str(out)]
    assert main(args + endpoint_flags(eval_server)) == 0
    printed = capsys.readouterr().out

    rows = read_predictions(out / "predictions.jsonl")
    assert len(rows) == 2 * 4 * 3
    table = summary(out)
    for dataset in ("hotpot", "xsum"):
        for method in ("prompt-r1", "env-only", "agent-only", "env-cot"):
            row = table[(dataset, method)]
            assert (row["n"], row["failed"]) == ("3", "0")
            assert float(row["f1"]) == pytest.approx(2 / 3), (dataset, method)
    assert float(table[("hotpot", "env-only")]["em"]) == pytest.approx(2 / 3)
    assert table[("hotpot", "env-only")]["ssim"] == ""  # SSim only where the paper reports it
    assert 0.6 < float(table[("xsum", "env-only")]["ssim"]) < 0.8  # two identical articles, one unrelated

    markdown = (out / "table.md").read_text()
    assert markdown in printed
    assert markdown.startswith(
        "| Method | HotpotQA EM | HotpotQA F1 | XSum F1 | XSum SSim | Avg. EM | Avg. F1 | Avg. SSim |"
    )
    assert "| Prompt-R1 | 66.67 | 66.67 | 66.67 |" in markdown
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    episode = next(r for r in rows if r["method"] == "prompt-r1" and r["index"] == 0)
    assert episode["status"] == "answered" and len(episode["turns"]) == 2
    assert episode["reward"] == {"paper": pytest.approx(-0.25), "release": pytest.approx(1.0)}
    baseline = next(r for r in rows if r["method"] == "env-cot")
    assert baseline["answer_tagged"] and baseline["response"].startswith("Reasoning first.")
    cot = [
        r.body for r in eval_server.requests_for("env") if "step by step" in r.body["messages"][-1]["content"]
    ]
    assert len(cot) == 6
    alone = [
        r.body
        for r in eval_server.requests_for("agent")
        if "First, provide" not in r.body["messages"][0]["content"]
    ]
    assert len(alone) == 6 and all(body["stop"] == ["</answer>"] for body in alone)

    # A rerun finds every row finished: no request is sent and no row is added.
    sent = len(eval_server.requests)
    assert main(args + endpoint_flags(eval_server)) == 0
    assert len(eval_server.requests) == sent
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 24


def test_failed_rows_are_reported_and_retried(eval_server, tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "eval",
        "--dataset",
        "hotpot",
        "--method",
        "env-only",
        "--limit",
        "3",
        "--out",
        str(out),
        "--env-max-retries",
        "0",
    ]
    eval_server.inject(Fault("400"), Fault("400"), model="env")
    assert main(args + endpoint_flags(eval_server)) == 1
    captured = capsys.readouterr()
    assert "2 rows failed; run the same command again to retry them" in captured.err
    assert "hotpot/env-only 1 (2 failed, left out)" in captured.out
    assert sum(r["status"] == "environment_error" for r in read_predictions(out / "predictions.jsonl")) == 2

    sent = len(eval_server.requests_for("env"))
    assert main(args + endpoint_flags(eval_server)) == 0
    assert len(eval_server.requests_for("env")) == sent + 2  # only the failed rows ran again
    assert summary(out)[("hotpot", "env-only")]["failed"] == "0"
    assert float(summary(out)[("hotpot", "env-only")]["em"]) == pytest.approx(2 / 3)


def test_a_folder_refuses_rows_from_other_settings(eval_server, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["eval", "--dataset", "hotpot", "--method", "env-only", "--limit", "1", "--out", str(out)]
    assert main(args + endpoint_flags(eval_server)) == 0
    changed = [*endpoint_flags(eval_server), "--env-temperature", "0.3", "--env-max-in-flight", "2"]
    assert main(args + changed) == 2
    err = capsys.readouterr().err
    assert "environment.temperature: None → 0.3" in err and "max_in_flight" not in err


def test_eval_usage_errors(capsys):
    assert main(["eval", "--method", "env-only"]) == 2
    assert "give --suite or at least one --dataset" in capsys.readouterr().err
    assert main(["eval", "--dataset", "nope"]) == 2
    assert "unknown dataset 'nope'" in capsys.readouterr().err
    assert resolve_plan("ablation", ["my.jsonl"], None)[1] == ["prompt-r1", "agent-only", "env-only"]
    assert len(resolve_plan("paper-main", None, ["env-only"])[0]) == 8
    assert resolve_plan("paper-ood", None, None)[0] == ["mathqa", "squad_v2", "triviaqa", "xsum"]
    with pytest.raises(ConfigError, match="unknown method"):
        resolve_plan(None, ["hotpot"], ["w/o"])


def test_score_a_predictions_file(tmp_path, capsys):
    path = tmp_path / "preds.jsonl"
    rows = [
        {"prediction": "Paris", "golden_answers": ["Paris"]},
        {"prediction": "the Paris region", "golden_answers": ["Paris", "Île-de-France"]},
        {"prediction": None, "golden_answers": ["Rome"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["score", str(path), "--no-chart"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| Method | preds EM | preds SM | preds F1 | Avg. EM | Avg. SM | Avg. F1 |")
    assert "| predictions | 33.33 | 66.67 | 55.56 | 33.33 | 66.67 | 55.56 |" in out
    with (tmp_path / "preds.summary.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert (row["n"], row["em"], row["sm"]) == ("3", "0.333333", "0.666667")

    assert (
        main(
            [
                "score",
                str(path),
                "--metric",
                "f1",
                "--metric",
                "ssim",
                "--no-chart",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    assert "preds SSim" in capsys.readouterr().out

    path.write_text(json.dumps({"prediction": "x"}) + "\n")
    assert main(["score", str(path)]) == 2
    assert "row 0: no golden answers" in capsys.readouterr().err
    path.write_text(json.dumps({"golden_answers": ["x"]}) + "\n")
    assert main(["score", str(path)]) == 2
    assert "row 0: no prediction" in capsys.readouterr().err


def test_score_counts_rows_without_ids_and_gives_no_answer_nothing(tmp_path, capsys):
    path = tmp_path / "preds.jsonl"
    rows = [
        {"id": None, "prediction": None, "golden_answers": ["A"]},  # normalises to "": still no credit
        {"id": None, "prediction": "costs $5", "golden_answers": "$"},
        {"id": None, "prediction": "x", "answer": 7},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["score", str(path), "--no-chart"]) == 0
    with (tmp_path / "preds.summary.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert (row["n"], row["em"], row["sm"], row["f1"]) == ("3", "0.000000", "0.333333", "0.000000")


def test_a_row_cut_short_by_a_crash_is_dropped_and_the_run_resumes(eval_server, tmp_path):
    path = tmp_path / "predictions.jsonl"
    good = {"method": "m", "dataset": "d", "id": "1", "status": "answered"}
    path.write_text(json.dumps(good) + "\n" + '{"method": "m", "dataset": "d", "id": "2", "predic')
    assert read_predictions(path) == [good]

    out = tmp_path / "run"
    args = ["eval", "--dataset", "hotpot", "--method", "env-only", "--limit", "3", "--out", str(out)]
    assert main(args + endpoint_flags(eval_server)) == 0
    predictions = out / "predictions.jsonl"
    text = predictions.read_text()
    predictions.write_text(text[: text.rindex("{") + 20])  # the last row cut mid-write, as by a kill
    assert main(args + endpoint_flags(eval_server)) == 0  # that row runs again and lands on its own line
    assert len(read_predictions(predictions)) == 3
    assert all(json.loads(line) for line in predictions.read_text().splitlines())


def test_datasets_with_one_name_are_refused(eval_server, tmp_path, capsys):
    mine = tmp_path / "hotpot.jsonl"
    mine.write_text(json.dumps({"question": "Mine?", "golden_answers": ["yes"]}) + "\n")
    out = tmp_path / "run"
    flags = endpoint_flags(eval_server)
    assert (
        main(
            [
                "eval",
                "--dataset",
                "hotpot",
                "--dataset",
                str(mine),
                "--method",
                "env-only",
                "--out",
                str(out),
                *flags,
            ]
        )
        == 2
    )
    assert "two datasets are both named 'hotpot'" in capsys.readouterr().err
    assert (
        main(
            ["eval", "--dataset", "hotpot", "--limit", "1", "--method", "env-only", "--out", str(out), *flags]
        )
        == 0
    )
    # A later run in the same folder with a file of the same name is loaded from another file: the folder's
    # settings check refuses it before anything is sent.
    capsys.readouterr()
    sent = len(eval_server.requests)
    again = ["eval", "--dataset", str(mine), "--method", "env-only", "--out", str(out), *flags]
    assert main(again) == 2
    assert "holds rows made with other settings (dataset hotpot" in capsys.readouterr().err
    assert len(eval_server.requests) == sent
    # Mixed on purpose, it holds other questions under the same ids: the finished row is kept, not rerun and not
    # scored (batch's rule), and named.
    assert main([*again, "--allow-changed-settings"]) == 1
    err = capsys.readouterr().err
    assert (
        "row env-only/hotpot/hotpot-0 was finished in" in err
        and "for another question: kept, not rerun" in err
    )
    assert "1 rows finished earlier for another question, kept and not scored" in err
    assert len(eval_server.requests) == sent
    assert [r["question"] for r in read_predictions(out / "predictions.jsonl")] != ["Mine?"]


def test_a_folder_written_before_a_loop_setting_existed_resumes(tmp_path):
    from prompt_r1.core.config import LoopConfig
    from prompt_r1.evaluation.harness import record_settings

    record_settings(tmp_path, ["prompt-r1"], loop=LoopConfig())
    manifest = tmp_path / "run.json"
    recorded = json.loads(manifest.read_text())
    del recorded["methods"]["prompt-r1"]["loop"]["max_turn_tokens"]  # as written before the field existed
    manifest.write_text(json.dumps(recorded))
    record_settings(tmp_path, ["prompt-r1"], loop=LoopConfig())  # unset: nothing the rows depend on changed
    with pytest.raises(ConfigError, match=r"loop.max_turn_tokens: None → 64"):
        record_settings(tmp_path, ["prompt-r1"], loop=LoopConfig(max_turn_tokens=64))
