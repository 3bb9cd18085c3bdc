"""The notes task on the real built-in models: 2 GRPO steps of the task (the policy and the environment both
SmolLM2-135M-Instruct, the environment served over HTTP with each episode's notes), and the shipped trained agent
`smollm2-135m-notes` following the protocol on held-out questions, through the library and through `run`."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from helpers import check_builtin_adapter, pool_words, run_cli

from prompt_r1.agents.builtin import MANIFEST, ModelNameError, check_builtin, resolve_model
from prompt_r1.agents.trained import TRAINED_AGENTS, adapter_folders

pytest.importorskip("gguf")
pytest.importorskip("peft")
AGENT = "smollm2-135m-notes"


def test_the_shipped_adapters_are_small_and_name_a_portable_base():
    for folder in adapter_folders(TRAINED_AGENTS[AGENT]):
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "smollm2-135m"
        assert (folder / "adapter_model.safetensors").stat().st_size < 5_000_000


def test_a_missing_adapter_is_one_line(monkeypatch, tmp_path):
    import prompt_r1.agents.trained as trained

    monkeypatch.setattr(trained, "SHIPPED", tmp_path)
    with pytest.raises(
        ModelNameError, match=f"the built-in agent {AGENT}: the package's adapter file .* is missing"
    ):
        check_builtin(AGENT)


def test_the_shipped_agent_follows_the_protocol_on_held_out_questions(builtin_cache):
    """Merged once into an ordinary folder of its own; greedy on 6 held-out questions against the served built-in
    environment holding their notes: every episode calls the environment about the question's thing or person,
    then answers."""
    from prompt_r1.agents.local import TransformersAgent
    from prompt_r1.agents.model_server import model_server_in_thread
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig
    from prompt_r1.tasks.notes import parse
    from prompt_r1.tasks.notes_eval import agent_method, held_out

    folder = resolve_model(AGENT)
    assert folder.startswith(str(builtin_cache / "models" / AGENT))
    assert (
        builtin_cache / "models" / AGENT
    ).exists() is False  # the folder's name carries the adapters' digest
    assert json.loads((__import__("pathlib").Path(folder) / MANIFEST).read_text())["name"] == AGENT
    assert resolve_model(AGENT) == folder  # made once
    questions = held_out(6, seed=2024)
    with model_server_in_thread("smollm2-135m", seed=0) as server:
        client = EnvironmentClient(
            EnvironmentConfig(model=server.name, base_url=server.base_url, max_tokens=32, temperature=0.0),
            api_key="none",
        )
        cap = TRAINED_AGENTS[AGENT].turn_tokens  # what it was trained and measured with
        agent = TransformersAgent(AgentConfig(model=folder, temperature=0.0, seed=0, max_new_tokens=cap))
        loop = LoopConfig(max_turns=3, max_turn_tokens=cap, max_total_tokens=256)
        rows = asyncio.run(agent_method(agent, client, questions, loop))
        # The benchmark's control "answering at once": its first turn guided into the answer's tags.
        guided = TransformersAgent(dataclasses.replace(agent.config, guide_calls=0))
        at_once = asyncio.run(agent_method(guided, client, questions[:2], loop))
    for row in rows:
        assert row["status"] == "answered", row
        assert 1 <= row["calls"] <= 3 and row["prediction"].strip(), row
        assert parse(row["question"])[1].lower() in row["prompts"][0].lower(), row
    assert [(row["calls"], row["status"]) for row in at_once] == [(0, "answered")] * 2, at_once
    assert all(row["prediction"].strip() for row in at_once), at_once


def test_run_takes_the_shipped_agent_by_name_offline(builtin_cache, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, out, err = run_cli(
        ["run", "Who built the Varn Bridge?", "--agent-model", AGENT, "--agent-temperature", "0", "--json"]
    )
    assert code == 0, err[-2000:]
    episode = json.loads(out)
    assert episode["status"] == "answered" and episode["usage"]["env_calls"] >= 1
    assert "Varn Bridge" in episode["turns"][0]["prompt"]


def test_two_grpo_steps_of_the_notes_task_on_the_builtin_models(builtin_cache, tmp_path):
    """The synchronous trainer on the task: the shipped agent as policy (LoRA), the built-in model served as the
    environment with each step's notes; the step's gold answers are its sheets', and the task's figures are
    logged."""
    pytest.importorskip("trl")
    from prompt_r1.tasks.notes import parse, training_questions
    from prompt_r1.tasks.notes_training import grpo_config, notes_trainer, training_rows
    from prompt_r1.training.run import train

    config = grpo_config(
        tmp_path / "run", AGENT, max_steps=2, per_device_train_batch_size=2, num_generations=2,
        seed=5, data_seed=5,
    )  # fmt: skip
    rows = training_rows(training_questions(4, seed=5))
    trainer = train(config, build=lambda c: notes_trainer(c, rows))  # trains, then saves the adapter
    rollout = trainer.rollout_func
    assert trainer.state.global_step == 2
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 2 and all("notes/em" in h and "notes/calls" in h for h in logged)
    assert all(h["notes/calls"] >= 1 for h in logged)
    for asked, episode in zip(rollout.last_asked, rollout.last_results, strict=True):
        assert parse(asked.question)[1] in asked.sheet.names()
        assert asked.sheet in rollout.world.sheets
        assert episode.question == asked.question
    # The run's adapter is one of the notes agent (the built-in model and its shipped adapters, named above, which
    # the trainer resolved to its folder): the agent loader takes it as a model, and it loads onto the built-in
    # model's weights.
    check_builtin_adapter(tmp_path / "run")


@pytest.mark.slow  # CI trains the task above; this runs it twice (about 3 minutes on 2 cores)
def test_the_same_seed_gives_the_same_step_lines(builtin_cache, tmp_path):
    pytest.importorskip("trl")
    from prompt_r1.tasks.notes import training_questions
    from prompt_r1.tasks.notes_training import NOTES_METRICS, grpo_config, notes_trainer, training_rows

    def run(where: str) -> list[str]:
        config = grpo_config(
            tmp_path / where, resolve_model(AGENT), max_steps=2, per_device_train_batch_size=2,
            num_generations=2, seed=9, data_seed=9,
        )  # fmt: skip
        trainer = notes_trainer(config, training_rows(training_questions(4, seed=9)))
        trainer.train()
        keys = ("reward", "episode/env_calls", "episode/agent_completion_tokens", *NOTES_METRICS)
        # repr: a figure with no episode to average is nan, which equals nothing
        return [repr([h.get(k) for k in keys]) for h in trainer.state.log_history if "reward" in h]

    first = run("a")
    assert len(first) == 2 and first == run("b")


def test_served_demonstrations_carry_the_environments_own_replies_and_copy_the_fact_they_name(builtin_cache):
    """The cold start's demonstrations with the served built-in environment's replies (training-pool sheets): every
    reply in them is one the environment gave to that prompt with that history, every answer is the name the last
    reply gave, the question kinds keep their drawn shares whatever the environment misses, and no evaluation name
    appears."""
    import random
    import re

    from prompt_r1.tasks.notes import KINDS, parse
    from prompt_r1.tasks.notes_agent import served_demonstrations, served_replies

    given = {}
    with served_replies(seed=0) as ask:

        def recorded(requests):
            texts = ask(requests)
            given.update({(sheet, tuple(history), prompt): text for (sheet, history, prompt), text
                          in zip(requests, texts, strict=True)})  # fmt: skip
            return texts

        episodes = served_demonstrations(8, 3, recorded, ask_again=0.5, kinds=True)
    drawn = random.Random(3)
    assert [parse(q)[0] for q, _ in episodes] == [drawn.choice(KINDS) for _ in range(8)]
    evaluation = pool_words("eval")
    replied: dict = {}  # two sheets may name the same thing: every reply the environment gave to a prompt
    for (_, history, prompt), text in given.items():
        replied.setdefault((history, prompt), []).append(text)
    for question, script in episodes:
        prompts = [
            re.search(r"<interaction_prompt>(.*)</interaction_prompt>", t).group(1) for t in script[:-1:2]
        ]
        history: tuple = ()
        for prompt, reply in zip(prompts, script[1::2], strict=True):
            assert reply in replied[(history, prompt)]  # the environment's own text, not a script's
            history += ((prompt, reply),)
        answer = re.search(r"<answer>(.*)</answer>", script[-1]).group(1)
        assert answer.lower() in script[-2].lower(), (question, script)
        assert not set(re.findall(r"[A-Z][a-z]+", question + " ".join(script))) & evaluation


def test_served_demonstrations_refuse_an_environment_that_never_names_the_fact():
    from prompt_r1.tasks.notes_agent import served_demonstrations

    with pytest.raises(RuntimeError, match="named the fact asked for too seldom: .* after 2 rounds"):
        served_demonstrations(4, 0, lambda requests: ["I cannot say."] * len(requests), rounds=2)
