"""LangChain's standard tests of a chat model (`langchain-tests`), run on PromptR1Chat in two configurations: the
README's, with `environment=ChatOpenAI(...)`, and an `EnvironmentClient`. Both talk to a scripted OpenAI-compatible
server on 127.0.0.1 (a served agent that relays the question, an environment that echoes it), so the episodes are
real HTTP calls and take milliseconds.

The features PromptR1Chat does not have are declared off through the suites' own properties: it makes no tool
calls and gives no structured output (it answers in text), takes text only, and serves one model (no per-call
`model`). `standard_chat_model_params` leaves out `api_key`, which ChatModelUnitTests adds: PromptR1Chat has no
key of its own (its environment holds one) and refuses keywords it does not know.
"""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from prompt_r1 import PromptR1Chat
from prompt_r1.agents.served import ServedAgent
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.core.config import AgentConfig, EnvironmentConfig
from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent

_SERVER: dict[str, ScriptedServer] = {}


@pytest.fixture(scope="module", autouse=True)
def scripted_server():
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server:
        _SERVER["server"] = server
        yield server
    _SERVER.clear()


def _params(environment: str) -> dict:
    url = _SERVER["server"].base_url
    agent = ServedAgent(AgentConfig(model="agent", base_url=url), api_key="k")
    if environment == "chat_openai":
        env = ChatOpenAI(model="env", base_url=url, api_key="k", max_retries=0)
    else:
        env = EnvironmentClient(EnvironmentConfig(model="env", base_url=url), api_key="k")
    return {"agent": agent, "environment": env}


class _Declared:
    """What PromptR1Chat is, for both suites."""

    environment = "chat_openai"

    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return PromptR1Chat

    @property
    def chat_model_params(self) -> dict:
        return _params(self.environment)

    @property
    def standard_chat_model_params(self) -> dict:
        return {"temperature": 0, "max_tokens": 100, "timeout": 60, "stop": [], "max_retries": 2}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_tool_choice(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def supports_model_override(self) -> bool:
        return False

    @property
    def returns_usage_metadata(self) -> bool:
        return True


class TestPromptR1ChatUnit(_Declared, ChatModelUnitTests):
    pass


class TestPromptR1ChatWithChatOpenAI(_Declared, ChatModelIntegrationTests):
    environment = "chat_openai"


class TestPromptR1ChatWithEnvironmentClient(_Declared, ChatModelIntegrationTests):
    environment = "client"


# ---- what the standard suites do not check ----------------------------------------------------------------------


def test_a_chat_openai_environment_serves_sync_and_async_calls_in_one_process(scripted_server):
    """invoke (the background loop), then asyncio.run(ainvoke) twice (two new loops, each closed after), then
    batch and invoke again: each loop gets its own copy of the ChatOpenAI, so none meets a client bound to another
    loop ("bound to a different event loop") or to a closed one ("Event loop is closed")."""
    chat = PromptR1Chat(**_params("chat_openai"))
    answers = [chat.invoke("What is A?").content]
    answers += [asyncio.run(chat.ainvoke(q)).content for q in ("What is B?", "What is C?")]
    answers += [m.content for m in chat.batch(["What is D?", "What is E?"])]
    answers.append(chat.invoke("What is F?").content)
    assert answers == [f"Response 2: What is {x}? / part 2" for x in "ABCDEF"]


def test_unknown_keywords_and_call_options_are_refused_and_ignored_ones_are_named(scripted_server):
    params = _params("chat_openai")
    with pytest.raises(ValueError, match="max_turn"):
        PromptR1Chat(**params, max_turn=1)
    with pytest.raises(ValueError, match="temperature must be a finite number ≥ 0 and ≤ 2, got nan"):
        PromptR1Chat(**params, temperature=float("nan"))
    chat = PromptR1Chat(**params, temperature=0.2)
    with pytest.raises(ValueError, match="no call option model"):
        chat.invoke("What is A?", model="other")
    message = chat.invoke("What is A?", max_tokens=5)
    assert message.response_metadata["ignored"] == ["temperature", "max_tokens"]
    assert PromptR1Chat(**params).invoke("What is A?").response_metadata["ignored"] == []


@pytest.mark.parametrize("how", ["call", "constructor", "stream"])
def test_stop_is_honoured_on_the_answer(scripted_server, how):
    params = _params("client")
    if how == "constructor":
        content = PromptR1Chat(**params, stop=["/"]).invoke("What is A?").content
    elif how == "stream":
        chunks = list(PromptR1Chat(**params).stream("What is A?", stop=["/", "?"]))
        content = "".join(c.content for c in chunks)
    else:
        content = PromptR1Chat(**params).invoke("What is A?", stop=["/"]).content
    assert content == "Response 2: What is A" + ("" if how == "stream" else "? ")
