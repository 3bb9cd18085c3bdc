"""A thread (LangGraph's checkpointer: Studio, chat UIs and `langgraph dev` reuse them) holds one episode per
input: a second question on the thread is a new episode, never a continuation of the first; an interrupted
episode resumed on its thread (input None) continues where it stopped."""

from __future__ import annotations

import contextlib

import pytest
from conftest import ANSWER, PROMPT

from prompt_r1.loop.graph import build_graph
from prompt_r1.testing.scripted import ScriptedAgent, ScriptedEnvironment
from prompt_r1.testing.servers import echo_environment, scripted_agent


@contextlib.asynccontextmanager
async def saver(kind: str, tmp_path):
    if kind == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        yield InMemorySaver()
    else:
        sqlite = pytest.importorskip("langgraph.checkpoint.sqlite.aio")
        async with sqlite.AsyncSqliteSaver.from_conn_string(str(tmp_path / "threads.sqlite")) as s:
            yield s


def players(fail_first_call: bool = False):
    agent = ScriptedAgent(scripted_agent([PROMPT.format(k=1), ANSWER.format(a="Paris")]))
    echo = echo_environment()
    calls = []

    def respond(body: dict) -> str:
        calls.append(body)
        if fail_first_call and len(calls) == 1:
            raise RuntimeError(
                "the process stopped mid-call"
            )  # not an environment error: the run is interrupted
        return echo(body)

    return agent, ScriptedEnvironment(respond), calls


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_second_question_on_a_thread_is_a_new_episode(kind, tmp_path):
    agent, environment, calls = players()
    async with saver(kind, tmp_path) as checkpointer:
        graph = build_graph(agent, environment, checkpointer=checkpointer)
        thread = {"configurable": {"thread_id": "chat-1"}}
        first = await graph.ainvoke({"question": "Capital of France?", "golden_answers": ["Paris"]}, thread)
        second = await graph.ainvoke({"question": "Capital of Italy?"}, thread)
        third = await graph.ainvoke({"question": "Capital of Italy?", "golden_answers": ["Rome"]}, thread)
    for result in (first, second, third):
        assert result["status"] == "answered" and [t["kind"] for t in result["turns"]] == ["prompt", "answer"]
        assert result["usage"]["env_calls"] == 1 and result["usage"]["agent_calls"] == 2
    assert len(calls) == 3  # each question paid for its own environment call
    # The second episode's agent saw its own question alone, none of the first's turns.
    second_start = agent.requests[2].messages
    assert len(second_start) == 1 and "Capital of Italy?" in second_start[0]["content"]
    assert "France" not in str(agent.requests[2].messages) + str(agent.requests[3].messages)
    # The environment of the second episode saw no earlier prompt or response.
    assert len(calls[1]["messages"]) == 2  # system prompt, the new prompt
    # Golden answers go with the input that gives them.
    assert first["golden_answers"] == ["Paris"] and second.get("golden_answers") is None
    assert third["golden_answers"] == ["Rome"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_an_interrupted_episode_resumes_on_its_thread_and_a_new_question_starts_over(kind, tmp_path):
    agent, environment, calls = players(fail_first_call=True)
    async with saver(kind, tmp_path) as checkpointer:
        graph = build_graph(agent, environment, checkpointer=checkpointer)
        thread = {"configurable": {"thread_id": "chat-2"}}
        with pytest.raises(RuntimeError, match="stopped mid-call"):
            await graph.ainvoke({"question": "Capital of France?"}, thread, durability="sync")
        assert (await graph.aget_state(thread)).next == ("environment",)
        resumed = await graph.ainvoke(None, thread, durability="sync")
        assert resumed["status"] == "answered" and resumed["answer"] == "Paris"
        assert [t["kind"] for t in resumed["turns"]] == ["prompt", "answer"]
        assert len(agent.requests) == 2  # the first agent turn was not played again
        # Interrupted again, then a new question instead of a resume: a fresh episode, not the old one's end.
        agent2, environment2, calls2 = players(fail_first_call=True)
        graph2 = build_graph(agent2, environment2, checkpointer=checkpointer)
        thread2 = {"configurable": {"thread_id": "chat-3"}}
        with pytest.raises(RuntimeError):
            await graph2.ainvoke({"question": "Capital of France?"}, thread2, durability="sync")
        fresh = await graph2.ainvoke({"question": "Capital of Spain?"}, thread2, durability="sync")
    assert [t["kind"] for t in fresh["turns"]] == ["prompt", "answer"] and fresh["usage"]["env_calls"] == 1
    assert "Capital of Spain?" in agent2.requests[-2].messages[0]["content"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_new_question_keeps_the_golden_answers_it_gives_even_when_equal_to_the_last(kind, tmp_path):
    """Issue 51 item 6: the state once kept none of a second question's golden answers when they equalled the
    first's (taken for leftovers); every new episode carries exactly the inputs it was given."""
    _, environment, _ = players()
    agent = ScriptedAgent(scripted_agent([PROMPT.format(k=1), ANSWER.format(a="Paris")] * 4))
    async with saver(kind, tmp_path) as checkpointer:
        graph = build_graph(agent, environment, checkpointer=checkpointer)
        thread = {"configurable": {"thread_id": "chat-4"}}
        given = [
            {"question": "Capital of France?", "golden_answers": ["Paris"]},
            {"question": "Largest city of France?", "golden_answers": ["Paris"]},  # equal to the first's
            {"question": "Largest city of France?"},  # none given: none kept
            {"question": "Capital of France?", "golden_answers": ["Paris"]},
        ]
        results = [await graph.ainvoke(i, thread) for i in given]
        saved = (await graph.aget_state(thread)).values
    for inputs, result in zip(given, results, strict=True):
        assert result["question"] == inputs["question"]
        assert result.get("golden_answers") == inputs.get("golden_answers"), (inputs, result)
    assert saved["golden_answers"] == ["Paris"] and saved["question"] == "Capital of France?"
