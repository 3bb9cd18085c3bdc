"""Prompt-R1 where LangChain users are: the chat model in chains and graphs, per-turn streaming, and traces."""

from __future__ import annotations

import asyncio
import operator
from functools import reduce
from typing import Annotated, TypedDict

import pytest
from conftest import ANSWER, PROMPT
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tracers.run_collector import RunCollectorCallbackHandler
from langgraph.graph import END, START, MessagesState, StateGraph

from prompt_r1.agents.served import ServedAgent
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.core.config import AgentConfig, EnvironmentConfig
from prompt_r1.core.errors import EnvironmentCallError
from prompt_r1.core.events import EVENT_NAME, format_event
from prompt_r1.integrations.chat_model import PromptR1Chat, question_of
from prompt_r1.loop.graph import build_graph
from prompt_r1.testing.servers import Fault, ScriptedServer, echo_environment, relay_agent

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


# `langchain.agents.create_agent` replaces it, but `langchain` is no dependency of this project; LangGraph's
# prebuilt agent still works and is what the installed packages offer.
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
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


class TurnEvents(BaseCallbackHandler):
    """A callback handler that keeps the custom events named prompt_r1, as an app would to show turns live."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def on_custom_event(self, name, data, **kwargs) -> None:
        if name == EVENT_NAME:
            self.events.append(data)


def test_a_chains_stream_yields_the_answer_and_no_empty_strings_and_turns_reach_callbacks(server):
    chain = (
        ChatPromptTemplate.from_messages([("human", "Capital of {country}?")])
        | chat_model(server)
        | StrOutputParser()
    )
    turns = TurnEvents()
    assert list(chain.stream({"country": "France"}, config={"callbacks": [turns]})) == ["Paris"]
    assert [e["type"] for e in turns.events] == EVENT_TYPES
    assert [e["text"] for e in turns.events if e["type"] == "response"] == [
        "Response 1: p1",
        "Response 2: p2",
    ]


def test_astream_yields_the_answer_only_with_every_event_in_its_message(server):
    turns = TurnEvents()
    chunks = asyncio.run(
        _collect(chat_model(server).astream("Capital of France?", config={"callbacks": [turns]}))
    )
    assert [c.content for c in chunks] == ["Paris"]
    events = chunks[-1].additional_kwargs["prompt_r1_events"]
    assert [e["type"] for e in events] == EVENT_TYPES
    assert events[-1] == {"type": "end", "status": "answered", "answer": "Paris", "turns": 3, "error": None}
    whole = reduce(operator.add, chunks)  # added up: the whole message, every event in order
    assert whole.content == "Paris" and whole.additional_kwargs["prompt_r1_events"] == events
    assert whole.response_metadata["status"] == "answered" and whole.usage_metadata["total_tokens"] > 0
    # What the callback saw as it happened are the same events.
    assert [{**e, "latency_s": 0} for e in turns.events] == [{**e, "latency_s": 0} for e in events]


def test_sync_stream_and_invoke_match_async(server):
    chunks = list(chat_model(server).stream("Capital of France?"))
    assert [c.content for c in chunks] == ["Paris"]
    assert [e["type"] for e in chunks[-1].additional_kwargs["prompt_r1_events"]] == EVENT_TYPES
    message = chat_model(server).invoke("Capital of France?")
    assert [e["type"] for e in message.additional_kwargs["prompt_r1_events"]] == EVENT_TYPES


def test_astream_events_of_the_chat_model_and_of_the_graph_carry_the_events_in_order(server):
    chat = chat_model(server)

    async def events(runnable, inputs):
        return [e async for e in runnable.astream_events(inputs, version="v2")]

    # The chat model's stream events: the turn events as custom events named prompt_r1, then the answer's text
    # (no empty chunk) ...
    streamed = asyncio.run(events(chat, "Capital of France?"))
    from_chat = [e["data"] for e in streamed if e["event"] == "on_custom_event" and e["name"] == EVENT_NAME]
    assert [e["type"] for e in from_chat] == EVENT_TYPES
    texts = [e["data"]["chunk"].content for e in streamed if e["event"] == "on_chat_model_stream"]
    assert texts == ["Paris"]
    # ... and the graph's, the same dicts.
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
    chunks, turns = [], TurnEvents()

    async def run():
        async for chunk in chat.astream("Capital of France?", config={"callbacks": [turns]}):
            chunks.append(chunk)

    with pytest.raises(EnvironmentCallError):
        asyncio.run(run())
    assert chunks == []  # no answer, no chunk; the error event went to the callbacks
    assert [e["type"] for e in turns.events] == ["think", "prompt", "error", "end"]


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


def walk(run):
    yield run
    for child in run.child_runs:
        yield from walk(child)


def assert_episode_nested(chat_run, episode_id: str) -> None:
    """Under the chat model's run: one `prompt_r1_episode` run, and under it every agent turn and environment call
    with their turn index, tags and the caller's metadata."""
    (episode,) = chat_run.child_runs
    assert episode.name == "prompt_r1_episode" and "prompt-r1" in episode.tags
    runs = list(walk(episode))
    agent_runs = [r for r in runs if r.name == "agent" and r.run_type == "llm"]
    env_runs = [r for r in runs if r.name == "environment" and r.run_type == "llm"]
    assert [r.extra["metadata"]["prompt_r1_turn"] for r in agent_runs] == [0, 1, 2]
    assert [r.extra["metadata"]["prompt_r1_turn"] for r in env_runs] == [0, 1]
    assert all("agent" in r.tags for r in agent_runs) and all("environment" in r.tags for r in env_runs)
    assert all(r.extra["metadata"]["episode_id"] == episode_id for r in agent_runs + env_runs)


