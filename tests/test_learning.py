"""GRPO learns on the door-codes task (prompt_r1.tasks.door_codes, prompt_r1.tasks.door_training) at one seed, the check that
`evals/bench/learning.py` makes over many; and a run is reproducible: the same seed gives the same trajectories,
losses and weights whatever order the environment's replies arrive in."""

from __future__ import annotations

import random
import statistics

import pytest

from prompt_r1.runs.episode import Episode
from prompt_r1.tasks.door_codes import (
    CODES,
    DOORS,
    READING_FLOOR,
    READING_TARGET,
    DoorTable,
    build_door_model,
    door_codes,
    door_environment,
    format_episodes,
    named_doors,
    question_for,
    reading_episodes,
    training_rows,
)
from prompt_r1.tasks.door_training import (
    CHANCE,
    DoorRollout,
    control,
    door_figures,
    door_trainer,
    grpo_config,
)
from prompt_r1.testing.servers import ScriptedServer

STEPS = 50
# Under half the smallest gain seen at this size (see the learning benchmark's notes in the docs).
MARGIN = 0.2
FROM_REPLY_RISE = 0.2
HELD_OUT = 10**9  # the evaluation's table: one no training step draws


def ask(respond, text):
    return respond({"messages": [{"role": "user", "content": text}]})


def test_the_environment_gives_a_code_only_for_one_named_door():
    codes = door_codes(0)
    respond = door_environment(codes)
    assert ask(respond, question_for("jade")) == f"The jade door code is {codes['jade']}."
    assert ask(respond, "Which code?") == "Name the door."
    assert ask(respond, "The jade door or the ruby door?") == "Name one door."
    assert (
        ask(respond, "Jadeite is not jade.") == f"The jade door code is {codes['jade']}."
    )  # whole words only


def test_the_table_is_redrawn_each_step_and_the_environment_reads_the_current_one():
    table = DoorTable(seed=5)
    respond = door_environment(table)
    tables = [dict(table.draw(step)) for step in range(40)]
    assert tables[3] == DoorTable(seed=5).draw(3)  # a function of seed and step: a rerun sees the same tables
    for door in DOORS:  # no door keeps its code: nothing to learn by heart
        assert len({t[door] for t in tables}) > 3
    table.draw(7)
    assert ask(respond, question_for("ruby")) == f"The ruby door code is {table.codes['ruby']}."
    table.reply = "lying"
    lies = [ask(respond, question_for(d)).rsplit(" ", 1)[1].rstrip(".") for d in DOORS]
    assert all(lie in CODES and lie != table.codes[d] for lie, d in zip(lies, DOORS, strict=True))
    table.reply = "withheld"
    assert not any(code in ask(respond, question_for("ruby")) for code in CODES)


def test_a_right_answer_counts_as_from_the_reply_only_when_a_reply_gave_it():
    codes = door_codes(1)
    code, other = codes["jade"], next(c for c in CODES if c != codes["jade"])

    def episode(prompt, response, answer):
        turns = [{"prompt": prompt, "response": response, "response_source": "environment"}] if prompt else []
        return Episode(id=None, question=question_for("jade"), status="answered", answer=answer, turns=turns)

    reply = f"The jade door code is {code}."
    assert door_figures(episode(question_for("jade"), reply, code), codes) == (True, True, True)
    assert door_figures(episode(question_for("jade"), reply, other), codes) == (True, False, False)
    assert door_figures(episode(None, None, code), codes) == (False, True, False)  # a guess
    wrong_door = f"The ruby door code is {code}."
    assert door_figures(episode(question_for("ruby"), wrong_door, code), codes) == (False, True, False)


def test_fine_tuning_holds_no_facts_only_replies_to_copy():
    codes_of = {}
    for question, turn, reply, answer in reading_episodes(2000, seed=3):
        door = named_doors(question)[0]
        assert named_doors(turn) == [door]
        code = reply.rsplit(" ", 1)[1].rstrip(".")
        assert answer.endswith(f"<answer>{code}</answer>")  # the reply's code, copied
        codes_of.setdefault(door, set()).add(code)
    assert all(len(codes) == len(CODES) for codes in codes_of.values())  # no door has a code to learn


