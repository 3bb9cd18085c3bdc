"""configs_from_env (PROMPT_R1_* variables) and the LangGraph app factory in graphs/app.py that uses it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import ANSWER, PROMPT
from helpers import load_script

from prompt_r1.core.config import configs_from_env
from prompt_r1.core.errors import ConfigError
from prompt_r1.testing.servers import ScriptedServer, echo_environment, scripted_agent

APP = Path(__file__).resolve().parents[1] / "graphs" / "app.py"


def test_configs_from_env_reads_every_field_with_its_type():
    agent, env, loop = configs_from_env(
        {
            "PROMPT_R1_AGENT_BASE_URL": "http://127.0.0.1:8001/v1",
            "PROMPT_R1_AGENT_SEED": "7",
            "PROMPT_R1_ENV_RATE_PERIOD": "2.5",
            "PROMPT_R1_ENV_TOKENS_PER_MINUTE": "none",
            "PROMPT_R1_FORCE_FINAL_ANSWER": "false",
            "OTHER": "ignored",
        }
    )
    assert (agent.base_url, agent.seed, env.rate_period, env.tokens_per_minute) == (
        "http://127.0.0.1:8001/v1",
        7,
        2.5,
        None,
    )
    assert loop.force_final_answer is False and loop.max_turns == 5
    with pytest.raises(ConfigError, match="PROMPT_R1_ENV_RATE_LIMIT='many': expected int"):
        configs_from_env({"PROMPT_R1_ENV_RATE_LIMIT": "many"})
    with pytest.raises(ConfigError, match="PROMPT_R1_FORCE_FINAL_ANSWER='maybe': expected bool"):
        configs_from_env({"PROMPT_R1_FORCE_FINAL_ANSWER": "maybe"})


def _fresh_app():
    """graphs/app.py as a new module, so its per-process cache starts empty."""
    return load_script(APP, "prompt_r1_langgraph_app")


def test_app_factory_builds_once_from_env_and_runs(monkeypatch):
    agent = scripted_agent([PROMPT.format(k=1), ANSWER.format(a="Paris")])
    with ScriptedServer({"env": echo_environment(), "agent": agent}) as upstream:
        for name, value in {
            "PROMPT_R1_AGENT_MODEL": "agent",
            "PROMPT_R1_AGENT_BASE_URL": upstream.base_url,
            "PROMPT_R1_ENV_MODEL": "env",
            "PROMPT_R1_ENV_BASE_URL": upstream.base_url,
            "PROMPT_R1_MAX_TURNS": "3",
        }.items():
            monkeypatch.setenv(name, value)
        app = _fresh_app()
        graph = app.make_graph()
        assert app.make_graph() is graph  # one agent and environment client per process

        async def run():
            result = await graph.ainvoke({"question": "Capital of France?"})
            events = [
                e async for e in graph.astream({"question": "Capital of France?"}, stream_mode="custom")
            ]
            return result, events

        result, events = asyncio.run(run())
    assert (result["answer"], result["status"]) == ("Paris", "answered")
    assert [t["kind"] for t in result["turns"]] == ["prompt", "answer"]
    assert result["usage"]["agent_calls"] == 2
    assert [e["type"] for e in events] == ["think", "prompt", "response", "think", "answer", "end"]


def test_app_factory_names_the_bad_variable(monkeypatch):
    monkeypatch.setenv("PROMPT_R1_MAX_TURNS", "five")
    with pytest.raises(ConfigError, match="PROMPT_R1_MAX_TURNS='five'"):
        _fresh_app().make_graph()