def test_streamed_calls_nest_the_episode_under_the_chat_models_run():
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        chat = chat_model(server)
        collector = RunCollectorCallbackHandler()
        config = {"callbacks": [collector], "metadata": {"episode_id": "s"}}
        # Two sync streams interleaved: each episode still nests under its own call.
        first, second = chat.stream("Q1?", config=config), chat.stream("Q2?", config=config)
        chunks = [next(first), next(second)]
        chunks += [*first, *second]
        roots = collector.traced_runs
        assert [r.name for r in roots] == ["PromptR1Chat", "PromptR1Chat"]
        for root in roots:
            assert_episode_nested(root, "s")
        assert sorted(c.content for c in chunks) == ["Response 2: Q1? / part 2", "Response 2: Q2? / part 2"]

        collector = RunCollectorCallbackHandler()
        asyncio.run(
            _collect(chat.astream("Q?", config={"callbacks": [collector], "metadata": {"episode_id": "a"}}))
        )
        (root,) = collector.traced_runs
        assert root.name == "PromptR1Chat"
        assert_episode_nested(root, "a")


def test_inside_a_parent_graph_streamed_as_messages_the_episode_nests_under_the_chat_model():
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        chat = chat_model(server)

        def sync_node(state: MessagesState) -> dict:
            return {"messages": [chat.invoke(state["messages"])]}

        async def async_node(state: MessagesState) -> dict:
            return {"messages": [await chat.ainvoke(state["messages"])]}

        def parent_of(node):
            parent = StateGraph(MessagesState)
            parent.add_node("answer", node)
            parent.add_edge(START, "answer")
            parent.add_edge("answer", END)
            return parent.compile()

        inputs = {"messages": [HumanMessage("Q?")]}
        collector = RunCollectorCallbackHandler()
        config = {"callbacks": [collector], "metadata": {"episode_id": "m"}}
        streamed = list(parent_of(sync_node).stream(inputs, config, stream_mode="messages"))

        async def run_async():
            return [
                part async for part in parent_of(async_node).astream(inputs, config, stream_mode="messages")
            ]

        streamed_async = asyncio.run(run_async())
    for parts in (streamed, streamed_async):
        # The chat model streams the answer alone, its events in its message; the episode's own model calls stay
        # inside.
        assert [chunk.content for chunk, _ in parts] == ["Response 2: Q? / part 2"]
        assert len(parts[0][0].additional_kwargs["prompt_r1_events"]) == len(EVENT_TYPES)
        assert {meta["langgraph_node"] for _, meta in parts} == {"answer"}
    assert len(collector.traced_runs) == 2
    for root in collector.traced_runs:
        (node,) = root.child_runs
        (chat_run,) = node.child_runs
        assert chat_run.name == "PromptR1Chat"
        assert_episode_nested(chat_run, "m")


