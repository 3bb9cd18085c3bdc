"""The one redaction module (prompt_r1.core.redaction) on its own; every surface's use of it is tested with the surface."""

from __future__ import annotations

import json


def test_the_redactor_cuts_every_key_also_json_escaped():
    from prompt_r1.core.redaction import Redactor

    redact = Redactor(["sk-short", "sk-short-and-longer", 'odd"key\\1', "EMPTY", ""])
    assert redact("a sk-short-and-longer b sk-short c EMPTY") == "a *** b *** c EMPTY"
    line = redact.json_line({"error": 'echo: odd"key\\1 and sk-short'})
    assert json.loads(line) == {"error": "echo: *** and ***"}


def test_an_exception_is_cut_along_every_path_a_traceback_prints():
    import traceback

    from prompt_r1.core.redaction import Redactor

    key = "sk-chain-6f1e2d3c4b5a"
    redact = Redactor([key])

    class SDKError(Exception):
        def __init__(self, message: str, body: dict) -> None:
            super().__init__(message)
            self.message, self.body = message, body

    inner = SDKError(f"401 {key}", {"error": {"param": f"Bearer {key}", key: [key]}})
    context = ValueError(f"context {key}")
    context.add_note(f"note {key}")
    group = ExceptionGroup("group", [KeyError(key), inner])
    try:
        try:
            try:
                raise context
            except ValueError:
                raise group  # noqa: B904 (its context is the point: a traceback prints it too)
        except ExceptionGroup:
            raise RuntimeError(f"outer {key}") from group
    except RuntimeError as caught:
        outer = caught
    redact.exception(outer)
    text = "".join(traceback.format_exception(outer))
    assert key not in text and "outer ***" in text and "note ***" in text and "context ***" in text
    assert inner.body == {"error": {"param": "Bearer ***", "***": ["***"]}} and inner.message == "401 ***"


def test_the_rate_store_password_and_a_chat_models_keys_are_registered(monkeypatch):
    from langchain_openai import ChatOpenAI

    from prompt_r1.core import redaction
    from prompt_r1.core.config import RATE_STORE_PASSWORD_ENV, rate_store_password

    monkeypatch.setenv(RATE_STORE_PASSWORD_ENV, "store-pass-4c3b2a19")
    assert rate_store_password() == "store-pass-4c3b2a19"
    redaction.register_from(ChatOpenAI(model="m", api_key="sk-model-field-8d7e6f5a", base_url="http://x"))
    assert redaction.redact("auth store-pass-4c3b2a19 sk-model-field-8d7e6f5a") == "auth *** ***"
