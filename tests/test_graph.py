"""The LangGraph loop: every router path, what each side sees, and the graph as a Runnable and as a node."""

from __future__ import annotations

import contextlib
import json
import operator
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, TypedDict

import pytest
from conftest import ANSWER, PROMPT
from langgraph.graph import END, START, StateGraph

from prompt_r1.agents.served import ServedAgent
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig
from prompt_r1.core.prompts import ENVIRONMENT_SYSTEM_PROMPT, FINAL_ANSWER_REQUEST, question_message
from prompt_r1.loop.graph import build_graph, mermaid
from prompt_r1.testing.scripted import ScriptedAgent, ScriptedEnvironment
from prompt_r1.testing.servers import Fault, ScriptedServer, echo_environment, scripted_agent


def loop(server, *, agent_model="agent", max_turns=5, force_final_answer=True, **env):
    settings = dict(
        model="env", base_url=server.base_url, backoff_initial=0.01, backoff_max=0.02, timeout=5.0
    )
    settings.update(env)
    environment = EnvironmentClient(EnvironmentConfig(**settings), api_key="k")
    agent = ServedAgent(AgentConfig(model=agent_model, base_url=server.base_url), api_key="k")
    return build_graph(
        agent, environment, loop=LoopConfig(max_turns=max_turns, force_final_answer=force_final_answer)
    )


class InProcess:
    """The router tests' players, in process (prompt_r1.testing.scripted): no server, no sockets, the loop's own logic.
    `requests_for` reads what each side was asked as a server's records read."""

    def __init__(self, turns) -> None:
        self.agent, self.environment = (
            ScriptedAgent(scripted_agent(turns)),
            ScriptedEnvironment(echo_environment()),
        )

    def requests_for(self, model: str) -> list[SimpleNamespace]:
        if model == "env":
            return [SimpleNamespace(body=body) for body in self.environment.bodies]
        return [
            SimpleNamespace(body={"messages": r.messages, "stop": list(r.stop)}) for r in self.agent.requests
        ]


def run_script(turns, *, max_turns=5, force_final_answer=True):
    players = InProcess(turns)
    graph = build_graph(
        players.agent,
        players.environment,
        loop=LoopConfig(max_turns=max_turns, force_final_answer=force_final_answer),
    )
    return graph.invoke({"question": "Q?", "golden_answers": ["a"]}), players


def test_answered_after_two_prompts(server):
    result = loop(server).invoke({"question": "What is the capital of France?", "golden_answers": ["Paris"]})
    assert result["status"] == "answered" and result["answer"] == "Paris"
    assert [t["kind"] for t in result["turns"]] == ["prompt", "prompt", "answer"]
    assert [t["response"] for t in result["turns"][:2]] == ["Response 1: p1", "Response 2: p2"]
    assert result["golden_answers"] == ["Paris"]
    usage = result["usage"]
    assert (usage["agent_calls"], usage["env_calls"], usage["env_retries"]) == (3, 2, 0)
    assert usage["env_input_tokens"] > 0 and usage["env_output_tokens"] > 0
    json.dumps(result)  # the whole state is JSON

    # What the environment saw on each call: system prompt, earlier pairs, new prompt.
    env_calls = [r.body["messages"] for r in server.requests_for("env")]
    assert env_calls[0] == [
        {"role": "system", "content": ENVIRONMENT_SYSTEM_PROMPT},
        {"role": "user", "content": "p1"},
    ]
    assert env_calls[1][1:] == [
        {"role": "user", "content": "p1"},
        {"role": "assistant", "content": "Response 1: p1"},
        {"role": "user", "content": "p2"},
    ]
    # What the agent saw: the question with the paper's template, its own turns, <interaction_response> messages.
    agent_calls = [r.body["messages"] for r in server.requests_for("agent")]
    assert agent_calls[0] == [{"role": "user", "content": question_message("What is the capital of France?")}]
    assert agent_calls[2][1:] == [
        {"role": "assistant", "content": PROMPT.format(k=1)},
        {"role": "user", "content": "<interaction_response>Response 1: p1</interaction_response>"},
        {"role": "assistant", "content": PROMPT.format(k=2)},
        {"role": "user", "content": "<interaction_response>Response 2: p2</interaction_response>"},
    ]
    # One generation ends at the stop sequences.
    assert server.requests_for("agent")[0].body["stop"] == ["</interaction_prompt>", "</answer>"]


