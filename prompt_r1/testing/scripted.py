"""Scripted players for tests and demos: responders (a function from a chat-completions body to a reply's text)
and in-process doubles that play them without HTTP.

    ScriptedServer({"env": echo_environment(), "agent": relay_agent()})          # over HTTP (prompt_r1.testing.servers)
    build_graph(ScriptedAgent(relay_agent()), ScriptedEnvironment(echo_environment()))   # in process

The graph's unit tests run on the in-process pair (no server, no sockets: the loop's own logic and nothing else);
whatever crosses the network (clients, retries, rate limits, served agents) is tested against `ScriptedServer`.
The in-process agent applies stop strings as a served agent's server does and puts the matched one back, as
`ServedAgent` does, so the graph sees the same turns either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from prompt_r1.agents.base import AgentOutput, AgentRequest
from prompt_r1.clients.environment import EnvironmentReply, environment_messages
from prompt_r1.core.prompts import ENVIRONMENT_SYSTEM_PROMPT

__all__ = [
    "Responder",
    "ScriptedAgent",
    "ScriptedEnvironment",
    "echo_environment",
    "max_in_window",
    "relay_agent",
    "scripted_agent",
    "scripted_turns",
]

Responder = Callable[[dict], str]


def echo_environment(prefix: str = "Response") -> Responder:
    """An environment that answers `{prefix} {n}: {prompt}`, n counting the prompts of this conversation."""

    def respond(body: dict) -> str:
        users = [m for m in body["messages"] if m["role"] == "user"]
        return f"{prefix} {len(users)}: {users[-1]['content']}"

    return respond


def scripted_agent(turns: Sequence[str]) -> Responder:
    """A served agent that writes `turns[k]` as its k-th turn (k = assistant messages already in the chat).

    Past the end of the script it repeats the last entry.
    """

    def respond(body: dict) -> str:
        k = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return turns[min(k, len(turns) - 1)]

    return respond


def scripted_turns(turns: Sequence[str]) -> Responder:
    """A served agent (chat or completions) whose k-th request, counted across the server's life, gets `turns[k]`
    (the last entry past the end): for one episode at a time, e.g. on the token-id completions path, where there
    are no chat messages to count."""
    calls = iter(range(1 << 62))

    def respond(body: dict) -> str:
        return turns[min(next(calls), len(turns) - 1)]

    return respond


def relay_agent(prompts: int = 2) -> Responder:
    """A served agent that asks the environment `prompts` times about its question, then answers with the
    environment's last response: its answers depend on every environment call, so a lost or garbled call shows.
    """
    from prompt_r1.core.prompts import extract_question

    def respond(body: dict) -> str:
        messages = body["messages"]
        k = sum(1 for m in messages if m["role"] == "assistant")
        first = messages[0]["content"]
        question = extract_question(first) or first
        if k < prompts:
            return f"<think>step {k + 1}</think><interaction_prompt>{question} / part {k + 1}</interaction_prompt>"
        last = messages[-1]["content"]
        reply = last.removeprefix("<interaction_response>").removesuffix("</interaction_response>").strip()
        return f"<think>done</think><answer>{reply}</answer>"

    return respond


def max_in_window(times: Sequence[float], window: float) -> int:
    """Largest number of timestamps inside any half-open window of `window` seconds."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while t - ordered[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


def _words(messages: Sequence[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content", "")).split()) for m in messages)


class ScriptedAgent:
    """An agent backend in process: each turn is `responder({"messages": request.messages})`, cut at the first
    stop string (kept, as `ServedAgent` keeps it); usage counts words as tokens. Text only (no tokenizer)."""

    tokenizer = None

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.requests: list[AgentRequest] = []

    async def generate(self, request: AgentRequest) -> AgentOutput:
        self.requests.append(request)
        text = self.responder({"messages": [dict(m) for m in request.messages]})
        cuts = [(text.find(s), s) for s in request.stop if s in text]
        if cuts:
            at, stop = min(cuts)
            text = text[: at + len(stop)]
        return AgentOutput(
            text=text, prompt_tokens=_words(request.messages), completion_tokens=len(text.split())
        )


class ScriptedEnvironment:
    """An environment in process (the `Environment` protocol): each call is `responder(body)` for the chat the
    client would send (system prompt, earlier prompts and responses, the prompt); usage counts words."""

    def __init__(self, responder: Responder, model: str = "env") -> None:
        self.responder, self.model_name = responder, model
        self.retries = 0
        self.bodies: list[dict] = []

    async def respond(
        self,
        prompt: str,
        history: Sequence[tuple[str, str]] = (),
        *,
        run_config: Any = None,
        system_prompt: str | None = None,
    ):
        started = time.monotonic()
        messages = [
            {"role": {"system": "system", "human": "user", "ai": "assistant"}[m.type], "content": m.content}
            for m in environment_messages(prompt, history, system_prompt or ENVIRONMENT_SYSTEM_PROMPT)
        ]
        body = {"model": self.model_name, "messages": messages}
        self.bodies.append(body)
        text = self.responder(body)
        return EnvironmentReply(
            text=text,
            input_tokens=_words(messages),
            output_tokens=len(text.split()),
            attempts=1,
            latency_s=time.monotonic() - started,
            model=self.model_name,
            endpoint="in-process",
        )
