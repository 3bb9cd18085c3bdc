"""The examples in the modules' docstrings run and say what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "prompt_r1.protocol",
        "prompt_r1.prompts",
        "prompt_r1.metrics",
        "prompt_r1.rewards",
        "prompt_r1.data",
        "prompt_r1.events",
        "prompt_r1.chat_model",
        "prompt_r1.config",
    ],
)
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
