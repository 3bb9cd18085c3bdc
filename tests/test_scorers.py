"""The two scorers (prompt_r1.scoring.scorers): the release's rules on hand-computed rows, its reading of an episode's
answer, and `eval`/`score --scorer release` writing reports that name their scorer."""

from __future__ import annotations

import csv
import json

import pytest
from test_eval import endpoint_flags, eval_server  # noqa: F401  (the fixture)

from prompt_r1.cli.main import main
from prompt_r1.core.errors import ConfigError
from prompt_r1.scoring.scorers import CONTEXT_EXCEEDED, MAX_TURNS_REACHED, release_prediction, release_rows

# (prediction, golden answers) → what the release's eval_scores.py gives, worked out by hand:
ROWS = [
    ("", ["Paris"]),  # empty: EM 0, SM 1 (it is inside every text), F1 0; the paper's scorer gives 0, 0, 0
    ("Paris", ["Paris, France"]),  # inside the gold: SM 1 two-way, 0 one-way; F1 2·(1·½)/(1+½) = ⅔
    ("The Eiffel Tower", ["eiffel tower"]),  # equal once normalised: 1, 1, 1 under both
    ("London", ["Paris", "Rome"]),  # 0, 0, 0 under both
]
RELEASE = {"em": 1 / 4, "sm": 3 / 4, "f1": (0 + 2 / 3 + 1 + 0) / 4}
PAPER = {"em": 1 / 4, "sm": 1 / 4, "f1": (0 + 2 / 3 + 1 + 0) / 4}


def _write(path, rows):
    path.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "prediction": p, "golden_answers": g}) + "\n"
            for i, (p, g) in enumerate(rows)
        )
    )
    return path


def _summary(path) -> dict[str, str]:
    with path.open() as handle:
        (row,) = list(csv.DictReader(handle))
    return row


@pytest.mark.parametrize(("scorer", "expected", "name"), [("release", RELEASE, "preds.summary.release.csv"),
                                                        ("paper", PAPER, "preds.summary.csv")])  # fmt: skip
def test_score_reproduces_each_scorer_on_hand_computed_rows(tmp_path, capsys, scorer, expected, name):
    path = _write(tmp_path / "preds.jsonl", ROWS)
    flags = ["--metric", "em", "--metric", "sm", "--metric", "f1", "--no-chart"]
    assert main(["score", str(path), *flags, "--scorer", scorer]) == 0
    row = _summary(tmp_path / name)
    assert row["scorer"] == scorer
    for metric, value in expected.items():
        assert float(row[metric]) == pytest.approx(value), metric
    table = (tmp_path / name.replace("summary", "table").replace(".csv", ".md")).read_text()
    assert f"scorer `{scorer}`" in table and table in capsys.readouterr().out


def test_the_release_scores_an_empty_prediction_ssim_one(tmp_path):
    path = _write(tmp_path / "preds.jsonl", [("", ["Paris"]), ("  ", ["Rome"])])
    assert main(["score", str(path), "--metric", "ssim", "--no-chart", "--scorer", "release"]) == 0
    assert float(_summary(tmp_path / "preds.summary.release.csv")["ssim"]) == 1.0
    assert main(["score", str(path), "--metric", "ssim", "--no-chart"]) == 0
    assert float(_summary(tmp_path / "preds.summary.csv")["ssim"]) == 0.0


def test_the_release_reads_an_episodes_answer_from_its_last_turn():
    answered = {"kind": "answer", "text": "<think>t</think><answer> Paris </answer><answer>Rome</answer>"}
    prompting = {"kind": "prompt", "text": "<think>t</think><interaction_prompt>p</interaction_prompt>"}
    malformed = {"kind": "malformed", "text": "<think>t</think>no tags"}
    assert release_prediction({"status": "answered", "turns": [prompting, answered]}) == "Paris"  # the first
    assert release_prediction({"status": "max_turns", "turns": [prompting, prompting]}) == MAX_TURNS_REACHED
    assert release_prediction({"status": "context_overflow", "turns": [prompting]}) == CONTEXT_EXCEEDED
    assert (
        release_prediction({"status": "context_overflow", "turns": []}) == CONTEXT_EXCEEDED
    )  # the first turn
    asked_again = {**answered, "after_final_request": True}  # the release never asks once more
    assert release_prediction({"status": "answered", "turns": [prompting, asked_again]}) == MAX_TURNS_REACHED
    assert release_prediction({"status": "format_error", "turns": [malformed]}) == ""
    # A baseline's row, or a `score` file's, has no turns: its prediction stands as it is.
    assert release_prediction({"prediction": "42", "status": "answered"}) == "42"
    assert release_rows([{"prediction": None}]) == [{"prediction": ""}]


def test_an_unknown_scorer_is_refused():
    from prompt_r1.evaluation.reports import summarize

    with pytest.raises(ConfigError, match="unknown scorer 'paper2'; choose from paper, release"):
        summarize([], scoring="paper2")


def test_eval_with_the_release_scorer_writes_its_own_reports_beside_the_papers(eval_server, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    args = ["eval", "--dataset", "hotpot", "--method", "prompt-r1", "--method", "env-only", "--limit", "3",
            "--out", str(out), "--no-chart", *endpoint_flags(eval_server)]  # fmt: skip
    assert main(args) == 0
    sent = len(eval_server.requests)
    assert main([*args, "--scorer", "release"]) == 0
    assert len(eval_server.requests) == sent  # the same rows, scored again: nothing is run
    with (out / "summary.csv").open() as handle:
        paper = {r["method"]: r for r in csv.DictReader(handle)}
    with (out / "summary.release.csv").open() as handle:
        release = {r["method"]: r for r in csv.DictReader(handle)}
    assert {r["scorer"] for r in paper.values()} == {"paper"} and {r["scorer"] for r in release.values()} == {
        "release"
    }
    # Two of three rows right, one "zzz qqq": EM and F1 agree under both scorers on these answers.
    for method in ("prompt-r1", "env-only"):
        assert float(release[method]["em"]) == pytest.approx(2 / 3) == float(paper[method]["em"])
    assert "scorer `release`" in (out / "table.release.md").read_text()
    assert "scorer `paper`" in (out / "table.md").read_text()


def test_the_release_counts_a_negative_similarity_as_zero():
    from prompt_r1.scoring.scorers import release_scores

    class Opposite:
        def similarity_batch(self, predictions, golds, *, empty_score=None):
            return [-1.0 for _ in predictions]

    assert release_scores("ssim", ["up"], [["down"]], Opposite()) == [0.0]
