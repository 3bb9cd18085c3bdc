"""The examples in the modules' docstrings run and say what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "prompt_r1.core.protocol",
        "prompt_r1.loop.protocols.release_calls",
        "prompt_r1.core.prompts",
        "prompt_r1.scoring.metrics",
        "prompt_r1.scoring.rewards",
        "prompt_r1.data.datasets",
        "prompt_r1.core.events",
        "prompt_r1.integrations.chat_model",
        "prompt_r1.core.config",
        "prompt_r1.clients.shared_limit",
        "prompt_r1.testing.rate_limit_simulator",
        "prompt_r1.core.hashing",
    ],
)
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
