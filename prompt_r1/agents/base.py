"""The one interface every agent backend implements, and the request/response types it exchanges."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from prompt_r1.core.protocol import STOP_SEQUENCES

__all__ = ["AgentBackend", "AgentOutput", "AgentRequest"]


@dataclass(frozen=True)
class AgentRequest:
    """One agent generation.

    messages: the agent's chat so far (user question, its earlier turns, `<interaction_response>` messages).
    prompt_ids: for backends with a tokenizer, the exact token ids to continue from; when given, the backend
        must condition on these ids and not re-render `messages` (token-exact trajectories).
    """

    messages: list[dict[str, str]]
    prompt_ids: list[int] | None = None
    max_new_tokens: int | None = None  # None: the backend's configured default
    stop: tuple[str, ...] = STOP_SEQUENCES
    turn: int | None = None  # the episode's turn this generation writes (0: the first), for the step's timing


@dataclass
class AgentOutput:
    """What one generation produced. token_ids/logprobs are None where the backend cannot see tokens."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: Literal["stop", "length"] = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class AgentBackend(Protocol):
    """An async text (and, where possible, token) generator for the agent.

    `tokenizer` is the backend's Hugging Face tokenizer when it can generate from token ids (then the graph
    keeps a token-exact trajectory), or None for text-only backends such as a served endpoint.
    """

    tokenizer: Any | None

    async def generate(self, request: AgentRequest) -> AgentOutput: ...
