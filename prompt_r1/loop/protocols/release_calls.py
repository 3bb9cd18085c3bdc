"""The JSON in the release's stream, as the release writes and reads it (`--protocol release`; every rule of
the protocol, and the release file it comes from: prompt_r1.loop.protocols.release).

- The agent's call: the first `<interaction_prompt>` of a turn, checked as `tool/envs/nous.py` checks it
  (`read_call`, `release_turn`): a call of the one tool, `PROMPT_TOOL`, with a string `arguments.prompt`, else
  the error text the release answers instead.
- The environment's reply, sent back as `{"results": [reply]}` (`reply_content`,
  `tool/tools/LLM_tool.py`).
- The environment's history: each turn's prompt and reply as `llm_agent/generation.py` extracts them back out of
  the stream (`environment_history`, `history_reply`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from prompt_r1.core.protocol import AgentTurn

__all__ = [
    "PROMPT_TOOL",
    "ReleaseCall",
    "environment_history",
    "history_reply",
    "read_call",
    "release_turn",
    "reply_content",
]

# tool/tools/LLM_tool.py: the one tool, as tool/base.py's `tool_description` presents it to the chat template.
PROMPT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "prompt",
        "description": "Give an explanation of the question in detail.",
        "parameters": {
            "type": "object",
            "properties": {"prompt": {"type": "string", "description": "Give question and its explanation"}},
            "required": ["prompt"],
        },
    },
}

_CALL = re.compile(r"<interaction_prompt>(.*?)</interaction_prompt>", re.DOTALL)
_RESPONSE = re.compile(r"<interaction_response>(.*?)</interaction_response>", re.DOTALL)


@dataclass(frozen=True)
class ReleaseCall:
    """The first `<interaction_prompt>` of a turn as the release reads it: the prompt to send, or the error text
    answered instead; `history_prompt` is what the environment's history records for the turn (the release takes
    it from any call block of the turn whose arguments hold a `prompt`, whether or not the call was valid)."""

    prompt: str | None
    error: str | None
    history_prompt: str | None


def read_call(text: str) -> ReleaseCall | None:
    """The call in one agent turn (its text without special tokens), or None when it has none: the episode ends.

    >>> read_call('<interaction_prompt>{"name": "prompt", "arguments": {"prompt": "Why?"}}</interaction_prompt>')
    ReleaseCall(prompt='Why?', error=None, history_prompt='Why?')
    >>> read_call("<interaction_prompt>Why?</interaction_prompt>").error
    'Error: JSONDecodeError'
    """
    blocks = _CALL.findall(text)
    if not blocks:
        return None
    return ReleaseCall(*_check_call(blocks[0]), history_prompt=_history_prompt(blocks))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # the release catches JSONDecodeError, a ValueError
        return _INVALID


_INVALID = object()


def _check_call(block: str) -> tuple[str | None, str | None]:
    """nous.py's checks, in its order. `null` is a JSONDecodeError there (its parser stands None for a failed
    parse); a JSON string or list meets the `in` checks as Python's `in` does. Where the release itself would
    crash (a number, a string or list holding both "name" and "arguments", an unhashable name), the turn gets
    "Error: ToolNotFoundError"."""
    call = _loads(block)
    if call is _INVALID or call is None:
        return None, "Error: JSONDecodeError"
    if not isinstance(call, dict | str | list):
        return None, "Error: ToolNotFoundError"
    if "name" not in call:
        return None, "Error: No tool name"
    if "arguments" not in call:
        return None, "Error: No tool arguments"
    if not isinstance(call, dict):
        return None, "Error: ToolNotFoundError"
    if call["name"] != PROMPT_TOOL["function"]["name"]:
        return None, "Error: ToolNotFoundError"
    arguments = call["arguments"]
    # tool/base.py validates with the tool's JSON schema: an object whose `prompt` is a string.
    if not isinstance(arguments, dict) or not isinstance(arguments.get("prompt"), str):
        return None, "Error: Invalid tool arguments"
    return arguments["prompt"], None


def _history_prompt(blocks: list[str]) -> str | None:
    """generation.py's `_extract_tool_call_prompt`: the first block whose JSON has `arguments.prompt`. A prompt
    that is not a string is left out: the release would send it and the API would refuse the call."""
    for block in blocks:
        call = _loads(block)
        if (
            isinstance(call, dict)
            and isinstance(call.get("arguments"), dict)
            and "prompt" in call["arguments"]
        ):
            prompt = call["arguments"]["prompt"]
            return prompt if isinstance(prompt, str) and prompt else None
    return None


def release_turn(turn: AgentTurn, text: str) -> tuple[AgentTurn, dict[str, Any]]:
    """A parsed turn as the release acts on it, and the fields its record adds. A turn with a call block is a
    `prompt` turn whatever else it holds (the episode goes on); its `prompt` is the call's, or None when the call
    is answered with `call_error` instead. A turn without one ends the episode as parsed (an answer or malformed).
    Its text is the whole generation: the release cuts nothing after a closing tag, and a chat-only agent is sent
    its turns back whole."""
    call = read_call(text)
    turn = replace(turn, text=text, truncated="")
    if call is None:
        return turn, {"call_error": None, "history_prompt": None}
    defects = turn.defects + ((f"call answered with {call.error!r}",) if call.error else ())
    called = replace(
        turn,
        kind="prompt",
        prompt=call.prompt,
        answer=None,
        defects=defects,
        prompt_format="tool_call" if call.error is None else turn.prompt_format,
    )
    return called, {"call_error": call.error, "history_prompt": call.history_prompt}


def reply_content(reply: str) -> str:
    """What a successful call returns (LLM_tool.py): the stripped reply, JSON-encoded with ASCII escapes."""
    return json.dumps({"results": [reply.strip()]})


def history_reply(body: str) -> str:
    """The reply the environment's history keeps for a turn (generation.py, `_extract_tool_response_content`):
    `results[0]` of the JSON in the response tags, or "" when it does not parse, which is the case for an error
    text and for a reply cut at 2,048 characters."""
    match = _RESPONSE.search(body)
    data = _loads(match.group(1).strip()) if match else _INVALID
    if isinstance(data, dict) and isinstance(data.get("results"), list) and data["results"]:
        first = data["results"][0]
        return first if isinstance(first, str) else ""
    return ""


def environment_history(turns: list[dict]) -> list[tuple[str, str]]:
    """The (prompt, reply) pairs the environment sees before a call, from the episode's earlier turn records."""
    return [
        (t["history_prompt"], history_reply(t.get("observation") or ""))
        for t in turns
        if t.get("history_prompt")
    ]