def test_the_format_data_prefers_no_behaviour():
    episodes = format_episodes(2000, seed=1)
    direct = [e for e in episodes if e[2] is None]
    named = [e for e in episodes if e[2] is not None and named_doors(e[1])]
    own = [e for e in named if named_doors(e[1]) == named_doors(e[0])]
    copied = [e for e in named if e[3].split("<answer>")[1].split("</answer>")[0] in e[2]]
    assert abs(len(direct) / len(episodes) - 0.25) < 0.03
    assert abs(len(own) / len(named) - 0.5) < 0.05  # the question's door as often as another
    assert abs(len(copied) / len(named) - 0.5) < 0.08  # the reply's code about half the time


# Building the agent takes one to three minutes on 2 cores (the reading stage runs until the agent reads), and the
# first test to use it pays for it.
BUILD_TIMEOUT = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def door_model(tmp_path_factory):
    return build_door_model(tmp_path_factory.mktemp("door") / "model", seed=0)


@BUILD_TIMEOUT
def test_the_built_agent_reads_the_question_without_preferring_to_ask(door_model):
    import json

    figures = json.loads((door_model / "door_build.json").read_text())
    assert figures["greedy_reading"] >= READING_TARGET  # after the reading stage
    # After the mixture: about the mixture's quarter, not the reading stage's near-always.
    assert READING_FLOOR <= figures["sampled_reading"] <= 0.45


class Recording(DoorRollout):
    """Keeps every step's trajectories."""

    def __call__(self, prompts, trainer):
        output = super().__call__(prompts, trainer)
        self.__dict__.setdefault("outputs", []).append(output)
        return output


def _run(model, tmp_path, name, *, latency_seed, steps, seed=0, **settings):
    rng = random.Random(latency_seed)
    table = DoorTable(seed)
    # Replies take 0-30 ms, drawn per run: they arrive in a different order each time.
    latency = (lambda: rng.uniform(0, 0.03)) if latency_seed is not None else 0.0
    with ScriptedServer({"env": door_environment(table)}, record=False, latency=latency) as server:
        config = grpo_config(
            tmp_path / name, model, server.base_url, max_steps=steps, seed=seed, data_seed=seed
        )
        rows = training_rows(steps * 4 + 32, seed=seed)
        trainer = door_trainer(config, table, rows, rollout=Recording)
        evaluate = steps > 5
        before = control(trainer, trainer.rollout_func, step=HELD_OUT) if evaluate else None
        trainer.train()
        after = control(trainer, trainer.rollout_func, step=HELD_OUT) if evaluate else None
    return trainer, (before, after)


@BUILD_TIMEOUT
def test_the_same_seed_gives_the_same_run_whatever_order_replies_arrive_in(door_model, tmp_path):
    import torch

    first, _ = _run(door_model, tmp_path, "a", latency_seed=1, steps=3)
    second, _ = _run(door_model, tmp_path, "b", latency_seed=2, steps=3)
    ids = [[o["completion_ids"] for o in t.rollout_func.outputs] for t in (first, second)]
    assert len(ids[0]) == 3 and ids[0] == ids[1]
    assert any(len(set(map(tuple, step))) > 4 for step in ids[0])  # sampled, not one greedy answer repeated
    losses = [[row["loss"] for row in t.state.log_history if "loss" in row] for t in (first, second)]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    for (name, a), b in zip(
        first.model.state_dict().items(), second.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    # Batches in episode order whatever the reply order: tests/test_agents.py::test_lockstep_batches_...


@BUILD_TIMEOUT
def test_grpo_learns_to_ask_the_environment_and_copy_its_reply(door_model, tmp_path):
    from prompt_r1.training.shared.progress import step_series

    trainer, (before, after) = _run(door_model, tmp_path, "learn", latency_seed=None, steps=STEPS)
    total = step_series(trainer.state.log_history)["reward"]
    first, last = statistics.fmean(total[:10]), statistics.fmean(total[-10:])
    print(f"door task: reward {first:+.3f} -> {last:+.3f}; evaluated before {before}, after {after}")
    assert last - first > MARGIN, (first, last, [round(r, 2) for r in total])
    # On a table training never saw: right answers taken from the episode's own reply, before and after.
    assert after["from_reply"] - before["from_reply"] > FROM_REPLY_RISE, (before, after)
    # The controls: with the code withheld the trained agent can only guess; lied to, it copies the lie.
    assert after["withheld"] < CHANCE + 0.08 and after["lying"] < CHANCE, after
    assert after["honest"] > after["withheld"] + 0.25, after
