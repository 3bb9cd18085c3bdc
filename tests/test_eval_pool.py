"""`prompt-r1 eval` on the shared worker pool: one row that raises fails alone, Ctrl-C stops cleanly and the rerun
does every row exactly once, --max-failures and --budget stop a run; against scripted HTTP servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prompt_r1.agents.served import ServedAgent
from prompt_r1.cli.main import main
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.core.config import AgentConfig, EnvironmentConfig
from prompt_r1.data.datasets import load_samples
from prompt_r1.evaluation.harness import read_predictions, run_evaluation
from prompt_r1.testing.servers import Fault, ScriptedServer

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-eval-pool-test-8d1f0a"


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("EVAL_POOL_KEY", KEY)


def write_set(path: Path, n: int) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(n):
            handle.write(
                json.dumps({"question": f"What is item {i}?", "golden_answers": [f"item {i}"]}) + "\n"
            )
    return path


def environment(body: dict) -> str:
    last = body["messages"][-1]["content"]
    item = last.split("What is ", 1)[1].split("?", 1)[0] if "What is " in last else "nothing"
    return f"It is {item}<answer>{item}</answer>"


def agent(body: dict) -> str:
    """Asks the environment the question, then answers with the item the reply names."""
    first = body["messages"][0]["content"]
    if sum(m["role"] == "assistant" for m in body["messages"]) == 0 and "First, provide" in first:
        question = first.split("Question: ", 1)[1].split("\n", 1)[0]
        return f"<think>ask</think><interaction_prompt>{question}</interaction_prompt>"
    reply = body["messages"][-1]["content"]
    found = re.search(r"It is (item \d+)", reply)
    answer = found.group(1) if found else "unknown"
    return f"<think>done</think><answer>{answer}</answer>"


class BrokenAgent(ServedAgent):
    """A served agent that raises what no layer expects (not an AgentError) for one question."""

    def __init__(self, config: AgentConfig, broken: str) -> None:
        super().__init__(config)
        self.broken = broken

    async def generate(self, request):
        if any(self.broken in str(m["content"]) for m in request.messages):
            raise RuntimeError("unexpected failure inside the agent")
        return await super().generate(request)


def flags(server: ScriptedServer) -> list[str]:
    return ["--env-model", "env", "--env-base-url", server.base_url, "--env-api-key-env", "EVAL_POOL_KEY",
            "--agent-model", "agent", "--agent-base-url", server.base_url, "--agent-api-key-env", "EVAL_POOL_KEY",
            "--no-progress", "--no-chart"]  # fmt: skip


def test_an_unexpected_exception_fails_its_row_only_and_a_rerun_retries_it(tmp_path):
    samples = load_samples(str(write_set(tmp_path / "items.jsonl", 6)))
    out = tmp_path / "run"
    with ScriptedServer({"env": environment, "agent": agent}) as server:
        env = EnvironmentClient(
            EnvironmentConfig(model="env", base_url=server.base_url, api_key_env="EVAL_POOL_KEY")
        )
        config = AgentConfig(model="agent", base_url=server.base_url, api_key_env="EVAL_POOL_KEY")

        def go(the_agent):
            return asyncio.run(
                run_evaluation(
                    out,
                    ["prompt-r1", "agent-only"],
                    samples,
                    agent=the_agent,
                    environment=env,
                    agent_config=config,
                    concurrency=3,
                    progress=False,
                )  # fmt: skip
            )

        first = go(BrokenAgent(config, "item 2?"))
        assert first.written == 12 and first.failed == 2 and first.stopped is None
        rows = read_predictions(out / "predictions.jsonl")
        broken = sorted((r["method"], r["id"]) for r in rows if r["status"] == "internal_error")
        assert broken == [("agent-only", "items-2"), ("prompt-r1", "items-2")]
        assert all(
            r["error"].startswith("RuntimeError: unexpected failure inside the agent (at ")
            for r in rows
            if r["status"] == "internal_error"
        )
        assert all(
            r["prediction"] == f"item {r['index']}"
            for r in rows
            if r["method"] == "prompt-r1" and r["index"] != 2
        )
        second = go(ServedAgent(config))  # the rerun retries the two failed rows only
    assert (second.written, second.skipped, second.failed) == (2, 10, 0)
    rows = read_predictions(out / "predictions.jsonl")
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 12  # superseded rows compacted away
    assert sorted(r["prediction"] for r in rows if r["method"] == "prompt-r1") == [
        f"item {i}" for i in range(6)
    ]


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_ctrl_c_stops_eval_cleanly_and_the_rerun_does_every_row_once(tmp_path):
    n = 80
    data = write_set(tmp_path / "items.jsonl", n)
    out = tmp_path / "run"
    predictions = out / "predictions.jsonl"
    with ScriptedServer({"env": environment, "agent": agent}, latency={"env": 0.05}) as server:
        args = ["eval", "--dataset", str(data), "--method", "prompt-r1", "--method", "env-only", "--out", str(out),
                "--concurrency", "8", *flags(server)]  # fmt: skip
        log = (tmp_path / "run1.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "prompt_r1", *args],
            cwd=ROOT,
            env={**os.environ, "EVAL_POOL_KEY": KEY, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while line_count(predictions) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
        printed = (tmp_path / "run1.log").read_text()
        assert "Traceback" not in printed and "interrupted (SIGINT)" in printed, printed[-2000:]
        first = len(read_predictions(predictions))
        assert 20 <= first == line_count(predictions) < 2 * n  # whole rows only, and not all of them
        assert (out / "table.md").exists()  # the reports of what finished
        assert main(args) == 0
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    keys = [(r["method"], r["id"]) for r in rows]
    assert sorted(keys) == sorted((m, f"items-{i}") for m in ("prompt-r1", "env-only") for i in range(n))
    assert all(r["prediction"] == f"item {r['index']}" for r in rows)
    assert KEY not in printed and KEY not in predictions.read_text()


def test_max_failures_and_budget_stop_an_eval(tmp_path, capsys):
    data = write_set(tmp_path / "items.jsonl", 40)

    def common(server):
        return ["eval", "--dataset", str(data), "--method", "env-only", "--concurrency", "2", *flags(server),
                "--env-max-retries", "0"]  # fmt: skip

    with ScriptedServer({"env": environment}) as server:
        server.inject(*[Fault("400")] * 40, model="env")
        assert main([*common(server), "--out", str(tmp_path / "failing"), "--max-failures", "3"]) == 1
    err = capsys.readouterr().err
    assert "failed episodes reached --max-failures 3" in err
    assert 3 <= len(read_predictions(tmp_path / "failing" / "predictions.jsonl")) < 40

    prices = tmp_path / "prices.yaml"
    prices.write_text("env: {input: 500, output: 500}\n")  # about $0.03 a call: $0.05 lasts two
    with ScriptedServer({"env": environment}) as server:
        budget = [
            *common(server),
            "--out",
            str(tmp_path / "budget"),
            "--budget",
            "0.05",
            "--prices",
            str(prices),
        ]
        assert main(budget) == 1
        err = capsys.readouterr().err
        assert "budget of $0.05 reached" in err
        assert 2 <= len(read_predictions(tmp_path / "budget" / "predictions.jsonl")) < 10
        assert main([*common(server), "--out", str(tmp_path / "unpriced"), "--budget", "1"]) == 2
        assert "a budget needs a price for every model" in capsys.readouterr().err
