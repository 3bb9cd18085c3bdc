"""The notes task under the asynchronous trainer (prompt_r1.tasks.notes_async): each group of episodes plays a sheet
of its own, drawn from the run's seed and the group's index around its question, the environment answers every
episode from its group's sheet, and the golden answers and the notes figures come from the same one.

The fast tests play groups through the loop as the rollout worker does (each episode tagged with its group) with a
scripted agent and a scripted environment that reads its notes perfectly. The slow one is 2 async steps on the
built-in models: the shipped notes agent served by `vllm serve` (vLLM's CPU build), the built-in model as the
environment."""

from __future__ import annotations

import asyncio
import math
import re

import pytest

from prompt_r1.core.config import LoopConfig
from prompt_r1.core.prompts import extract_question
from prompt_r1.runs.episode import EpisodeRunner
from prompt_r1.tasks.notes import notes_system_prompt, parse, question_about, training_questions
from prompt_r1.tasks.notes_async import GroupSheets
from prompt_r1.tasks.notes_training import NOTES_METRICS, training_rows
from prompt_r1.tasks.skeleton_async import GroupKeyedEnvironment
from prompt_r1.testing.scripted import ScriptedAgent, ScriptedEnvironment
from prompt_r1.training.shared.trajectories import question_of

AGENT = "smollm2-135m-notes"


def test_a_groups_sheet_is_drawn_from_the_seed_and_the_group_around_its_question():
    questions = training_questions(6, seed=3)
    sheets = GroupSheets(seed=3)
    drawn = [sheets.ask(group, questions[group % 3]) for group in range(6)]
    again = GroupSheets(seed=3)
    assert [again.ask(group, questions[group % 3]) for group in range(6)] == drawn  # a rerun's sheets
    other = GroupSheets(seed=4)
    assert all(other.ask(g, questions[g % 3]).sheet != drawn[g].sheet for g in range(6))
    # Groups asking the same question play different sheets: nothing to learn by heart.
    assert len({asked.sheet for asked in drawn}) == 6
    for asked in drawn:
        kind, name = parse(asked.question)
        i = (asked.sheet.people if kind == "birthplace" else asked.sheet.things).index(name)
        assert question_about(kind, asked.sheet, i) == asked  # the gold answer is the sheet's
    assert sheets.asked(4) is drawn[4]
    with pytest.raises(ValueError, match="group 1 plays"):
        sheets.ask(1, questions[0])


def _reader(body: dict) -> str:
    """An environment that reads its notes perfectly: the fact the question asks, from the system message's notes
    (the builder, or where a person was born, or both in turn); without the notes it cannot say."""
    notes, question = body["messages"][0]["content"], body["messages"][-1]["content"]

    def fact(pattern: str) -> str | None:
        found = re.search(pattern, notes)
        return found.group(1) if found else None

    kind, name = parse(question)
    person = name if kind == "birthplace" else fact(rf"The {re.escape(name)} was built by ([^.]+)\.")
    answer = person if kind == "builder" else person and fact(rf"{re.escape(person)} was born in ([^.]+)\.")
    return answer or "The notes do not say."


def _asking_agent(body: dict) -> str:
    """An agent that asks the environment its question, then answers with the reply."""
    messages = body["messages"]
    if not any(m["role"] == "assistant" for m in messages):
        question = extract_question(messages[0]["content"]) or messages[0]["content"]
        return f"<think>ask</think><interaction_prompt>{question}</interaction_prompt>"
    reply = (
        messages[-1]["content"].removeprefix("<interaction_response>").removesuffix("</interaction_response>")
    )
    return f"<think>ok</think><answer>{reply.strip()}</answer>"


def _play(sheets: GroupSheets, environment, groups: range, rows: list[dict]) -> list[tuple[dict, dict]]:
    """Each group's episode through the loop as the rollout worker plays it (the row from `group_row`, the episode
    tagged with its group), concurrently; (row, figures) per group."""
    options = sheets.worker_options()
    runner = EpisodeRunner(ScriptedAgent(_asking_agent), environment, LoopConfig(max_turns=3))
    played = [options["group_row"](g, rows[g % len(rows)]) for g in groups]

    async def run() -> list:
        return await asyncio.gather(
            *(
                runner.run(question_of(row["prompt"]), metadata={"rollout_group": g})
                for g, row in zip(groups, played, strict=True)
            )
        )

    episodes = asyncio.run(run())
    return [
        (row, options["episode_metrics"](g, row, episode))
        for g, row, episode in zip(groups, played, episodes, strict=True)
    ]


