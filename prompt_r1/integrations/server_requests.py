"""What `prompt-r1 serve` does with each field of a chat-completions request body: every field is honoured,
refused with a 400 naming it, or ignored and said to be (in the response's `prompt_r1.ignored`); none is dropped
without a word, and a field the server does not know is refused, as OpenAI refuses one.

Honoured: `model`, `messages` (the last user message is the question), `stream`, `stream_options.include_usage`,
`n` (1 only), `stop` (the answer is cut before the first stop sequence, as a model stops there), and two
extensions, `max_turns` (0 to 20) and `prompt_r1_trajectory`.
Refused unless left unset or set to what every answer already is: `tools`, `functions` (none),
`tool_choice`/`function_call` ("none"/"auto"), `response_format` ({"type": "text"}), `logprobs` (false),
`top_logprobs`, `modalities` (["text"]), `audio`, `prediction`.
Ignored, each still checked for its type and range: `IGNORED`. The loop samples with the agent's and the
environment's own settings (the server's flags), and its answer's length is the episode's: a client's sampling
knobs and token cap do not apply to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prompt_r1.core.checks import number
from prompt_r1.core.errors import ConfigError, RequestError
from prompt_r1.runs.episode import question_from_messages

__all__ = ["IGNORED", "ChatRequest", "RequestError", "read_request"]

MAX_STOP = 4  # as OpenAI: at most four stop sequences
MAX_TOKENS = 2**31 - 1  # beyond any context window; larger values are a client's mistake, e.g. 1e15
# Ignored fields → the range each is checked against (None: its type is checked below).
IGNORED: dict[str, dict[str, Any] | None] = {
    "temperature": {"minimum": 0, "maximum": 2},
    "top_p": {"minimum": 0, "maximum": 1},
    "presence_penalty": {"minimum": -2, "maximum": 2},
    "frequency_penalty": {"minimum": -2, "maximum": 2},
    "seed": {"integer": True},
    "max_tokens": {"integer": True, "minimum": 1, "maximum": MAX_TOKENS},
    "max_completion_tokens": {"integer": True, "minimum": 1, "maximum": MAX_TOKENS},
    "user": None,
    "metadata": None,
    "store": None,
    "logit_bias": None,
    "parallel_tool_calls": None,
    "service_tier": None,
    "reasoning_effort": None,
}
_IGNORED_TYPES = {"user": str, "metadata": dict, "store": bool, "logit_bias": dict, "parallel_tool_calls": bool,
                  "service_tier": str, "reasoning_effort": str}  # fmt: skip
_HONOURED = {
    "model",
    "messages",
    "stream",
    "stream_options",
    "n",
    "stop",
    "max_turns",
    "prompt_r1_trajectory",
}
# Refused unless unset or equal to one of these values.
_ONLY = {
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none", "auto"),
    "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},),
    "logprobs": (False,),
    "top_logprobs": (),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
}
_WHY = {
    "tools": "Prompt-R1 does not make tool calls; send the request without tools",
    "functions": "Prompt-R1 does not make function calls; send the request without functions",
    "tool_choice": 'Prompt-R1 does not make tool calls; `tool_choice` can only be "none" or "auto" (with no tools)',
    "function_call": 'Prompt-R1 does not make function calls; `function_call` can only be "none" or "auto"',
    "response_format": 'Prompt-R1 answers in free text: `response_format` can only be {"type": "text"}; for JSON, '
    "ask for it in the question and parse the answer",
    "logprobs": "Prompt-R1 returns no log-probabilities of its answer (it is written by two models over several "
    "turns); with `prompt_r1_trajectory: true` the response carries the agent's own token log-probabilities",
    "top_logprobs": "Prompt-R1 returns no log-probabilities of its answer",
    "modalities": 'Prompt-R1 answers in text only: `modalities` can only be ["text"]',
    "audio": "Prompt-R1 answers in text only",
    "prediction": "Prompt-R1 does not take predicted outputs",
}


@dataclass(frozen=True)
class ChatRequest:
    """A chat-completions body the server accepted."""

    question: str
    stream: bool = False
    include_usage: bool = False
    max_turns: int | None = None
    stop: tuple[str, ...] = ()
    trajectory: bool = False
    ignored: tuple[str, ...] = ()  # the ignored fields the client set, for the response to name


def _number(body: dict[str, Any], key: str, **bounds: Any) -> Any:
    value = body.get(key)
    # JSON has integers: 2.0 for a count is a client's mistake (OpenAI refuses it too), not a number to round.
    if bounds.get("integer") and isinstance(value, float):
        raise RequestError(400, f"`{key}` must be an integer, got {value}", param=key)
    try:
        return number(value, f"`{key}`", none_ok=True, **bounds)
    except ConfigError as exc:
        raise RequestError(400, str(exc), param=key) from None


def _question(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "`messages` must be a non-empty list of chat messages", param="messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise RequestError(400, "every message must be an object with a string `role`", param="messages")
    try:
        return question_from_messages(messages)
    except ValueError as exc:
        raise RequestError(400, str(exc), param="messages") from None


def _stop(value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if value is None:
        return ()
    if (
        not isinstance(stops, list)
        or not all(isinstance(s, str) and s for s in stops)
        or len(stops) > MAX_STOP
    ):
        raise RequestError(
            400, f"`stop` must be a non-empty string or a list of at most {MAX_STOP} of them", param="stop"
        )
    return tuple(stops)


def _flag(body: dict[str, Any], key: str, param: str | None = None) -> bool:
    """A boolean field (null or absent: false). Only a JSON boolean: "yes", "false" and 1 are refused, since
    Python's truth would read "false" as true."""
    value = False if body.get(key) is None else body[key]
    if not isinstance(value, bool):
        param = param or key
        raise RequestError(400, f"`{param}` must be true or false, got {json.dumps(value)[:40]}", param=param)
    return value


