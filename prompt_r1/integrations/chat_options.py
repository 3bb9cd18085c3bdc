"""What `PromptR1Chat` does with LangChain's standard parameters and with each call's options: each is honoured,
refused, or ignored and said to be (in `response_metadata["ignored"]`); none is dropped without a word.

- Honoured: `stop` (at construction or per call: the answer is cut before the first stop sequence, as a model
  stops there) and `streaming` (LangChain's own flag: `invoke` streams the episode's events to callbacks).
- Ignored, but accepted so that an app can swap PromptR1Chat in for another chat model, and checked like every
  number (prompt_r1.core.checks): `IGNORED`. The loop samples with its agent's and environment's own settings, its
  answer's length is the episode's, and the environment client has its own timeout and retries.
- Refused: any other keyword at construction (a typo such as `max_turn=1` is an error, not a silently kept
  default) and any other option per call (e.g. `invoke(q, model="other")`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from prompt_r1.core.checks import number

__all__ = ["IGNORED", "CallOptions", "call_options", "check_ignored"]

IGNORED: dict[str, dict[str, Any]] = {
    "temperature": {"minimum": 0, "maximum": 2},
    "max_tokens": {"integer": True, "minimum": 1},
    "timeout": {"above": 0},
    "max_retries": {"integer": True, "minimum": 0},
}


class CallOptions(NamedTuple):
    stop: list[str] | None  # the stop sequences the answer is cut at
    ignored: list[str]  # the standard parameters set, at construction or for this call, that do not apply


def check_ignored(values: Mapping[str, Any], where: str) -> list[str]:
    """The names of the ignored parameters set (not None) in `values`, each checked against its range."""
    for name, bounds in IGNORED.items():
        number(values.get(name), f"{where} {name}", none_ok=True, error=ValueError, **bounds)
    return [name for name in IGNORED if values.get(name) is not None]


def call_options(model: Any, stop: list[str] | None, kwargs: Mapping[str, Any]) -> CallOptions:
    """A call's options (see the module docstring), or a ValueError naming the one PromptR1Chat cannot take."""
    kwargs = {k: v for k, v in kwargs.items() if k != "stream"}  # LangChain's own switch, honoured by it
    unknown = sorted(set(kwargs) - set(IGNORED))
    if unknown:
        raise ValueError(
            f"PromptR1Chat takes no call option {', '.join(unknown)}: a call takes stop=[...] and LangChain's "
            f"standard parameters ({', '.join(IGNORED)}, which it ignores); the loop's settings are loop=LoopConfig(...)"
        )
    if stop is not None and (not isinstance(stop, list | tuple) or not all(isinstance(s, str) for s in stop)):
        raise ValueError(f"stop must be a list of strings, got {stop!r}")
    ignored = set(check_ignored({name: getattr(model, name) for name in IGNORED}, "PromptR1Chat"))
    ignored |= set(check_ignored(kwargs, "the call option"))
    return CallOptions(list(stop) if stop is not None else model.stop, [n for n in IGNORED if n in ignored])