def test_astream_events_of_the_chat_model_carry_the_custom_events_under_its_run(server):
    async def run():
        return [e async for e in chat_model(server).astream_events("Capital of France?", version="v2")]

    events = asyncio.run(run())
    (start,) = [e for e in events if e["event"] == "on_chat_model_start" and e["name"] == "PromptR1Chat"]
    custom = [e for e in events if e["event"] == "on_custom_event" and e["name"] == EVENT_NAME]
    assert [e["data"]["type"] for e in custom] == EVENT_TYPES
    assert all(e["parent_ids"][0] == start["run_id"] for e in custom)
    episode = next(e for e in events if e["event"] == "on_chain_start" and e["name"] == "prompt_r1_episode")
    assert episode["parent_ids"] == [start["run_id"]]


def test_tools_are_refused_clearly_and_an_empty_tool_list_is_the_model_itself(server):
    from langchain_core.tools import tool

    @tool
    def lookup(query: str) -> str:
        """Look something up."""
        return query

    chat = chat_model(server)
    assert chat.bind_tools([]) is chat and chat.bind_tools([], tool_choice="auto") is chat
    with pytest.raises(NotImplementedError, match="makes no tool calls; use it with tools=\\[\\]"):
        chat.bind_tools([lookup])
    with pytest.raises(NotImplementedError, match="makes no tool calls.*parse its text answer"):
        chat.with_structured_output({"title": "Answer", "type": "object", "properties": {}})


def test_a_non_text_content_part_is_refused_by_name(server):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(ValueError, match="content part of type 'image_url'"):
        question_of([HumanMessage([{"type": "text", "text": "What is in this picture?"}, image])])
    with pytest.raises(ValueError, match="content part of type 'image_url'"):
        chat_model(server).invoke([HumanMessage([{"type": "text", "text": "What is this?"}, image])])
    assert server.requests_for("agent") == []  # refused before any work


def test_the_graph_is_built_once_when_threads_ask_for_it_at_once(server, monkeypatch):
    import threading
    import time

    import prompt_r1.loop.graph

    built = []
    real = prompt_r1.loop.graph.build_graph

    def slow_build(*args, **kwargs):
        time.sleep(0.05)  # long enough for every thread to find no graph yet, were there no lock
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(prompt_r1.loop.graph, "build_graph", slow_build)
    chat = chat_model(server)
    barrier = threading.Barrier(8)
    graphs = []

    def ask() -> None:
        barrier.wait()
        graphs.append(chat.graph)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(built) == 1 and len(graphs) == 8 and all(g is built[0] for g in graphs)


def test_prompt_r1_run_names_and_tags_its_episode_trace(server, capsys):
    from langchain_core.tracers.context import collect_runs

    from prompt_r1.cli.main import main

    argv = ["run", "Capital of France?", "--agent-model", "agent", "--agent-base-url", server.base_url,
            "--env-model", "env", "--env-base-url", server.base_url]  # fmt: skip
    with collect_runs() as collector:  # the same hook LangSmith's environment variables use
        assert main(argv) == 0
    # (collect_runs' handler is not inherited, so the runs inside the episode show up beside it here)
    (root,) = [r for r in collector.traced_runs if r.run_type == "chain"]
    assert root.name == "prompt_r1_episode" and {"prompt-r1", "run"} <= set(root.tags)
    assert root.extra["metadata"]["episode_id"].startswith("run-")
    assert "answer: Paris" in capsys.readouterr().out


def test_the_loop_settings_come_from_one_loop_config():
    from prompt_r1.core.config import LoopConfig
    from prompt_r1.testing.scripted import (
        ScriptedAgent,
        ScriptedEnvironment,
        echo_environment,
        scripted_agent,
    )

    agent, environment = (
        ScriptedAgent(scripted_agent([ANSWER.format(a="x")])),
        ScriptedEnvironment(echo_environment()),
    )
    chat = PromptR1Chat(
        agent=agent, environment=environment, loop=LoopConfig(max_turns=2, max_turn_tokens=64)
    )
    assert chat.loop == LoopConfig(max_turns=2, max_turn_tokens=64) and chat.max_turns == 2
    with pytest.warns(DeprecationWarning, match=r"PromptR1Chat\(max_turns=\.\.\.\) is deprecated"):
        old = PromptR1Chat(agent=agent, environment=environment, max_turns=3)  # the README's former call
    assert old.loop == LoopConfig(max_turns=3) and old.invoke("Q?").content == "x"
    with pytest.raises(ValueError, match="not both"):
        PromptR1Chat(agent=agent, environment=environment, loop=LoopConfig(), max_turns=3)
    with pytest.raises(ValueError, match="not both"):
        build_graph(agent, environment, loop=LoopConfig(), max_turns=3)