def test_turns_exhausted_asks_once_for_a_final_answer():
    result, server = run_script(
        [PROMPT.format(k=k) for k in range(1, 4)] + [ANSWER.format(a="late")], max_turns=2
    )
    assert result["status"] == "answered" and result["answer"] == "late"
    assert len(server.requests_for("env")) == 2
    assert result["turns"][2]["response_source"] == "final_request"
    assert server.requests_for("agent")[-1].body["messages"][-1] == {
        "role": "user",
        "content": FINAL_ANSWER_REQUEST,
    }
    assert result["turns"][3]["after_final_request"] is True


def test_turns_exhausted_and_still_prompting_is_max_turns():
    result, server = run_script([PROMPT.format(k=k) for k in range(1, 10)], max_turns=2)
    assert result["status"] == "max_turns" and result["answer"] is None
    assert len(server.requests_for("env")) == 2 and len(server.requests_for("agent")) == 4


def test_without_final_answer_request_the_episode_ends_at_max_turns():
    result, server = run_script(
        [PROMPT.format(k=k) for k in range(1, 10)], max_turns=3, force_final_answer=False
    )
    assert result["status"] == "max_turns"
    assert len(server.requests_for("env")) == 3 and len(server.requests_for("agent")) == 4


def test_zero_turns_goes_straight_to_the_final_request():
    result, server = run_script([PROMPT.format(k=1), ANSWER.format(a="x")], max_turns=0)
    assert result["status"] == "answered" and not server.requests_for("env")


@pytest.mark.parametrize(
    ("script", "defect"),
    [
        (["I will just talk."], "neither <interaction_prompt> nor <answer>"),
        (["<think>t</think><interaction_prompt> </interaction_prompt>"], "empty <interaction_prompt>"),
        (["<think>t</think><answer> </answer>"], "empty <answer>"),
    ],
)
def test_malformed_output_ends_with_format_error(script, defect):
    result, server = run_script(script)
    assert result["status"] == "format_error" and result["answer"] is None
    assert defect in result["turns"][-1]["defects"] and defect in result["error"]
    assert not server.requests_for("env")


def test_environment_failure_after_retries_is_environment_error(server):
    server.inject(*[Fault("500")] * 3, model="env")
    result = loop(server, max_retries=2).invoke({"question": "Q?"})
    assert result["status"] == "environment_error"
    assert "EnvironmentServerError" in result["error"] and result["turns"][0]["error"] == result["error"]
    assert len(server.requests_for("env")) == 3


def test_retries_recover_inside_an_episode(server):
    # A 1 s timeout, not less: on a loaded 2-core CI machine an ordinary reply can take a few hundred ms, and an
    # extra timeout would use up retries this test counts.
    server.inject(Fault("429", retry_after=0.05), Fault("500"), Fault("timeout", delay=3.0), model="env")
    result = loop(server, timeout=1.0).invoke({"question": "Q?"})
    assert result["status"] == "answered"
    assert result["usage"]["env_retries"] == 3
    assert result["turns"][0]["environment_call"]["attempts"] == 4


def test_environment_context_overflow(server):
    server.inject(Fault("context"), model="env")
    result = loop(server).invoke({"question": "Q?"})
    assert result["status"] == "context_overflow" and "context" in result["error"]
    assert len(server.requests_for("env")) == 1  # an overflow is final: retrying cannot make it fit


async def test_abatch_with_concurrency_cap():
    with ScriptedServer(
        {"env": echo_environment(), "agent": scripted_agent([PROMPT.format(k=1), ANSWER.format(a="x")])},
        latency=0.05,
    ) as server:
        graph = loop(server)
        results = await graph.abatch(
            [{"question": f"Q{i}?"} for i in range(12)], config={"max_concurrency": 3}
        )
    assert [r["status"] for r in results] == ["answered"] * 12
    assert server.max_in_flight <= 3
    assert [r["question"] for r in results] == [f"Q{i}?" for i in range(12)]


async def test_astream_yields_node_updates_in_order(server):
    graph = loop(server)
    chunks = [chunk async for chunk in graph.astream({"question": "Q?"}, stream_mode="updates")]
    # `begin` starts the episode (on a thread it drops what the last one left; here it has nothing to drop).
    assert [next(iter(c)) for c in chunks] == [
        "begin",
        "agent",
        "environment",
        "agent",
        "environment",
        "agent",
    ]
    # The answering turn settles the episode in the same step.
    assert chunks[-1]["agent"]["status"] == "answered" and chunks[-1]["agent"]["answer"] == "Paris"


