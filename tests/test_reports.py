"""An evaluation's reports (prompt_r1.evaluation.reports, prompt_r1.evaluation.charts): cost beside accuracy, on scripted servers with
prices given to the scripted models."""

from __future__ import annotations

import csv
import json

import pytest
from test_eval import endpoint_flags, eval_server  # noqa: F401  (the fixture)

from prompt_r1.cli.main import main
from prompt_r1.evaluation.harness import read_predictions

# $ per 1M tokens: round numbers, so each row's cost is checked by hand below.
PRICES = {"env": {"input": 1.0, "output": 2.0}, "agent": {"input": 0.5, "output": 4.0}}


def test_every_method_reports_its_tokens_and_dollars_beside_its_scores(eval_server, tmp_path, capsys):  # noqa: F811
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICES))
    out = tmp_path / "run"
    methods = ["--method", "prompt-r1", "--method", "env-only", "--method", "agent-only"]
    args = [
        "eval",
        "--dataset",
        "hotpot",
        *methods,
        "--limit",
        "3",
        "--out",
        str(out),
        "--prices",
        str(prices),
    ]
    assert main([*args, *endpoint_flags(eval_server)]) == 0

    rows = read_predictions(out / "predictions.jsonl")
    for row in rows:  # each row's cost, by hand from its own usage
        usage = row["usage"]
        env = usage.get("env_input_tokens", 0) * 1.0 + usage.get("env_output_tokens", 0) * 2.0
        agent = usage.get("agent_prompt_tokens", 0) * 0.5 + usage.get("agent_completion_tokens", 0) * 4.0
        assert row["cost_usd"] == pytest.approx((env + agent) / 1e6), row["method"]
    with (out / "summary.csv").open() as handle:
        table = {r["method"]: r for r in csv.DictReader(handle)}
    for method in ("prompt-r1", "env-only", "agent-only"):
        mine = [r for r in rows if r["method"] == method]
        total = sum(r["cost_usd"] for r in mine)
        assert float(table[method]["cost_usd"]) == pytest.approx(total)
        assert float(table[method]["usd_per_row"]) == pytest.approx(total / 3)
        assert int(table[method]["env_calls"]) == sum(r["usage"].get("env_calls", 0) for r in mine)
    assert int(table["agent-only"]["env_calls"]) == 0 and int(table["env-only"]["env_calls"]) == 3
    assert int(table["prompt-r1"]["env_calls"]) == 3  # one environment call per episode here
    markdown = (out / "table.md").read_text()
    assert "| Method | HotpotQA $/row | Env calls/row | Total $ |" in markdown
    assert (out / "cost.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unpriced_model_leaves_the_cost_blank_not_zero(eval_server, tmp_path):  # noqa: F811
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"agent": PRICES["agent"]}))  # the environment's model has no price
    out = tmp_path / "run"
    args = ["eval", "--dataset", "hotpot", "--method", "env-only", "--limit", "2", "--out", str(out),
            "--prices", str(prices), "--no-chart"]  # fmt: skip
    assert main([*args, *endpoint_flags(eval_server)]) == 0
    assert all(r["cost_usd"] is None for r in read_predictions(out / "predictions.jsonl"))
    with (out / "summary.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["cost_usd"] == "" and row["usd_per_row"] == "" and row["env_calls"] == "2"
    assert "| Env only (w/o agent) | – | 1.00 | unpriced |" in (out / "table.md").read_text()


def test_a_metric_added_to_the_registry_reaches_every_report_and_both_scorers(tmp_path, monkeypatch, capsys):
    """The registry is the one list: a new `Metric` (here, the prediction's length against the golden answer's) is
    taken by `score --metric`, written to summary.csv and table.md under its label, scored by the release's rules
    as well as the paper's, and stored with each row when it is cheap; no other file names it."""
    from prompt_r1.scoring.metrics import METRICS, Metric
    from prompt_r1.scoring.scorers import release_scores, row_metrics

    def length_ratio(predictions, golden_answers):
        return [
            min(1.0, len(p) / max(1, len(g[0]))) for p, g in zip(predictions, golden_answers, strict=True)
        ]

    monkeypatch.setitem(METRICS, "len", Metric("len", "Len", length_ratio, per_row=True))
    rows = [
        {"id": "a", "dataset": "mine", "method": "m", "prediction": "Pa", "golden_answers": ["Paris"]},
        {"id": "b", "dataset": "mine", "method": "m", "prediction": "Rome", "golden_answers": ["Rome"]},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")

    for scorer in ("paper", "release"):
        assert (
            main(["score", str(path), "--metric", "len", "--metric", "em", "--scorer", scorer, "--no-chart"])
            == 0
        )
        tail = "" if scorer == "paper" else ".release"
        with (tmp_path / f"mine.summary{tail}.csv").open(encoding="utf-8") as handle:
            (written,) = list(csv.DictReader(handle))
        assert float(written["len"]) == pytest.approx((0.4 + 1.0) / 2) and float(written["em"]) == 0.5
        assert "mine Len" in (tmp_path / f"mine.table{tail}.md").read_text(encoding="utf-8")
    assert release_scores("len", ["Pa"], [["Paris"]]) == [pytest.approx(0.4)]
    assert row_metrics("Pa", ["Paris"])["len"] == pytest.approx(0.4)

    monkeypatch.delitem(METRICS, "len")  # gone from the registry, gone from the command line
    assert main(["score", str(path), "--metric", "len"]) == 2
    assert "invalid choice: 'len'" in capsys.readouterr().err