def read_request(body: Any, model_name: str) -> ChatRequest:
    """The request in a chat-completions body, or a RequestError naming the field at fault (see the module
    docstring). null is what several clients send for a field they leave unset: the default, never an error."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    unknown = sorted(set(body) - _HONOURED - set(_ONLY) - set(IGNORED))
    if unknown:
        raise RequestError(400, f"unrecognized request argument(s): {', '.join(unknown)}", param=unknown[0])
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, "`model` must be a string", param="model")
    if model is not None and model != model_name:
        raise RequestError(404, f"model {model!r} is not served here; use {model_name!r}", param="model",
                           code="model_not_found")  # fmt: skip
    for key, allowed in _ONLY.items():
        if body.get(key) is not None and body[key] not in allowed:
            raise RequestError(400, _WHY[key], param=key)
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n != 1):
        raise RequestError(400, "only n=1 is supported", param="n")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not stream:  # as OpenAI answers it
        raise RequestError(
            400, "`stream_options` is only allowed when `stream` is true", param="stream_options"
        )
    if not isinstance(options or {}, dict):
        raise RequestError(400, "`stream_options` must be an object", param="stream_options")
    ignored = []
    for key, bounds in IGNORED.items():
        if body.get(key) is None:
            continue
        if bounds is not None:
            _number(body, key, **bounds)
        elif not isinstance(body[key], _IGNORED_TYPES[key]):
            raise RequestError(400, f"`{key}` must be a {_IGNORED_TYPES[key].__name__}", param=key)
        ignored.append(key)
    return ChatRequest(
        question=_question(body),
        stream=stream,
        include_usage=_flag(options or {}, "include_usage", "stream_options.include_usage"),
        max_turns=_number(body, "max_turns", integer=True, minimum=0, maximum=20),
        stop=_stop(body.get("stop")),
        trajectory=_flag(body, "prompt_r1_trajectory"),
        ignored=tuple(ignored),
    )
