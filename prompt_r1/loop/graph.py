"""The Prompt-R1 loop as a LangGraph state machine, shared by inference, batch runs and GRPO rollouts.

    START ─▶ begin ─▶ agent ──route_after_agent──▶ environment ──route_after_environment──▶ agent …
                          │  │                  ├─▶ final_answer ──(same router)──▶ agent   (turns used up: ask once)
                          │  │                  └─▶ finalize ─▶ END          (environment error, overflow, turns used up)
                          │  └─▶ END     (the agent's turn settled the episode: an answer, a malformed turn, a full context)

`begin` starts each new input as a new episode (on a thread, whatever the last episode left is dropped).

This module is the wiring: the nodes and routers are `LoopNodes`' methods (nodes.py), the state is state.py's,
and what differs between the paper's loop and the reference release's is asked of the protocol object chosen from
`LoopConfig.protocol` (prompt_r1.loop.protocols). Nodes do the work and return only the keys they change; the two
routers alone decide where to go, and `max_turns` lives in the routers. The state is plain JSON, so it
checkpoints, streams and crosses process boundaries as it is; clients and models come in through the nodes'
object, never through the state.

    environment = EnvironmentClient(EnvironmentConfig(model="gpt-4o-mini"))
    graph = build_graph(agent, environment, loop=LoopConfig(max_turns=5))
    result = await graph.ainvoke({"question": "Who wrote Hamlet?"})
    result["answer"], result["status"], result["turns"], result["usage"]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.graph import END, START, StateGraph

from prompt_r1.agents.base import AgentBackend, AgentRequest
from prompt_r1.clients.environment import Environment, as_environment
from prompt_r1.core.config import LoopConfig, warn_loop_keywords
from prompt_r1.loop.graph_runnables import inline, sync_and_async
from prompt_r1.loop.nodes import LoopNodes
from prompt_r1.loop.state import (
    STATUSES,
    EpisodeInput,
    EpisodeState,
    begin_episode,
    every_input_key,
    finish_reason,
    trajectory_of,
)

__all__ = [
    "STATUSES",
    "EpisodeInput",
    "EpisodeState",
    "build_graph",
    "finish_reason",
    "mermaid",
    "trajectory_of",
]


# build_graph's former loop keywords (deprecated: loop=LoopConfig(...)) → LoopConfig's fields.
_LOOP_KEYWORDS = {
    "max_turns": "max_turns",
    "force_final_answer": "force_final_answer",
    "max_new_tokens": "max_turn_tokens",
    "max_total_tokens": "max_total_tokens",
    "protocol": "protocol",
}
_UNSET: Any = object()  # a keyword not passed (None is a value some of them take)


def build_graph(
    agent: AgentBackend,
    environment: Environment | BaseChatModel,
    *,
    loop: LoopConfig | None = None,
    token_exact: bool | None = None,
    checkpointer: Any = None,
    name: str = "prompt_r1",
    max_turns: int = _UNSET,
    force_final_answer: bool | None = _UNSET,
    max_new_tokens: int | None = _UNSET,
    max_total_tokens: int = _UNSET,
    protocol: str = _UNSET,
):
    """Compile the loop. The result is a LangChain Runnable (`invoke`, `ainvoke`, `abatch`, `astream`) and can be
    added as a node of a parent graph whose state has `question` (and optionally `golden_answers`).

    loop: the loop's settings (prompt_r1.LoopConfig: max_turns, force_final_answer, max_turn_tokens,
        max_total_tokens, protocol); None: LoopConfig()'s defaults.
    token_exact: keep token ids (default: whenever the backend has a tokenizer).
    checkpointer: a LangGraph checkpointer (threads): each input on a thread is a new episode, and `invoke(None,
        thread)` resumes an interrupted one (graphs/README.md, "Threads").

    Deprecated, kept for one release: the loop's settings as keywords (max_turns, force_final_answer,
    max_new_tokens for LoopConfig's max_turn_tokens, max_total_tokens, protocol); they warn, and build the
    LoopConfig they name.
    """
    passed = dict(
        max_turns=max_turns,
        force_final_answer=force_final_answer,
        max_new_tokens=max_new_tokens,
        max_total_tokens=max_total_tokens,
        protocol=protocol,
    )
    given = {k: v for k, v in passed.items() if v is not _UNSET}
    if given and loop is not None:
        raise ValueError(f"give loop= or the loop's keywords ({', '.join(given)}), not both")
    if given:
        warn_loop_keywords("build_graph", given, _LOOP_KEYWORDS)
        loop = LoopConfig(**{_LOOP_KEYWORDS[k]: v for k, v in given.items()})
    loop = loop or LoopConfig()
    environment = as_environment(environment)
    if token_exact is None:
        token_exact = getattr(agent, "tokenizer", None) is not None
    nodes = LoopNodes(agent, environment, loop, token_exact=token_exact)

    builder = StateGraph(EpisodeState, input_schema=EpisodeInput)
    builder.add_node("begin", inline(begin_episode, "begin"))
    builder.add_node("agent", sync_and_async(nodes.agent_node, "agent"))
    builder.add_node("environment", sync_and_async(nodes.environment_node, "environment"))
    builder.add_node("final_answer", sync_and_async(nodes.final_answer_node, "final_answer"))
    builder.add_node("finalize", sync_and_async(nodes.finalize_node, "finalize"))
    builder.add_edge(START, "begin")
    builder.add_edge("begin", "agent")
    # The routes named, since a wrapped router hides its return type: the drawing shows every edge it can take.
    builder.add_conditional_edges(
        "agent",
        inline(nodes.route_after_agent, "route_after_agent", trace=False),
        ["environment", "final_answer", "finalize", END],
    )
    after_environment = inline(nodes.route_after_environment, "route_after_environment", trace=False)
    builder.add_conditional_edges("environment", after_environment, ["agent", "finalize"])
    builder.add_conditional_edges("final_answer", after_environment, ["agent", "finalize"])
    builder.add_edge("finalize", END)
    graph = builder.compile(checkpointer=checkpointer, name=name)
    # START writes only the keys an input holds; on a thread a key left out would keep the last episode's value.
    # Its mapper (LangGraph applies a node's mapper to the value it reads) writes each of the input's keys.
    graph.nodes[START].mapper = every_input_key
    return graph


def mermaid() -> str:
    """The loop's topology as Mermaid, drawn from the compiled graph (the drawing in docs/concepts.md is this text:
    `python -m prompt_r1.loop.graph` prints it)."""
    return build_graph(_Unplayed(), _Unplayed()).get_graph().draw_mermaid()


class _Unplayed:
    """Agent and environment for drawing the topology, which calls neither (the loop imports no test double)."""

    tokenizer = None

    async def generate(self, request: AgentRequest) -> Any:
        raise NotImplementedError("drawn, not played")

    async def respond(self, prompt: str, history: Sequence[tuple[str, str]], **kwargs: Any) -> Any:
        raise NotImplementedError("drawn, not played")


if __name__ == "__main__":
    print(mermaid(), end="")