def test_graph_as_a_node_of_a_parent_graph(server):
    class Parent(TypedDict, total=False):
        question: str
        answer: str | None
        status: str
        log: Annotated[list[str], operator.add]

    def before(state: Parent) -> dict:
        return {"log": ["before"], "question": state["question"].strip()}

    def after(state: Parent) -> dict:
        return {"log": [f"after:{state['status']}"]}

    builder = StateGraph(Parent)
    builder.add_node("before", before)
    builder.add_node("prompt_r1", loop(server))
    builder.add_node("after", after)
    builder.add_edge(START, "before")
    builder.add_edge("before", "prompt_r1")
    builder.add_edge("prompt_r1", "after")
    builder.add_edge("after", END)
    result = builder.compile().invoke({"question": "  Q?  "})
    assert result["answer"] == "Paris" and result["log"] == ["before", "after:answered"]


def test_topology_snapshot():
    """Every edge of the loop, exactly: a route added or lost shows here (and in the README's drawing)."""
    players = InProcess([ANSWER.format(a="x")])
    edges = build_graph(players.agent, players.environment).get_graph().edges
    assert sorted((e.source, e.target, e.conditional) for e in edges) == [
        ("__start__", "begin", False),
        ("agent", "__end__", True),
        ("agent", "environment", True),
        ("agent", "final_answer", True),
        ("agent", "finalize", True),
        ("begin", "agent", False),
        ("environment", "agent", True),
        ("environment", "finalize", True),
        ("final_answer", "agent", True),
        ("final_answer", "finalize", True),
        ("finalize", "__end__", False),
    ]


def test_the_docs_drawing_is_the_graph():
    page = (Path(__file__).resolve().parents[1] / "docs" / "concepts.md").read_text(encoding="utf-8")
    drawn = mermaid()
    assert f"```mermaid\n{drawn}```" in page, "redraw it: python -m prompt_r1.loop.graph"


@pytest.mark.parametrize("bad", [{}, {"question": "  "}, {"question": 3}])
def test_bad_input_is_a_clear_error(server, bad):
    with pytest.raises(ValueError, match="non-empty 'question'"):
        loop(server).invoke(bad)


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_turns"):
        build_graph(
            object(),
            EnvironmentClient(EnvironmentConfig(base_url="http://127.0.0.1:1/v1")),
            loop=LoopConfig(max_turns=-1),
        )


def test_the_loops_keywords_still_work_for_one_release_with_a_warning_naming_loop_config():
    players = InProcess([PROMPT.format(k=1), ANSWER.format(a="a")])
    notice = (
        "build_graph(max_turns=..., max_new_tokens=...) is deprecated; pass loop=LoopConfig(max_turns=..., "
    )
    with pytest.warns(DeprecationWarning, match=re.escape(notice + "max_turn_tokens=...) instead")) as caught:
        graph = build_graph(players.agent, players.environment, max_turns=0, max_new_tokens=16)
    assert caught[0].filename == __file__  # the notice points at the caller's line
    result = graph.invoke({"question": "Q?"})
    assert result["status"] == "answered" and not players.requests_for("env")  # max_turns=0 took effect
    with pytest.raises(ValueError, match="not both"):
        build_graph(players.agent, players.environment, loop=LoopConfig(), max_turns=3)


def test_environment_error_counts_the_retries(server):
    server.inject(*[Fault("500")] * 3, model="env")
    result = loop(server, max_retries=2).invoke({"question": "Q?"})
    assert result["usage"]["env_failed_calls"] == 1 and result["usage"]["env_retries"] == 2


def test_the_environment_call_is_marked_away_for_a_batching_agent():
    """A batching backend (prompt_r1.agents.batching) must not count on an episode's request while the
    environment answers it: the environment node holds the agent's `away()` around each call, and only there."""
    players = InProcess([PROMPT.format(k=1), PROMPT.format(k=2), ANSWER.format(a="a")])
    marks: list[str] = []

    @contextlib.contextmanager
    def away():
        marks.append("in")
        yield
        marks.append(f"out after {len(players.environment.bodies)} call(s)")

    players.agent.away = away
    result = build_graph(players.agent, players.environment, loop=LoopConfig()).invoke(
        {"question": "Q?", "golden_answers": ["a"]}
    )
    assert result["status"] == "answered"
    assert marks == ["in", "out after 1 call(s)", "in", "out after 2 call(s)"]
