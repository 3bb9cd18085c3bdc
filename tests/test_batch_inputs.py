"""`prompt-r1 batch` and `run_batch` against real HTTP servers on 127.0.0.1: the API key in no output, log or
checkpoint (even when a server echoes it), the input file (duplicate ids, bad rows, parquet), prices, budgets and
environment pools. Faults, rate limits, kills and resumes: tests/test_batch.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from batch_setup import (
    FAULTS,
    SECRET,
    cli_args,
    env_config,
    served_agent,
)
from helpers import ROOT, rows_of, write_questions

from prompt_r1.cli.main import main
from prompt_r1.clients.costs import PriceTable
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.clients.environment_pool import EnvironmentPool
from prompt_r1.core.errors import ConfigError
from prompt_r1.runs.batch import BatchSettings, run_batch
from prompt_r1.testing.servers import Fault, ScriptedServer, echo_environment, relay_agent

pytestmark = pytest.mark.usefixtures("batch_key")  # every run here reads its key (conftest)


# ---- the key ------------------------------------------------------------------------------------------------


def test_api_key_is_in_no_output_log_or_checkpoint_even_with_faults(tmp_path, capsys):
    inp = write_questions(tmp_path / "q.jsonl", 40)
    out = tmp_path / "r.jsonl"
    server = ScriptedServer(
        {"env": echo_environment(), "agent": relay_agent()},
        fault_rates={**FAULTS, "400": 0.03},
        fault_models=["env"],
        fault_delay=1.0,
    )
    with server:
        main(
            cli_args(
                server.base_url,
                inp,
                out,
                "--env-timeout",
                "0.5",
                "--checkpoint",
                str(tmp_path / "c.sqlite"),
                "--log-file",
                str(tmp_path / "debug.log"),
            )
        )
        assert all(r.headers.get("Authorization") == f"Bearer {SECRET}" for r in server.requests[:5])
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    for path in (out, tmp_path / "r.summary.json", tmp_path / "debug.log", tmp_path / "c.sqlite"):
        assert SECRET.encode() not in path.read_bytes(), path


class EchoingServer(ScriptedServer):
    """A server (or a careless proxy before it) whose error bodies repeat the request's Authorization header:
    fault kinds "echo-401" and "echo-400"."""

    async def _reply(self, request, body, model, route, fault):
        if fault is not None and fault.kind.startswith("echo-"):
            from aiohttp import web

            message = f"invalid request with Authorization: {request.headers.get('Authorization')}"
            error = {"message": message, "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=int(fault.kind.removeprefix("echo-")))
        return await super()._reply(request, body, model, route, fault)


def test_a_key_echoed_in_error_bodies_is_redacted_everywhere(tmp_path, capsys):
    inp = write_questions(tmp_path / "q.jsonl", 12)
    out, checkpoint = tmp_path / "r.jsonl", tmp_path / "c.sqlite"

    def echo_for_some(model: str, body: dict) -> Fault | None:
        question = body["messages"][-1]["content"] if model == "env" else body["messages"][0]["content"]
        if model == "env" and ("item 1?" in question or "item 2?" in question):
            return Fault("echo-401")
        if model == "agent" and "item 3?" in question:  # a served agent's 400 (AgentError)
            return Fault("echo-400")
        return None

    with EchoingServer(
        {"env": echo_environment(), "agent": relay_agent()}, fault_rule=echo_for_some
    ) as server:
        code = main(
            cli_args(server.base_url, inp, out, "--checkpoint", str(checkpoint), "--max-failures", "3")
        )
        assert server.requests[0].headers["Authorization"] == f"Bearer {SECRET}"
    assert code == 1
    captured = capsys.readouterr()
    rows = {r["id"]: r for r in rows_of(out)}
    # The servers did echo the key, and what they said is kept, with the key cut out.
    assert {rows[i]["status"] for i in ("q1", "q2")} == {"environment_error"}
    assert "(401)" in rows["q1"]["error"] and "Authorization: Bearer ***" in rows["q1"]["error"]
    assert rows["q3"]["status"] == "agent_error" and "Authorization: Bearer ***" in rows["q3"]["error"]
    summary = (tmp_path / "r.summary.json").read_text()
    assert "3 failed episodes reached --max-failures 3" in summary
    assert SECRET not in captured.out + captured.err
    for path in (out, tmp_path / "r.summary.json", checkpoint):
        assert SECRET.encode() not in path.read_bytes(), path


# ---- the input ----------------------------------------------------------------------------------------------


def test_duplicate_ids_are_reported_not_merged(tmp_path, capsys):
    inp = tmp_path / "q.jsonl"
    rows = [
        {"id": "a", "question": "First?"},
        {"id": "b", "question": "Second?"},
        {"id": "a", "question": "First?"},
    ]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        assert main(cli_args(server.base_url, inp, tmp_path / "r.jsonl")) == 0
    err = capsys.readouterr().err
    assert "duplicate id 'a' at input row 2: not run again" in err and "1 duplicate ids" in err
    assert [r["question"] for r in rows_of(tmp_path / "r.jsonl") if r["id"] == "a"] == ["First?"]


def test_an_id_repeated_for_another_question_stops_before_anything_runs(tmp_path, capsys):
    inp = tmp_path / "q.jsonl"
    rows = [
        {"id": "a", "question": "First?"},
        {"id": "b", "question": "Second?"},
        {"id": "a", "question": "Other?"},
    ]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        assert main(cli_args(server.base_url, inp, tmp_path / "r.jsonl")) == 2
        assert not server.requests
    err = capsys.readouterr().err
    assert err.strip() == (
        "prompt-r1: error: input row 2: id 'a' repeats row 0 with another question; give each question its own id"
    )
    assert not (tmp_path / "r.jsonl").exists()


def test_an_id_finished_for_another_question_is_reported_not_rerun(tmp_path, capsys):
    inp = tmp_path / "q.jsonl"
    inp.write_text(json.dumps({"id": "a", "question": "First?"}) + "\n")
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        assert main(cli_args(server.base_url, inp, tmp_path / "r.jsonl")) == 0
        inp.write_text(json.dumps({"id": "a", "question": "Changed?"}) + "\n")
        capsys.readouterr()
        assert main(cli_args(server.base_url, inp, tmp_path / "r.jsonl")) == 1
    err = capsys.readouterr().err
    assert "id 'a' was finished in" in err and "for another question" in err
    assert [r["question"] for r in rows_of(tmp_path / "r.jsonl")] == ["First?"]


def test_a_bad_input_row_stops_the_run_before_anything_runs(tmp_path, capsys):
    inp = write_questions(tmp_path / "q.jsonl", 5)
    with inp.open("a") as handle:
        handle.write('{"id": "bad", "question": ""}\n')
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        code = main(cli_args(server.base_url, inp, tmp_path / "r.jsonl", "--concurrency", "2"))
        assert not server.requests
    assert code == 2
    assert "row 5: its question is empty" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


def test_parquet_input_and_bundled_sets_stream(tmp_path):
    pytest.importorskip("pyarrow")
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        assert main(cli_args(server.base_url, "hotpot", tmp_path / "r.jsonl", "--limit", "7")) == 0
    rows = rows_of(tmp_path / "r.jsonl")
    assert len(rows) == 7 and all(r["golden_answers"] and "metrics" in r for r in rows)
    assert {r["id"] for r in rows} == {f"hotpot-{i}" for i in range(7)}


# ---- cost, budget, pools ------------------------------------------------------------------------------------


def test_price_table_and_budget(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("env: {input: 1000, output: 2000}\nagent: {input: 0, output: 0}\n")
    table = PriceTable.load(prices)
    assert table.cost("env", 1000, 500) == pytest.approx(2.0)
    assert table.price("gpt-4o-mini-2024-07-18") == table.price("gpt-4o-mini")  # bundled, by prefix
    assert table.price("gpt-4o-mini-x") is not None and table.price("unknown-model") is None
    inp = write_questions(tmp_path / "q.jsonl", 100)
    out = tmp_path / "r.jsonl"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        code = main(
            cli_args(
                server.base_url, inp, out, "--prices", str(prices), "--budget", "1.0", "--concurrency", "2"
            )
        )
        assert code == 1
        summary = json.loads((tmp_path / "r.summary.json").read_text())
        assert summary["stopped"].startswith("budget of $1 reached")
        assert 1.0 <= summary["usage"]["cost_usd"] < 1.5  # stopped starting episodes once past the budget
        assert summary["written"] < 100
        spent = sum(r["cost_usd"] for r in rows_of(out))
        assert spent == pytest.approx(summary["usage"]["cost_usd"], rel=1e-6)
        assert main(cli_args(server.base_url, inp, out, "--prices", str(prices))) == 0
    assert len(rows_of(out)) == 100


def test_a_budget_with_an_unpriced_model_is_refused_at_start(tmp_path, capsys):
    """Spending on a model without a price would count as $0 and the budget would never stop the run."""
    inp = write_questions(tmp_path / "q.jsonl", 5)
    out = tmp_path / "r.jsonl"
    prices = tmp_path / "prices.yaml"
    responders = {"env": echo_environment(), "agent": relay_agent()}
    with ScriptedServer(responders) as server, ScriptedServer(responders) as other:
        # Neither model priced: both named, and the file to edit is the one given with --prices.
        prices.write_text("gpt-4o-mini: {input: 1, output: 1}\n")
        assert main(cli_args(server.base_url, inp, out, "--budget", "1", "--prices", str(prices))) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("prompt-r1: error: a budget needs a price"), err
        assert "environment model 'env'" in err and "agent model 'agent'" in err
        assert f"add it to {prices} (--prices)" in err
        # The served agent's model priced, the environment's not: only the environment's named.
        prices.write_text("agent: {input: 0, output: 0}\n")
        assert main(cli_args(server.base_url, inp, out, "--budget", "1", "--prices", str(prices))) == 2
        err = capsys.readouterr().err
        assert "environment model 'env'" in err and "agent model" not in err
        # Without --prices: how to pass a price file.
        assert main(cli_args(server.base_url, inp, out, "--budget", "1")) == 2
        assert "pass it with --prices FILE" in capsys.readouterr().err
        pool_prices = tmp_path / "pool-prices.yaml"
        pool_prices.write_text("agent: {input: 0, output: 0}\nenv: {input: 1, output: 1}\n")
        # A pool member whose model has no price is named too.
        pool = tmp_path / "pool.yaml"
        pool.write_text(
            "environments:\n"
            f"  - {{name: priced, base_url: '{server.base_url}'}}\n"
            f"  - {{name: free-ride, model: large, base_url: '{other.base_url}'}}\n"
        )
        args = ["--budget", "1", "--prices", str(pool_prices), "--env-pool", str(pool)]
        assert main(cli_args(server.base_url, inp, out, *args)) == 2
        err = capsys.readouterr().err
        assert "environment model 'large' (pool member free-ride)" in err and "'env' " not in err
        assert server.counts == {} and other.counts == {} and not out.exists()  # refused before any call


def test_bad_price_table_and_pool_files_are_one_line(tmp_path, capsys):
    bad = tmp_path / "p.yaml"
    bad.write_text("env: {input: cheap}\n")
    with pytest.raises(ConfigError, match="the input price .* must be a finite number ≥ 0, got .cheap."):
        PriceTable.load(bad)
    pool = tmp_path / "pool.yaml"
    pool.write_text("environments:\n  - {model: a, wieght: 2}\n")
    with pytest.raises(ConfigError, match="unknown field.*wieght"):
        EnvironmentPool.from_file(pool)
    assert main(["batch", "hotpot", "--out", str(tmp_path / "r.jsonl"), "--env-pool", str(pool)]) == 2


def test_pool_routes_sessions_by_weight_and_falls_back(tmp_path):
    inp = write_questions(tmp_path / "q.jsonl", 200)
    responders = {"env": echo_environment(), "agent": relay_agent()}
    with ScriptedServer(responders) as a, ScriptedServer(responders) as b:
        pool_file = tmp_path / "pool.yaml"
        pool_file.write_text(
            "environments:\n"
            f"  - {{name: big, base_url: '{a.base_url}', weight: 3}}\n"
            f"  - {{name: small, base_url: '{b.base_url}', weight: 1}}\n"
        )
        code = main(cli_args(a.base_url, inp, tmp_path / "r.jsonl", "--env-pool", str(pool_file)))
        assert code == 0
        rows = rows_of(tmp_path / "r.jsonl")
        endpoints = [
            {t["environment_call"]["endpoint"] for t in r["turns"] if t.get("environment_call")} for r in rows
        ]
        assert all(len(e) == 1 for e in endpoints)  # every turn of an episode on one endpoint
        share = sum(e == {"big"} for e in endpoints) / len(rows)
        assert 0.65 <= share <= 0.85
    # Fallback: one member always fails; every episode still finishes, and the failing member is skipped after
    # it trips instead of being asked by every episode.
    with (
        ScriptedServer(responders, fault_rates={"500": 1.0}, fault_models=["env"]) as bad,
        ScriptedServer(responders) as good,
    ):
        members = [
            EnvironmentClient(env_config(bad, max_retries=1)),
            EnvironmentClient(env_config(good)),
        ]
        pool = EnvironmentPool(members, [1, 1], names=["bad", "good"], trip_after=2, cooldown=60)
        summary = asyncio.run(
            run_batch(
                BatchSettings(
                    write_questions(tmp_path / "f.q.jsonl", 60),
                    tmp_path / "f.jsonl",
                    concurrency=4,
                    progress=False,
                ),
                agent=served_agent(good),
                environment=pool,
            )
        )
        assert summary.complete and summary.fallbacks > 0
        assert len(bad.requests_for("env")) <= 2 * (2 + 4)  # trip_after, plus the calls already in flight
    assert all(r["status"] == "answered" for r in rows_of(tmp_path / "f.jsonl"))


def test_the_docs_name_every_batch_flag():
    """Every flag `prompt-r1 batch` takes is on the docs' batch page (its own) or in the `run` page's flag table."""
    import argparse

    from prompt_r1.cli.main import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    section = (ROOT / "docs" / "batch.md").read_text(encoding="utf-8")
    run_page = (ROOT / "docs" / "run.md").read_text(encoding="utf-8")
    run_table = run_page[
        run_page.index("| flag | meaning (default) |") : run_page.index("Exit codes: 0 the episode ran")
    ]
    missing = []
    for action in commands.choices["batch"]._actions:
        for flag in action.option_strings:
            positive = flag.replace("--no-", "--")
            named = f"`{flag}" in section or f"`{flag}`" in run_table or f"`{flag} " in run_table
            if flag != "-h" and flag != "--help" and not named and f"--[no-]{positive[2:]}" not in run_table:
                missing.append(flag)
    assert not missing, missing
