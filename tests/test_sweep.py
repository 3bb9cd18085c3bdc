"""`prompt-r1 eval` over several environments (prompt_r1.evaluation.sweep): one folder per environment and the paper's
Figure 4/5 report, against two scripted HTTP environments that answer differently."""

from __future__ import annotations

import csv

import pytest
from test_eval import agent, answer_for, question_in

from prompt_r1.cli.main import main
from prompt_r1.core.config import EnvironmentConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.evaluation.sweep import environment_sweep
from prompt_r1.testing.servers import ScriptedServer


def environment(right: bool):
    """An environment that gives the agent's explained prompt help, and answers a bare question right on even
    rows (`right`) or never."""

    def respond(body: dict) -> str:
        last = body["messages"][-1]["content"]
        if "<think>" in last or "Explain" in last:
            return "some help"
        question = question_in(last)
        return f"<answer>{answer_for(question) if right else 'no idea'}</answer>"

    return respond


def test_the_same_methods_run_against_each_environment_and_the_report_sets_them_side_by_side(
    tmp_path, capsys
):
    with (
        ScriptedServer({"big": environment(True), "agent": agent}) as first,
        ScriptedServer({"small": environment(False)}) as second,
    ):
        out = tmp_path / "sweep"
        args = ["eval", "--dataset", "hotpot", "--method", "prompt-r1", "--method", "env-only", "--limit", "3",
                "--out", str(out), "--no-progress", "--agent-model", "agent", "--agent-base-url", first.base_url,
                "--env-model", "big", "--env-base-url", first.base_url,
                "--env-model", "small", "--env-base-url", second.base_url]  # fmt: skip
        assert main(args) == 0
        assert len(second.requests_for("small")) == 6  # 3 episodes' prompts and 3 bare questions each
        assert len(first.requests_for("big")) == 6
    for name in ("big", "small"):
        assert (out / name / "predictions.jsonl").exists() and (out / name / "summary.csv").exists()
    with (out / "sweep.csv").open() as handle:
        rows = {(r["environment"], r["method"]): r for r in csv.DictReader(handle)}
    assert float(rows[("big", "env-only")]["em"]) == pytest.approx(2 / 3)
    assert float(rows[("small", "env-only")]["em"]) == 0.0
    # The agent answers from the question either way (the scripted agent knows the rows): 2 of 3 everywhere.
    assert float(rows[("small", "prompt-r1")]["em"]) == pytest.approx(2 / 3)
    table = (out / "sweep.md").read_text()
    assert table.startswith("| Environment | HotpotQA EM w/ agent | HotpotQA EM w/o |")
    assert "| big | 66.67 | 66.67 |" in table and "| small | 66.67 | 0.00 |" in table
    assert table in capsys.readouterr().out
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_environment_takes_its_own_endpoint_and_one_given_once_applies_to_all():
    base = EnvironmentConfig(model="a", base_url="http://127.0.0.1:1/v1", api_key_env="K")
    sweep = environment_sweep(base, {"model": ["a", "b/c"], "base_url": ["http://x/v1"]})
    assert [name for name, _ in sweep] == ["a", "b-c"]
    assert {cfg.base_url for _, cfg in sweep} == {"http://x/v1"} and sweep[1][1].model == "b/c"
    assert environment_sweep(base, {})[0][1] == base
    # The same model at two endpoints: each folder is named by its endpoint, whatever the order they come in.
    twice = dict(environment_sweep(base, {"model": ["a", "a"], "base_url": ["http://x/v1", "http://y/v1"]}))
    swapped = dict(environment_sweep(base, {"model": ["a", "a"], "base_url": ["http://y/v1", "http://x/v1"]}))
    assert twice == swapped and len(twice) == 2 and all(name.startswith("a-") for name in twice)
    with pytest.raises(ConfigError, match="listed twice"):
        environment_sweep(base, {"model": ["a", "a"], "base_url": ["http://x/v1"]})
    with pytest.raises(ConfigError, match="2 --env-model given but 3 --env-base-url"):
        environment_sweep(base, {"model": ["a", "b"], "base_url": ["u1", "u2", "u3"]})
