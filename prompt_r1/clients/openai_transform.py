"""The OpenAI SDK's request-body transform for chat completions, without its cost where it would change nothing.

Before sending, `AsyncCompletions.create` passes the body through `openai._utils._transform`: for every value it
walks the parameter's TypedDict, and for a union (each message is a union of six message types) it walks every
member, renaming keys that carry a `PropertyInfo(alias=...)`, formatting dates and files, dumping pydantic models,
turning iterables into lists, and dropping omitted (`NOT_GIVEN` / `omit`) values. For a chat request of plain JSON
values none of that applies, yet the walk cost 0.4 ms of CPU per environment call (a fifth of the call's CPU in
evals/bench/step_overhead.py). `speed_up_transform()` puts a check before it: when the parameter types hold no
`PropertyInfo` anywhere (worked out once per type) and every value given is plain JSON (dict, list, str, int,
float, bool, None), the result is the body less its omitted values, which is what the walk returns; anything else
goes through the SDK's own transform.
"""

from __future__ import annotations

import functools
from typing import Any, get_args, get_origin

__all__ = ["plain_transform", "speed_up_transform"]

_PLAIN = (str, int, float, bool, type(None))


def _plain_json(value: Any) -> bool:
    kind = type(value)
    if kind in _PLAIN:
        return True
    if kind is dict:
        return all(type(k) is str and _plain_json(v) for k, v in value.items())
    if kind is list:
        return all(_plain_json(v) for v in value)
    return (
        False  # a tuple, a generator, a model, a date, a file, an omitted value: the SDK's transform decides
    )


@functools.lru_cache(maxsize=64)
def _no_property_info(expected_type: Any) -> bool:
    """Whether no `PropertyInfo` (alias, format, discriminator) annotates anything reachable from the type."""
    from openai._utils._transform import PropertyInfo, get_type_hints
    from typing_extensions import is_typeddict

    seen: set[int] = set()
    pending = [expected_type]
    while pending:
        tp = pending.pop()
        if id(tp) in seen:
            continue
        seen.add(id(tp))
        if any(isinstance(m, PropertyInfo) for m in getattr(tp, "__metadata__", ())):
            return False
        if is_typeddict(tp):
            pending += get_type_hints(tp, include_extras=True).values()
        elif get_origin(tp) is not None:
            pending += [a for a in get_args(tp) if not isinstance(a, str | int | float | bool | type(None))]
    return True


def plain_transform(data: Any, expected_type: Any) -> dict | None:
    """What the SDK's transform returns for `data`, when it can be told without the walk; else None."""
    from openai._utils import is_given

    if type(data) is not dict:
        return None
    given = {k: v for k, v in data.items() if is_given(v)}
    if not _plain_json(given) or not _no_property_info(expected_type):
        return None
    return given


def speed_up_transform() -> None:
    """Check for a plain body before the chat-completions module's `async_maybe_transform` (idempotent; an SDK
    without that function, or without any of the internals the check reads, is left alone)."""
    try:
        from openai._utils import is_given  # noqa: F401 - the check reads these at call time
        from openai._utils._transform import PropertyInfo, get_type_hints  # noqa: F401
        from openai.resources.chat.completions import completions
        from typing_extensions import is_typeddict  # noqa: F401
    except ImportError:  # pragma: no cover - an SDK laid out otherwise
        return
    original = getattr(completions, "async_maybe_transform", None)
    if original is None or getattr(original, "_prompt_r1_plain", False):
        return

    async def async_maybe_transform(data: object, expected_type: object) -> Any:
        plain = plain_transform(data, expected_type)
        return plain if plain is not None else await original(data, expected_type)

    async_maybe_transform._prompt_r1_plain = True  # type: ignore[attr-defined]
    completions.async_maybe_transform = async_maybe_transform
