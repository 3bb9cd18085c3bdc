"""Prompt-R1 where LangChain users are: the chat model in chains and graphs, per-turn streaming, and traces."""

from __future__ import annotations

import asyncio
import operator
from functools import reduce
from typing import Annotated, TypedDict

import pytest
from conftest import ANSWER, PROMPT
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tracers.run_collector import RunCollectorCallbackHandler
from langgraph.graph import END, START, MessagesState, StateGraph

from prompt_r1.agents.served import ServedAgent
from prompt_r1.chat_model import PromptR1Chat, question_of
from prompt_r1.config import AgentConfig, EnvironmentConfig
from prompt_r1.environment import EnvironmentClient
from prompt_r1.errors import EnvironmentCallError
from prompt_r1.events import EVENT_NAME, format_event
from prompt_r1.graph import build_graph
from prompt_r1.testing import Fault, ScriptedServer, echo_environment, relay_agent

# The fixture server's agent prompts twice, then answers "Paris".
EVENT_TYPES = ["think", "prompt", "response", "think", "prompt", "response", "think", "answer", "end"]


def parts(server, **env):
    settings = dict(model="env", base_url=server.base_url, backoff_initial=0.01, backoff_max=0.02, **env)
    environment = EnvironmentClient(EnvironmentConfig(**settings), api_key="k")
    agent = ServedAgent(AgentConfig(model="agent", base_url=server.base_url), api_key="k")
    return agent, environment


def chat_model(server, **env) -> PromptR1Chat:
    agent, environment = parts(server, **env)
    return PromptR1Chat(agent=agent, environment=environment)


def test_invoke_answers_the_last_user_message_with_turns_and_usage(server):
    chat = chat_model(server)
    message = chat.invoke(
        [SystemMessage("be brief"), HumanMessage("earlier"), HumanMessage("Capital of France?")]
    )
    assert isinstance(message, AIMessage) and message.content == "Paris"
    meta = message.response_metadata
    assert meta["status"] == "answered" and meta["finish_reason"] == "stop" and meta["error"] is None
    assert [t["kind"] for t in meta["turns"]] == ["prompt", "prompt", "answer"]
    usage = meta["usage"]
    assert (
        message.usage_metadata["input_tokens"] == usage["agent_prompt_tokens"] + usage["env_input_tokens"] > 0
    )
    assert (
        message.usage_metadata["output_tokens"]
        == usage["agent_completion_tokens"] + usage["env_output_tokens"]
    )
    # The agent was asked the last user message only.
    first_agent_call = server.requests_for("agent")[0].body["messages"]
    assert first_agent_call[0]["content"].startswith("Question: Capital of France?\n")


def test_environment_as_a_plain_chat_openai_and_batch():
    from langchain_openai import ChatOpenAI

    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        agent = ServedAgent(AgentConfig(model="agent", base_url=server.base_url), api_key="k")
        environment = ChatOpenAI(
            model="env", base_url=server.base_url, api_key="k", max_retries=0, streaming=True
        )
        chat = PromptR1Chat(agent=agent, environment=environment)
        answers = chat.batch(["What is A?", "What is B?"])
        # streaming=True on the user's model is overridden for the environment call (one reply per call). A model
        # passed in as it is stays on one event loop: the sync calls all run on the process's background loop.
        streamed = list(chat.stream("What is C?"))
    assert [m.content for m in answers] == [
        "Response 2: What is A? / part 2",
        "Response 2: What is B? / part 2",
    ]
    assert reduce(operator.add, streamed).content == "Response 2: What is C? / part 2"


async def _collect(aiterator):
    return [chunk async for chunk in aiterator]


def test_inside_an_lcel_chain(server):
    chain = (
        ChatPromptTemplate.from_messages([("human", "Capital of {country}?")])
        | chat_model(server)
        | StrOutputParser()
    )
    assert chain.invoke({"country": "France"}) == "Paris"
    assert (
        server.requests_for("agent")[0]
        .body["messages"][0]["content"]
        .startswith("Question: Capital of France?")
    )


def test_as_the_model_of_a_prebuilt_agent_and_a_node_of_a_parent_graph(server):
    from langgraph.prebuilt import create_react_agent

    chat = chat_model(server)
    agent = create_react_agent(chat, tools=[])
    result = agent.invoke({"messages": [HumanMessage("Capital of France?")]})
    assert result["messages"][-1].content == "Paris"

    async def answer(state: MessagesState) -> dict:
        return {"messages": [await chat.ainvoke(state["messages"])]}

    parent = StateGraph(MessagesState)
    parent.add_node("prompt_r1", answer)
    parent.add_edge(START, "prompt_r1")
    parent.add_edge("prompt_r1", END)
    out = asyncio.run(parent.compile().ainvoke({"messages": [HumanMessage("Capital of France?")]}))
    assert out["messages"][-1].content == "Paris"


def test_astream_yields_each_turn_event_then_the_answer(server):
    chunks = asyncio.run(_collect(chat_model(server).astream("Capital of France?")))
    events = [c.additional_kwargs["prompt_r1_events"][0] for c in chunks[:-1]]
    assert [e["type"] for e in events] == EVENT_TYPES
    assert all(c.content == "" for c in chunks[:-1]) and chunks[-1].content == "Paris"
    assert [e["text"] for e in events if e["type"] == "response"] == ["Response 1: p1", "Response 2: p2"]
    assert events[-1] == {"type": "end", "status": "answered", "answer": "Paris", "turns": 3, "error": None}
    whole = reduce(operator.add, chunks)  # added up: the whole message, every event in order
    assert whole.content == "Paris" and whole.additional_kwargs["prompt_r1_events"] == events
    assert whole.response_metadata["status"] == "answered" and whole.usage_metadata["total_tokens"] > 0


