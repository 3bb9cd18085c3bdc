"""The episode contract (prompt_r1.runs.episode): the runner's result, its stream and its failure rule, with the
in-process players of prompt_r1.testing.scripted."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import ANSWER, PROMPT
from langchain_core.messages import AIMessage, HumanMessage

from prompt_r1.core.config import LoopConfig
from prompt_r1.core.errors import AgentError
from prompt_r1.runs.episode import (
    EPISODE_RUN_NAME,
    FAILED_STATUSES,
    Episode,
    EpisodeRunner,
    question_from_messages,
)
from prompt_r1.testing.scripted import ScriptedAgent, ScriptedEnvironment, echo_environment, scripted_agent

TURNS = [PROMPT.format(k=1), ANSWER.format(a="Paris")]


def runner(turns=TURNS, **loop) -> EpisodeRunner:
    return EpisodeRunner(
        ScriptedAgent(scripted_agent(turns)), ScriptedEnvironment(echo_environment()), LoopConfig(**loop)
    )


def test_run_returns_a_frozen_episode_whose_row_is_json():
    episode = asyncio.run(runner().run("Capital of France?", id="q1", golden_answers=["Paris"]))
    assert (episode.id, episode.status, episode.answer, episode.failed) == ("q1", "answered", "Paris", False)
    assert [t["kind"] for t in episode.turns] == ["prompt", "answer"] and episode.usage["env_calls"] == 1
    assert episode.trajectory is None  # a text-only agent keeps no token ids
    row = episode.to_row()
    assert (
        next(iter(row)) == "id" and row["golden_answers"] == ["Paris"] and json.loads(json.dumps(row)) == row
    )
    with pytest.raises(AttributeError):
        episode.status = "max_turns"


def test_the_stream_gives_each_event_then_the_episode_and_run_calls_on_event():
    items = asyncio.run(_collect(runner().stream("Q?", id="s1")))
    *events, last = items
    assert isinstance(last, Episode) and last.answer == "Paris"
    assert all(isinstance(e, dict) for e in events) and events[-1]["type"] == "end"
    seen = []
    episode = asyncio.run(runner().run("Q?", on_event=seen.append))
    assert seen == events and episode.answer == "Paris"
    assert list(runner().stream_sync("Q?"))[:-1] == events


async def _collect(stream):
    return [item async for item in stream]


class Failing(ScriptedAgent):
    def __init__(self, exc: Exception) -> None:
        super().__init__(scripted_agent(TURNS))
        self.exc = exc

    async def generate(self, request):
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "status", "error"),
    [
        (AgentError("the agent endpoint is down"), "agent_error", "AgentError: the agent endpoint is down"),
        (KeyError("bug"), "internal_error", "KeyError: 'bug' (at test_episode.py:"),
    ],
)
def test_what_an_episode_raises_is_its_failure_and_the_stream_raises_it(exc, status, error):
    broken = EpisodeRunner(Failing(exc), ScriptedEnvironment(echo_environment()))
    episode = asyncio.run(broken.run("Q?", id="x"))
    assert episode.status == status and episode.failed and episode.error.startswith(error)
    assert status in FAILED_STATUSES and episode.to_row()["id"] == "x"
    assert (
        episode.exception is exc and "exception" not in episode.to_row()
    )  # kept for a traceback, never written
    with pytest.raises(type(exc)):
        asyncio.run(_collect(broken.stream("Q?")))


def test_every_episode_is_traced_under_one_name_with_its_id():
    config = runner().run_config("q7", {"dataset": "d"}, tags=["batch"])
    assert config["run_name"] == EPISODE_RUN_NAME == "prompt_r1_episode"
    assert config["tags"] == ["prompt-r1", "batch"] and config["metadata"] == {
        "episode_id": "q7",
        "dataset": "d",
    }
    assert "episode_id" not in runner().run_config(None)["metadata"]  # a caller's own id stands


def test_the_loop_config_reaches_the_graph():
    prompts = [PROMPT.format(k=k) for k in range(1, 9)]
    asked = asyncio.run(runner(prompts, max_turns=2).run("Q?"))
    assert asked.status == "max_turns" and asked.usage["env_calls"] == 2
    assert [t.get("response_source") for t in asked.turns].count("final_request") == 1
    stopped = asyncio.run(runner(prompts, max_turns=2, force_final_answer=False).run("Q?"))
    assert stopped.status == "max_turns" and stopped.usage["env_calls"] == 2
    assert "final_request" not in [t.get("response_source") for t in stopped.turns]


def test_question_from_messages_reads_the_last_user_text_of_either_kind():
    assert question_from_messages([HumanMessage("a"), AIMessage("b"), HumanMessage("c")]) == "c"
    parts = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}]
    assert question_from_messages(parts) == "x\ny"
    for bad, message in [
        ([], "needs a user message"),
        ([{"role": "user", "content": "  "}], "no text"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "text only"),
        ([{"role": "user", "content": "\ud800"}], "not valid Unicode"),
    ]:
        with pytest.raises(ValueError, match=message):
            question_from_messages(bad)


def test_a_price_that_raises_is_that_episodes_failure():
    def broken_price(state):
        raise KeyError("model")

    priced = EpisodeRunner(
        ScriptedAgent(scripted_agent(TURNS)), ScriptedEnvironment(echo_environment()), price=broken_price
    )
    episode = asyncio.run(priced.run("Q?", id="p1"))
    assert episode.status == "internal_error" and episode.error.startswith(
        "KeyError: 'model' (at test_episode.py:"
    )
