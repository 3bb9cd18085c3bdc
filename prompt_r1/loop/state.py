"""The loop's state: what one episode holds as it runs (plain JSON), its reducers, and how a new input starts it.

The state checkpoints, streams and crosses process boundaries as it is: question, turn records, usage, status,
and for backends with a tokenizer the token-exact trajectory. Clients and models never enter it.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from langgraph.types import Overwrite

__all__ = [
    "STATUSES",
    "EpisodeInput",
    "EpisodeState",
    "begin_episode",
    "every_input_key",
    "finish_reason",
    "trajectory_of",
]

Status = Literal["answered", "max_turns", "format_error", "refused", "environment_error", "context_overflow"]
STATUSES: tuple[str, ...] = (
    "answered",
    "max_turns",
    "format_error",
    "refused",  # the environment's content filter or model refused a prompt: an outcome, not retried
    "environment_error",
    "context_overflow",
)


TRAJECTORY_KEYS: tuple[str, ...] = ("prompt_ids", "completion_ids", "env_mask", "logprobs")


def trajectory_of(state: dict) -> dict | None:
    """The token ids the agent read and wrote, with the environment mask and log-probabilities, or None for an
    episode without them (a text-only backend leaves the id lists empty and no prompt ids)."""
    return {k: state.get(k) for k in TRAJECTORY_KEYS} if state.get("prompt_ids") else None


def finish_reason(status: str | None) -> str:
    """An episode's status as an OpenAI `finish_reason`, for the surfaces that speak OpenAI's API."""
    if status == "refused":  # OpenAI's own word for a reply a content filter withheld
        return "content_filter"
    return "length" if status in ("max_turns", "context_overflow") else "stop"


def merge_turns(left: list[dict] | None, right: list[dict] | None) -> list[dict]:
    """Reducer for `turns`: a record whose `index` exists updates that turn, any other is appended."""
    merged = [dict(t) for t in (left or [])]
    for update in right or []:
        index = update["index"]
        if index < len(merged):
            merged[index] = {**merged[index], **update}
        else:
            merged.append(dict(update))
    return merged


def add_usage(left: dict | None, right: dict | None) -> dict:
    """Reducer for `usage`: counters add up key by key."""
    total = dict(left or {})
    for key, value in (right or {}).items():
        total[key] = total.get(key, 0) + value
    return total


class EpisodeInput(TypedDict):
    question: str
    golden_answers: NotRequired[list[str]]


class EpisodeState(TypedDict, total=False):
    question: str
    golden_answers: list[str]
    # One record per agent turn: think, prompt or answer, defects, then the response it got (see protocol.py).
    turns: Annotated[list[dict], merge_turns]
    usage: Annotated[dict, add_usage]
    final_request_sent: bool
    # Set by a node that ends the episode early (environment_error, context_overflow); finalize fills in the rest.
    status: Status | None
    answer: str | None
    error: str | None
    # Token-exact trajectory, kept when the agent backend has a tokenizer. completion_ids holds the agent's
    # sampled ids (env_mask 1, with their logprobs) and the rendered environment turns (env_mask 0, logprob 0).
    prompt_ids: list[int]
    completion_ids: Annotated[list[int], operator.add]
    logprobs: Annotated[list[float], operator.add]
    env_mask: Annotated[list[int], operator.add]


# What an episode starts from: on a thread (a checkpointer), whatever the previous episode left is replaced, the
# lists and counters that grow through reducers included (Overwrite bypasses them).
FRESH: dict[str, Any] = {
    "turns": Overwrite([]),
    "usage": Overwrite({}),
    "final_request_sent": False,
    "status": None,
    "answer": None,
    "error": None,
    "prompt_ids": [],
    "completion_ids": Overwrite([]),
    "logprobs": Overwrite([]),
    "env_mask": Overwrite([]),
}


def every_input_key(value: Any) -> Any:
    """A new input as the graph's START writes it: each of EpisodeInput's keys, None for one not given.

    LangGraph writes only the keys an input holds, so on a thread a key the new input leaves out keeps the last
    episode's value, and no node can tell "not given" from "given the same again" (issue 51: a second question
    whose golden answers equalled the first's lost them). Written as None, a key left out is dropped and one
    given is kept, whatever the thread held. Anything else (a Command, None to resume) passes unchanged."""
    if isinstance(value, dict) and "question" in value:
        return {**dict.fromkeys(EpisodeInput.__annotations__), **value}
    return value


def begin_episode(state: EpisodeState) -> dict:
    """A new input starts a new episode. Without a checkpointer the state is fresh already; on a thread that has
    run an episode (LangGraph Studio, a chat UI, `langgraph dev` reuse threads) the earlier episode's turns,
    usage, status and trajectory would otherwise carry into this one: the agent would see the earlier question's
    turns and answer from them. The question and golden answers are the input's own (every_input_key writes
    both). Resuming an interrupted episode (input None) never passes here: LangGraph continues from its last
    step."""
    if not state.get("turns") and state.get("status") is None:  # nothing ran on this thread yet
        return {}
    return dict(FRESH)