def test_sync_stream_matches_async(server):
    chunks = list(chat_model(server).stream("Capital of France?"))
    assert [c.additional_kwargs["prompt_r1_events"][0]["type"] for c in chunks[:-1]] == EVENT_TYPES
    assert chunks[-1].content == "Paris"


def test_astream_events_of_the_chat_model_and_of_the_graph_carry_the_events_in_order(server):
    chat = chat_model(server)

    async def events(runnable, inputs):
        return [e async for e in runnable.astream_events(inputs, version="v2")]

    # The chat model's stream events carry the per-turn events in their chunks, as its astream does ...
    from_chat = [
        e["data"]["chunk"].additional_kwargs["prompt_r1_events"][0]
        for e in asyncio.run(events(chat, "Capital of France?"))
        if e["event"] == "on_chat_model_stream" and e["data"]["chunk"].additional_kwargs
    ]
    assert [e["type"] for e in from_chat] == EVENT_TYPES
    # ... and the graph's as custom events named prompt_r1, the same dicts.
    from_graph = [
        e["data"]
        for e in asyncio.run(events(chat.graph, {"question": "Capital of France?"}))
        if e["event"] == "on_custom_event" and e["name"] == EVENT_NAME
    ]
    assert [{**e, "latency_s": 0} for e in from_graph] == [{**e, "latency_s": 0} for e in from_chat]


def test_graph_custom_stream_also_from_a_parent_graph(server):
    agent, environment = parts(server)
    loop = build_graph(agent, environment)

    class Parent(TypedDict, total=False):
        question: str
        answer: str | None
        log: Annotated[list[str], operator.add]

    parent = StateGraph(Parent)
    parent.add_node("prompt_r1", loop)
    parent.add_edge(START, "prompt_r1")
    parent.add_edge("prompt_r1", END)
    compiled = parent.compile()

    async def run():
        return [
            chunk
            async for chunk in compiled.astream({"question": "Q?"}, stream_mode="custom", subgraphs=True)
        ]

    streamed = asyncio.run(run())
    assert [event["type"] for _namespace, event in streamed] == EVENT_TYPES
    lines = [format_event(event) for _namespace, event in streamed]
    assert lines[1] == "turn 1  prompt:    p1" and lines[-1].startswith("end     answered after 3 turn(s)")


def test_an_environment_that_keeps_failing_raises_and_streams_an_error_event(server):
    chat = chat_model(server, max_retries=1)
    server.inject(Fault("500"), Fault("500"), model="env")
    with pytest.raises(EnvironmentCallError, match="500"):
        chat.invoke("Capital of France?")
    server.inject(Fault("500"), Fault("500"), model="env")
    chunks = []

    async def run():
        async for chunk in chat.astream("Capital of France?"):
            chunks.append(chunk)

    with pytest.raises(EnvironmentCallError):
        asyncio.run(run())
    types = [c.additional_kwargs["prompt_r1_events"][0]["type"] for c in chunks]
    assert types == ["think", "prompt", "error", "end"]


def test_questions_are_read_from_text_parts_and_a_missing_question_is_a_clear_error():
    assert question_of(
        [HumanMessage([{"type": "text", "text": "Who"}, {"type": "text", "text": "wrote it?"}])]
    ) == ("Who\nwrote it?")
    with pytest.raises(ValueError, match="needs a user message"):
        question_of([SystemMessage("only a system prompt")])
    with pytest.raises(ValueError, match="no text"):
        question_of([HumanMessage("   ")])


def test_one_trace_per_episode_with_each_agent_and_environment_call(server):
    """A callback handler sees one root run per episode; under it the agent turns and environment calls, each
    with its turn index, as LangSmith would show them."""
    agent, environment = parts(server)
    graph = build_graph(agent, environment)
    config = {"run_name": "prompt_r1_episode", "tags": ["batch"], "metadata": {"episode_id": "e1"}}
    collector = RunCollectorCallbackHandler()
    graph.invoke({"question": "Q?"}, {**config, "callbacks": [collector]})
    (root,) = collector.traced_runs
    assert (
        root.name == "prompt_r1_episode"
        and "batch" in root.tags
        and root.extra["metadata"]["episode_id"] == "e1"
    )

    def walk(run):
        yield run
        for child in run.child_runs:
            yield from walk(child)

    runs = list(walk(root))
    agent_runs = [r for r in runs if r.name == "agent" and r.run_type == "llm"]
    env_runs = [r for r in runs if r.name == "environment" and r.run_type == "llm"]
    assert [r.extra["metadata"]["prompt_r1_turn"] for r in agent_runs] == [0, 1, 2]
    assert [r.extra["metadata"]["prompt_r1_turn"] for r in env_runs] == [0, 1]
    assert all(r.extra["metadata"]["episode_id"] == "e1" for r in agent_runs + env_runs)
    assert agent_runs[0].outputs["generations"][0][0]["text"] == PROMPT.format(k=1)
    assert agent_runs[-1].outputs["generations"][0][0]["text"] == ANSWER.format(a="Paris")
    assert "environment" in env_runs[0].tags and "agent" in agent_runs[0].tags

    # Through the chat model: the episode nests under the chat model's own run, one trace per call.
    chat = PromptR1Chat(agent=agent, environment=environment)
    collector = RunCollectorCallbackHandler()
    chat.batch(["Q1?", "Q2?"], config={"callbacks": [collector]})
    roots = collector.traced_runs
    assert len(roots) == 2 and all(r.name == "PromptR1Chat" for r in roots)
    for r in roots:
        assert [c.name for c in r.child_runs] == ["prompt_r1_episode"]
        assert sum(1 for x in walk(r) if x.name == "agent" and x.run_type == "llm") == 3