def test_every_episode_is_answered_and_scored_from_its_own_groups_sheet():
    rows = training_rows(training_questions(4, seed=8))
    sheets = GroupSheets(seed=8)
    inner = ScriptedEnvironment(_reader)
    groups = range(12)  # rows cycled: each question played by three groups, each on its own sheet
    played = _play(sheets, GroupKeyedEnvironment(inner, system=sheets.system_prompt), groups, rows)
    # Every call's system message is the notes of its episode's group (a call per episode here).
    assert sorted(b["messages"][0]["content"] for b in inner.bodies) == sorted(
        notes_system_prompt(sheets.asked(g).sheet) for g in groups
    )
    for g, (row, figures) in zip(groups, played, strict=True):
        asked = sheets.asked(g)
        assert row["golden_answers"] == [asked.answer]
        assert set(figures) == set(NOTES_METRICS)
        # The reader answered from the group's sheet, and the agent copied it: right against the group's gold.
        assert (
            figures["notes/em"] == 1.0 and figures["notes/calls"] == 1.0 and figures["notes/at_once"] == 0.0
        )
        assert math.isnan(figures["notes/em_2"] if asked.calls == 1 else figures["notes/em_1"])
        assert math.isnan(figures["notes/calls_2"] if asked.calls == 1 else figures["notes/calls_1"])
    # The same question's groups have other gold answers: an episode answered from another group's sheet is wrong.
    assert len({sheets.asked(g).answer for g in groups}) > len(rows)


@pytest.mark.parametrize("ignored", ["no notes", "the first group's notes"])
def test_an_environment_that_ignores_the_group_leaves_the_episodes_wrong(ignored):
    """The property the test above checks fails when the group is not read: without it the environment holds no
    notes (the client's own system prompt), or one sheet for every group (here the first group's), and the other
    groups' episodes are wrong, those asking the first group's question too."""
    rows = training_rows(training_questions(4, seed=8))
    sheets = GroupSheets(seed=8)
    inner = ScriptedEnvironment(_reader)
    environment = (
        inner
        if ignored == "no notes"
        else GroupKeyedEnvironment(inner, system=lambda g: sheets.system_prompt(0))
    )
    played = _play(sheets, environment, range(12), rows)
    assert all(figures["notes/em"] == 0.0 for _, figures in played[1:])


def test_a_call_without_a_group_keeps_the_clients_system_prompt():
    inner = ScriptedEnvironment(_reader)
    environment = GroupKeyedEnvironment(inner, system=GroupSheets(seed=1).system_prompt)
    asyncio.run(environment.respond("Who built the Varn Bridge?", run_config={"metadata": {}}))
    assert "notes" not in inner.bodies[0]["messages"][0]["content"]
    assert environment.model_name == "env"  # the client's settings read through (its model, for the price)


# ---- on vLLM's CPU build -------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_two_async_steps_of_the_notes_task_on_the_builtin_models(builtin_cache, tmp_path, monkeypatch):
    """The async trainer on the task: the shipped notes agent as policy (LoRA), served by vLLM; the built-in model
    served by this process as the environment. Every environment call carries its group and gets that group's
    sheet; each step logs the notes figures; the same seed draws the same sheets."""
    pytest.importorskip("vllm", reason="the vllm extra is not installed")
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.tasks.notes_async import train_async
    from prompt_r1.training.shared.progress import step_series

    calls: list[tuple[int | None, str | None]] = []
    respond = EnvironmentClient.respond

    async def recorded(self, prompt, history=(), *, run_config=None, system_prompt=None):
        calls.append((((run_config or {}).get("metadata") or {}).get("rollout_group"), system_prompt))
        return await respond(self, prompt, history, run_config=run_config, system_prompt=system_prompt)

    monkeypatch.setattr(EnvironmentClient, "respond", recorded)
    run = train_async(
        AGENT, training_rows(training_questions(8, seed=5)), tmp_path / "run", seed=5, max_steps=2,
        per_device_train_batch_size=4, num_generations=2,
    )  # fmt: skip
    assert run["server_returncode"] is not None  # the vLLM server was stopped
    assert run["config"].async_grpo and run["config"].use_peft
    assert run["trainer"].state.global_step == 2
    series = step_series(run["log_history"], extra=NOTES_METRICS)
    assert len(series["reward"]) == 2
    for name in (
        "notes/em",
        "notes/f1",
        "notes/calls",
        "notes/at_once",
    ):  # logged every step, from the samples
        assert all(not math.isnan(v) for v in series[name]), (name, series[name])
    assert all(0.0 <= v <= 1.0 for v in series["notes/em"])
    sheets = run["sheets"]
    groups = {group for group, _ in calls}
    assert calls and None not in groups and len(groups) >= 4  # 2 steps of 2 groups, at least
    for group, system in calls:
        assert system == notes_system_prompt(sheets.asked(group).sheet), group
    assert len({sheets.asked(g).sheet for g in groups}) == len(groups)
    again = GroupSheets(seed=5)
    assert all(again.ask(g, sheets.asked(g).question) == sheets.asked(g) for g in groups)
