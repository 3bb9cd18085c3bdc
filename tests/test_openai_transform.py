"""The chat-completions body transform's shortcut (prompt_r1.clients.openai_transform): the SDK's own result
whenever it is taken, and the SDK's transform whenever a value or a type might need it."""

from __future__ import annotations

import asyncio
import datetime
from typing import Annotated

import openai
from openai import NOT_GIVEN
from openai._utils._transform import PropertyInfo, async_maybe_transform
from openai.types.chat import completion_create_params
from typing_extensions import TypedDict

from prompt_r1.clients.openai_transform import plain_transform, speed_up_transform

PARAMS = completion_create_params.CompletionCreateParamsNonStreaming
omit = getattr(openai, "omit", NOT_GIVEN)  # the SDK's newer omitted-value marker, where it has one


class _Compaction(TypedDict, total=False):
    async_: Annotated[bool, PropertyInfo(alias="async")]


class _Agent(TypedDict, total=False):
    compaction: _Compaction


class _Target(
    TypedDict, total=False
):  # a parameter type with an alias three TypedDicts down, as the SDK writes them
    agent: _Agent


BODY = {
    "messages": [
        {"role": "system", "content": "You answer."},
        {"role": "user", "content": "Which name?"},
        {"role": "assistant", "content": "Ada"},
        {"role": "user", "content": [{"type": "text", "text": "And now?"}]},
    ],
    "model": "env",
    "max_tokens": 64,
    "temperature": 0.7,
    "stream": False,
    "stop": None,
    "n": omit,
    "seed": NOT_GIVEN,
    "metadata": {"run": "x"},
}


def _sdk(data, expected_type):
    return asyncio.run(async_maybe_transform(data, expected_type))


def test_a_plain_chat_body_is_what_the_sdk_makes_of_it():
    assert plain_transform(BODY, PARAMS) == _sdk(BODY, PARAMS)
    assert "n" not in plain_transform(BODY, PARAMS) and "seed" not in plain_transform(BODY, PARAMS)


def test_values_the_sdk_would_change_are_left_to_it():
    for value in (("a", "b"), datetime.date(2026, 1, 1), b"bytes", {"nested": omit}, [NOT_GIVEN]):
        assert plain_transform({**BODY, "stop": value}, PARAMS) is None
    assert plain_transform([BODY], PARAMS) is None


def test_types_with_an_alias_anywhere_are_left_to_the_sdk():
    # `async_` is renamed to `async` three TypedDicts down.
    body = {"agent": {"compaction": {"async_": True}}}
    assert plain_transform(body, _Target) is None
    assert _sdk(body, _Target) == {"agent": {"compaction": {"async": True}}}


def test_the_chat_completions_module_checks_first_once_installed():
    from openai.resources.chat.completions import completions

    speed_up_transform()
    installed = completions.async_maybe_transform
    speed_up_transform()  # idempotent
    assert completions.async_maybe_transform is installed
    assert asyncio.run(installed(BODY, PARAMS)) == _sdk(BODY, PARAMS)
    tupled = {**BODY, "stop": ("a", "b")}
    assert asyncio.run(installed(tupled, PARAMS)) == _sdk(tupled, PARAMS)
