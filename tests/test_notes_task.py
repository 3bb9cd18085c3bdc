"""The notes task (prompt_r1.tasks.notes): sheets no model can know, questions of 1 and 2 dependent calls, the
environment that finds an episode's sheet by the names its prompts carry, cold-start demonstrations drawn from the
training pool only. On the real built-in models: tests/test_notes_agent.py."""

from __future__ import annotations

import asyncio
import json
import math
import random
import re

import pytest
from helpers import pool_words

from prompt_r1.core.config import AgentConfig
from prompt_r1.tasks.notes import (
    EMPTY,
    FACTS,
    POOLS,
    NotesEnvironment,
    NotesQuestion,
    NotesWorld,
    Sheet,
    calls_of,
    draw_sheets,
    notes_system_prompt,
    parse,
    question_about,
    questions_for,
    training_questions,
)


def test_the_training_and_evaluation_pools_share_no_word():
    assert pool_words("train") and pool_words("eval")
    assert pool_words("train").isdisjoint(pool_words("eval"))


def test_sheets_in_play_share_no_name_and_no_sheet_repeats_a_word():
    sheets = draw_sheets(40, random.Random(0), "eval")
    names = [n for s in sheets for n in s.names()]
    assert len(names) == len(set(names)) == 40 * 2 * FACTS
    for sheet in sheets:
        words = [w for n in sheet.names() for w in n.split() if w not in ("Bridge", "Clock", "Mill", "Tower",
                 "Lighthouse", "Gate", "Fountain", "Hall")]  # fmt: skip
        assert len(words) == len(set(words)), sheet
        assert len(sheet.lines()) == 2 * FACTS


def test_questions_parse_back_and_their_answers_come_from_their_sheet():
    questions = questions_for(40, random.Random(1), "eval")
    assert {q.calls for q in questions} == {1, 2}
    for q in questions:
        kind, name = parse(q.question)
        assert kind == q.kind and name in q.sheet.names()
        i = (q.sheet.people if kind == "birthplace" else q.sheet.things).index(name)
        assert q.answer == (q.sheet.people[i] if kind == "builder" else q.sheet.places[i])
        assert calls_of(kind) == (2 if kind == "builder_birthplace" else 1)
    with pytest.raises(ValueError, match="not a notes question"):
        parse("What is the capital of France?")


def test_redraw_keeps_each_named_thing_and_draws_the_rest_afresh():
    questions = training_questions(8, seed=3)
    world = NotesWorld()
    first = world.redraw(questions + questions[:2], random.Random(10))
    again = world.redraw(questions, random.Random(11))
    for a, b in zip(first, again, strict=False):
        assert (
            a.question == b.question
            and parse(a.question)[1] in a.sheet.names()
            and parse(b.question)[1] in b.sheet.names()
        )
    assert first[0].sheet == first[8].sheet  # one question twice in a step: one sheet
    assert any(a.answer != b.answer for a, b in zip(first, again, strict=False))  # facts redrawn
    assert set(world.sheets) == {q.sheet for q in again}
    # Two questions about one thing share its sheet (a name is in one sheet only).
    kind, thing = parse(next(q for q in questions if "builder" in q))
    both = world.redraw(
        [f"Who built the {thing}?", f"Where was the builder of the {thing} born?"], random.Random(2)
    )
    assert both[0].sheet == both[1].sheet


def test_the_environment_reaches_the_sheet_the_prompts_name():
    asked = questions_for(6, random.Random(4), "eval")
    world = NotesWorld()
    world.put(asked)
    sheet = asked[2].sheet
    assert world.sheet_for([f"who made the {sheet.things[0].upper()}?"]) == sheet  # case does not matter
    assert world.sheet_for([f"Who built the {sheet.things[1]}?", "And where was that person born?"]) == sheet
    assert world.sheet_for(["Tell me something."]) == EMPTY
    world.withheld = True
    assert world.sheet_for([asked[0].question]) == EMPTY
    with pytest.raises(ValueError, match="share a name"):
        other = Sheet(
            (asked[0].sheet.things[0], "Umber Mill"), ("Arlo Wend", "Vero Pryor"), ("Ostwick", "Vantry")
        )
        world.put([asked[0], NotesQuestion("Who built the Umber Mill?", "Vero Pryor", "builder", other)])


class _Recording:
    retries = 0

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    async def respond(self, prompt, history=(), *, run_config=None, system_prompt=None):
        self.calls.append((prompt, system_prompt))
        return prompt


def test_the_environment_answers_with_the_sheets_notes_as_its_system_prompt():
    asked = questions_for(3, random.Random(5), "eval")
    world = NotesWorld()
    world.put(asked)
    client = _Recording()
    environment = NotesEnvironment(client, world)
    person = asked[1].sheet.people[0]
    asyncio.run(environment.respond(f"Where was {person} born?", system_prompt="the loop's own"))
    asyncio.run(environment.respond("Nothing named here."))
    assert client.calls[0][1] == notes_system_prompt(asked[1].sheet)
    assert all(line in client.calls[0][1] for line in asked[1].sheet.lines())
    assert client.calls[1][1] == notes_system_prompt(EMPTY) and "(nothing)" in client.calls[1][1]
    assert environment.retries == 0


def test_cold_start_demonstrations_hold_no_evaluation_name_and_teach_no_choice():
    from prompt_r1.tasks.notes_agent import ASK_AGAIN, demonstrations

    episodes = demonstrations(400, seed=0)
    text = " ".join(q + " " + " ".join(script) for q, script in episodes)
    found = set(re.findall(r"[A-Z][a-z]+", text))
    assert found & pool_words("train")
    assert not found & pool_words("eval"), found & pool_words("eval")
    # After a builder reply the demonstrations ask again equally often whatever the question (ASK_AGAIN).
    shares = {}
    for kind in ("Who built", "Where was the builder"):
        after = [len(script) for q, script in episodes if q.startswith(kind) and "built" in script[1]]
        shares[kind] = sum(n == 5 for n in after) / len(after)
        assert abs(shares[kind] - ASK_AGAIN) < 0.1, (kind, shares[kind])
    assert abs(shares["Who built"] - shares["Where was the builder"]) < 0.1, shares
    # Every answer copies the last reply's name.
    for _, script in episodes:
        answer = re.search(r"<answer>(.*)</answer>", script[-1]).group(1)
        assert answer in script[-2]


def test_a_redrawn_sheet_shares_no_word_with_the_name_it_is_drawn_around():
    world = NotesWorld()
    for seed in range(30):
        for asked in world.redraw(training_questions(8, seed=seed), random.Random(seed)):
            words = [w for n in asked.sheet.names() for w in n.split() if w not in ("Bridge", "Clock", "Mill",
                     "Tower", "Lighthouse", "Gate", "Fountain", "Hall")]  # fmt: skip
            assert len(words) == len(set(words)), asked.sheet


def test_calls_are_counted_per_calls_needed_in_training_and_in_the_table():
    """A second call pays on a 2-call question only: the step lines and the comparison table count calls apart for
    1- and 2-call questions, and leave a figure that does not apply empty."""
    from prompt_r1.runs.episode import Episode
    from prompt_r1.tasks.notes_eval import summary
    from prompt_r1.tasks.notes_training import notes_figures

    sheet = draw_sheets(1, random.Random(3))[0]
    one, two = question_about("builder", sheet, 0), question_about("builder_birthplace", sheet, 0)

    def episode(asked, calls, answer):
        turns = [{"response_source": "environment"}] * calls + [{"response_source": "answer"}]
        return Episode(None, asked.question, "answered", answer=answer, turns=turns)

    first = notes_figures(episode(one, 2, sheet.places[0]), one)
    assert (first["notes/calls"], first["notes/calls_1"], first["notes/calls_2"]) == (2.0, 2.0, None)
    assert first["notes/em"] == 0.0  # asked again on a 1-call question, and answered the place
    second = notes_figures(episode(two, 1, sheet.people[0]), two)
    assert (second["notes/calls_1"], second["notes/calls_2"], second["notes/em_2"]) == (None, 1.0, 0.0)

    rows = [
        {"calls_needed": 1, "calls": 1, "em": 1.0, "f1": 1.0, "tokens": 10},
        {"calls_needed": 1, "calls": 2, "em": 0.0, "f1": 0.0, "tokens": 20},
        {"calls_needed": 2, "calls": 2, "em": 1.0, "f1": 1.0, "tokens": 30},
    ]
    table = summary(rows)
    assert (table["calls_1"], table["calls_2"], table["calls"]) == (1.5, 2.0, 5 / 3)
    assert math.isnan(summary(rows[:2])["calls_2"])


def test_kind_thoughts_name_what_the_question_asks_for_and_still_teach_no_choice():
    from prompt_r1.tasks.notes_agent import demonstrations

    episodes = demonstrations(400, seed=1, ask_again=0.5, kinds=True)
    asked_again = {}
    for question, script in episodes:
        kind, _ = parse(question)
        wanted = "builder" if kind == "builder" else "birthplace"
        thoughts = [re.search(r"<think>(.*)</think>", turn).group(1) for turn in script[::2]]
        # Every thought names what the question asks for; each after a reply names what the reply gave.
        assert all(f"The question asks for the {wanted}." in t for t in thoughts), thoughts
        for thought, reply in zip(thoughts[1:], script[1::2], strict=True):
            gave, name = re.match(r"The reply names the (builder|birthplace), (.+?)\. ", thought).groups()
            assert name in reply and (gave == "birthplace") == (name in POOLS["train"]["places"]), (
                thought,
                reply,
            )
        if kind != "birthplace":
            asked_again.setdefault(kind, []).append(len(script) == 5)
    # The choice after a builder reply is drawn alike for both questions that get one.
    shares = {kind: sum(v) / len(v) for kind, v in asked_again.items()}
    assert all(abs(share - 0.5) < 0.1 for share in shares.values()), shares
    # Off, the demonstrations are the plain ones, draw for draw: the same questions, replies and so calls.
    plain = demonstrations(50, seed=1, ask_again=0.5)
    assert [(q, s[1::2]) for q, s in plain] == [(q, s[1::2]) for q, s in episodes[:50]]
    assert all("asks for" not in turn for _, script in plain for turn in script)
    # The plain form, word for word (the shipped agent's cold start was trained on it).
    assert demonstrations(1, seed=0) == [(
        "Where was the builder of the Fallow Bridge born?",
        ["<think>I ask the large model.</think>\n<interaction_prompt>Where was the builder of the Fallow Bridge born?"
         "</interaction_prompt>",
         "The Fallow Bridge was built by Pia Corvin.",
         "<think>The reply names Pia Corvin.</think>\n<interaction_prompt>Where was Pia Corvin born?</interaction_prompt>",
         "Mornhaven.",
         "<think>The reply names Mornhaven.</think>\n<answer>Mornhaven</answer>"],
    )]  # fmt: skip


def test_plan_thoughts_end_with_the_choice_made_and_name_the_next_prompt():
    from prompt_r1.tasks.notes_agent import demonstrations

    episodes = demonstrations(400, seed=2, ask_again=0.5, kinds=True, plans=True)
    asked_again = {}
    for question, script in episodes:
        kind, _ = parse(question)
        turns = script[::2]
        for turn in turns[1:]:  # every thought after a reply ends with what the turn then does
            thought = re.search(r"<think>(.*)</think>", turn).group(1)
            name = re.match(r"The reply names the (?:builder|birthplace), (.+?)\. ", thought).group(1)
            if "<answer>" in turn:
                assert thought.endswith(f" I answer {name}.") and f"<answer>{name}</answer>" in turn, turn
            else:  # the prompt asks about the name the thought just wrote
                assert thought.endswith(f" I ask where {name} was born."), turn
                assert f"<interaction_prompt>Where was {name} born?</interaction_prompt>" in turn, turn
        if kind != "birthplace":
            asked_again.setdefault(kind, []).append(len(script) == 5)
    # Still no choice that depends on the question: the share after a builder reply is alike for both kinds.
    shares = {kind: sum(v) / len(v) for kind, v in asked_again.items()}
    assert all(abs(share - 0.5) < 0.1 for share in shares.values()), shares
    # The same draws as kind thoughts alone: only the thoughts after a reply gain their last sentence.
    kinds = demonstrations(400, seed=2, ask_again=0.5, kinds=True)
    assert [(q, s[1::2]) for q, s in kinds] == [(q, s[1::2]) for q, s in episodes]
    assert all(
        a[0] == b[0] and "I ask where" not in a[0] for (_, a), (_, b) in zip(kinds, episodes, strict=True)
    )
    # Without kind thoughts the plan follows the plain thought.
    (_, plain), *_ = demonstrations(1, seed=0, plans=True)
    assert plain[2].startswith("<think>The reply names Pia Corvin. I ask where Pia Corvin was born.</think>")


@pytest.mark.parametrize(
    ("flags", "said"),
    [(["--ask-again", "1.5"], "--ask-again must be a share from 0 to 1, got 1.5"),
     (["--turn-tokens", "0"], "--turn-tokens must be from 1 to 256 (an episode's cap), got 0"),
     (["--turn-tokens", "300"], "--turn-tokens must be from 1 to 256 (an episode's cap), got 300"),
     (["--generations", "3"], "--generations must be 2, 4, 8 or 16 (a group of 2 or more that divides a step's "
                              "16 episodes), got 3"),
     (["--generations", "1"], "--generations must be 2, 4, 8 or 16"),
     (["--cold-steps", "0"], "--cold-steps must be at least 1, got 0"),
     (["--eval-only", "--kind-thoughts", "--ask-again", "0.5"],
      "--ask-again, --kind-thoughts: settings of training, which --eval-only does not do"),
     (["--eval-only", "--served-replies"], "--served-replies: settings of training, which --eval-only does not do"),
     (["--eval-only", "--generations", "8", "--async"],
      "--generations, --async: settings of training, which --eval-only does not do"),
     (["--eval-only", "--seed0", "3", "--steps", "4"],
      "--seed0, --steps: settings of training, which --eval-only does not do"),
     (["--seeds", "0"], "--seeds must be at least 1, got 0")],
)  # fmt: skip
def test_the_benchmarks_cold_start_settings_are_refused_out_of_range_before_any_work(flags, said, capsys):
    bench = _real_agent_bench()
    with pytest.raises(SystemExit) as stopped:
        bench.main(flags)
    assert stopped.value.code == 2 and said in capsys.readouterr().err


def _real_agent_bench():
    from helpers import ROOT, load_script

    return load_script(ROOT / "evals" / "bench" / "real_agent.py", "real_agent")


@pytest.mark.parametrize(
    ("flags", "turn", "generations", "budget"),
    [(["--seed0", "5", "--seeds", "1"], 48, 4, 20 * 16),
     (["--seed0", "5", "--seeds", "1", "--kind-thoughts"], 64, 4, 20 * 16),
     (["--seed0", "5", "--seeds", "1", "--kind-thoughts", "--turn-tokens", "80"], 80, 4, 20 * 16),
     (["--seed0", "5", "--seeds", "1", "--plan-thoughts"], 80, 4, 20 * 16),
     (["--seed0", "5", "--seeds", "1", "--generations", "8", "--steps", "3"], 48, 8, 3 * 16),
     (["--eval-only"], "shipped", None, "shipped")],  # the shipped agent's own cap, and 16 episodes a step it trained
)  # fmt: skip
def test_the_benchmarks_turn_cap_reaches_training_and_the_table_and_is_recorded(
    flags, turn, generations, budget, tmp_path, monkeypatch
):
    """The stages themselves (minutes to hours) are replaced: what is checked is the settings they are given."""
    import dataclasses
    import json

    bench = _real_agent_bench()
    if turn == "shipped":  # figures no default shares, so that each is seen to come from the shipped agent
        monkeypatch.setattr(bench, "SHIPPED_AGENT", dataclasses.replace(bench.SHIPPED_AGENT, turn_tokens=40))
        monkeypatch.setattr(bench, "shipped_steps", lambda: 5)
        turn, budget = 40, 5 * 16
    given = []
    figures = dict.fromkeys(("em", "f1", "em_1", "em_2", "f1_1", "f1_2", "calls", "calls_1", "calls_2", "tokens",
                             "at_once"), 0.0)  # fmt: skip

    def train_seed(seed, args, out):
        given.append(("train", seed, args.turn_tokens, args.kind_thoughts, args.generations))
        series = {"step": [], **{key: [] for _, key in bench.CURVES}}
        return {"seed": seed, "cold_model": "c", "trained_model": "t", "series": series}

    async def compare(args, agents, budget, kept):
        given.append(("table", args.turn_tokens, budget))
        names = [
            *bench.BASELINES,
            *agents,
            *(
                f"{a}, {control}"
                for a in agents
                if a.startswith("trained")
                for control in ("notes withheld", "answering at once")
            ),
        ]
        return {"table": {name: dict(figures) for name in names}}

    monkeypatch.setattr(bench, "train_seed", train_seed)
    monkeypatch.setattr(bench, "compare", compare)
    monkeypatch.setattr(bench, "_shipped_agents", lambda out: {"trained": "shipped"})
    assert bench.main([*flags, "--seed", "7", "--out", str(tmp_path)]) == 0
    trained = [] if "--eval-only" in flags else [("train", 5, turn, "--kind-thoughts" in flags, generations)]
    assert given == [*trained, ("table", turn, budget)]
    assert json.loads((tmp_path / "real_agent.json").read_text())["turn_tokens"] == turn


def test_the_shipped_agents_steps_are_its_grpo_adapters(monkeypatch, tmp_path):
    """Read from the record of the adapter GRPO left, wherever it is in the order."""
    import dataclasses
    import json

    from prompt_r1.agents import trained
    from prompt_r1.tasks.notes_agent import ADAPTER_RECORD

    bench = _real_agent_bench()
    for stage, steps in (("cold", 12), ("grpo", 7)):
        (tmp_path / "agent" / stage).mkdir(parents=True)
        (tmp_path / "agent" / stage / ADAPTER_RECORD).write_text(json.dumps({"stage": stage, "steps": steps}))
    monkeypatch.setattr(trained, "SHIPPED", tmp_path)
    agent = dataclasses.replace(bench.SHIPPED_AGENT, name="agent")
    for order in (("cold", "grpo"), ("grpo", "cold")):
        monkeypatch.setattr(bench, "SHIPPED_AGENT", dataclasses.replace(agent, adapters=order))
        assert bench.shipped_steps() == 7


def test_a_seeds_cold_start_is_reused_for_the_same_settings_and_redone_for_others(tmp_path, monkeypatch):
    """The cold start itself (20 minutes) is replaced: what is checked is when it runs and what the marker says."""
    import argparse
    import json

    from prompt_r1.tasks import notes_agent

    bench = _real_agent_bench()
    cold = tmp_path / "cold"
    marker = cold / "cold_start.json"
    ran = []

    def cold_start(folder, *, seed, steps, ask_again, kinds, plans, replies, say):
        assert not marker.exists(), "a redo begins with the old settings' marker gone"
        folder.mkdir(parents=True, exist_ok=True)
        ran.append((seed, steps, ask_again, kinds, plans, replies))

    monkeypatch.setattr(notes_agent, "cold_start", cold_start)
    settings = dict(
        cold_steps=16, ask_again=0.7, kind_thoughts=False, plan_thoughts=False, served_replies=False
    )
    made = bench.cold_start_once(3, argparse.Namespace(**settings), cold)
    assert ran == [(3, 16, 0.7, False, False, "scripted")]
    assert json.loads(marker.read_text()) == made and made["steps"] == 16 and made["seconds"] >= 0
    assert bench.cold_start_once(3, argparse.Namespace(**settings), cold) == made  # reused
    assert len(ran) == 1
    # Written before the settings existed: scripted replies, no plan thoughts.
    older = {k: v for k, v in made.items() if k not in ("replies", "plans")}
    marker.write_text(json.dumps(older))
    bench.cold_start_once(3, argparse.Namespace(**settings), cold)
    assert len(ran) == 1
    changes = ({"ask_again": 0.5}, {"kind_thoughts": True}, {"cold_steps": 8}, {"plan_thoughts": True},
               {"served_replies": True})  # fmt: skip
    for change in changes:
        redone = bench.cold_start_once(3, argparse.Namespace(**{**settings, **change}), cold)
        assert ran[-1] == (
            3, redone["steps"], redone["ask_again"], redone["kinds"], redone["plans"], redone["replies"]
        )  # fmt: skip
    assert len(ran) == 6 and ran[-1][-1] == "served" and ran[-2][-2] is True
    marker.write_text("{}")  # a marker of unknown settings is not trusted either
    bench.cold_start_once(3, argparse.Namespace(**settings), cold)
    assert len(ran) == 7


def test_the_notes_task_takes_groups_of_8_in_a_step_of_16(tmp_path):
    """`--generations 8`: TRL's own configuration accepts 2 groups of 8 in a step of 4 x 4 episodes."""
    pytest.importorskip("trl")
    from prompt_r1.tasks.notes_training import grpo_config

    config = grpo_config(tmp_path, "smollm2-135m", num_generations=8, per_device_train_batch_size=4,
                         gradient_accumulation_steps=4, seed=1)  # fmt: skip
    assert (config.num_generations, config.generation_batch_size) == (8, 16)


def test_the_shipped_agent_brings_the_turn_cap_it_was_trained_with(tmp_path):
    """Named by its name (a config, the command line, the task's GRPO settings) or by the folder made from it (the
    task's GRPO settings, which the trainers are given resolved), the shipped agent's turns are capped where it
    was trained and measured, unless a cap is named; other models keep theirs."""
    from prompt_r1.agents.builtin import MANIFEST
    from prompt_r1.agents.trained import TRAINED_AGENTS
    from prompt_r1.cli.flags import configs_from_args
    from prompt_r1.cli.main import build_parser

    cap = TRAINED_AGENTS["smollm2-135m-notes"].turn_tokens
    assert cap == 64 and AgentConfig(model="smollm2-135m-notes").max_new_tokens == cap
    assert AgentConfig(model="smollm2-135m-notes", max_new_tokens=300).max_new_tokens == 300
    assert AgentConfig().max_new_tokens == AgentConfig(model="smollm2-135m").max_new_tokens == 1024
    parser = build_parser()

    def agent_of(*flags: str) -> AgentConfig:
        return configs_from_args(parser.parse_args(["run", "q", *flags]))[0]

    assert agent_of("--agent-model", "smollm2-135m-notes").max_new_tokens == cap
    assert (
        agent_of("--agent-model", "smollm2-135m-notes", "--agent-max-new-tokens", "1024").max_new_tokens
        == 1024
    )
    assert agent_of("--agent-model", "./my-agent").max_new_tokens == 1024
    pytest.importorskip("trl")
    from prompt_r1.tasks.notes_training import TURN_TOKENS, grpo_config

    made = tmp_path / "made"  # a folder as resolve_model makes it: its manifest names what it was made from
    made.mkdir()
    (made / MANIFEST).write_text(json.dumps({"name": "smollm2-135m-notes"}))
    other = tmp_path / "other"
    other.mkdir()
    (other / MANIFEST).write_text("not json")
    assert grpo_config(tmp_path / "a", "smollm2-135m-notes").max_turn_tokens == cap
    assert grpo_config(tmp_path / "b", made).max_turn_tokens == cap
    assert grpo_config(tmp_path / "c", made, max_turn_tokens=40).max_turn_tokens == 40
    assert grpo_config(tmp_path / "d", other).max_turn_tokens == TURN_TOKENS
    assert grpo_config(tmp_path / "e", "smollm2-135m").max_turn_tokens == TURN_TOKENS
    # `prompt-r1 train`'s config, outside any task: the paper's 1,024 unless the policy is a trained agent.
    from prompt_r1.training.run import trainer_config

    def trained_cap(model, **given) -> int:
        settings = dict(output_dir=str(tmp_path / "f"), use_cpu=True, bf16=False, report_to=[])
        return trainer_config(model_name_or_path=str(model), **settings, **given).max_turn_tokens

    assert trained_cap("smollm2-135m-notes") == trained_cap(made) == cap
    assert trained_cap(made, max_turn_tokens=100) == 100
    assert trained_cap(other) == trained_cap("smollm2-135m") == 1024


def test_served_demonstrations_keep_the_kinds_and_the_choices_share_when_replies_miss():
    """Replies written here from each request's sheet, every other person's birthplace missed on a second call:
    the episodes keep the kinds as drawn and ask again after `ask_again` of the builder replies, for both kinds of
    question that get one (dropping only the missed ask-again episodes would leave a third, not a half)."""
    from prompt_r1.tasks.notes import KINDS
    from prompt_r1.tasks.notes_agent import served_demonstrations

    def replies(requests):
        out = []
        for sheet, history, prompt in requests:
            if prompt.startswith(("Who built", "Where was the builder")):
                i = next(i for i, thing in enumerate(sheet.things) if thing in prompt)
                out.append(f"The {sheet.things[i]} was built by {sheet.people[i]}.")
            else:
                i = next(i for i, person in enumerate(sheet.people) if person in prompt)
                missed = history and len(sheet.people[i]) % 2 == 0
                out.append("I cannot say." if missed else f"{sheet.people[i]} was born in {sheet.places[i]}.")
        return out

    episodes = served_demonstrations(600, 4, replies, ask_again=0.5)
    drawn = random.Random(4)
    assert [parse(q)[0] for q, _ in episodes] == [drawn.choice(KINDS) for _ in range(600)]
    shares = {}
    for kind in ("builder", "builder_birthplace"):
        scripts = [script for q, script in episodes if parse(q)[0] == kind]
        shares[kind] = sum(len(script) == 5 for script in scripts) / len(scripts)
    assert all(abs(share - 0.5) < 0.08 for share in shares.values()), shares
    assert all("I cannot say." not in script for _, script in episodes)
    # Without plan thoughts no thought states the choice it makes.
    assert not any(
        " I ask where " in turn or " I answer " in turn for _, script in episodes for turn in script
    )
    # Plan thoughts change the thoughts alone: the same episodes, the replies and the choices drawn alike.
    planned = served_demonstrations(60, 4, replies, ask_again=0.5, plans=True)
    assert [(q, s[1::2]) for q, s in planned] == [
        (q, s[1::2]) for q, s in served_demonstrations(60, 4, replies, ask_again=0.5)
    ]
    for _, script in planned:
        for turn in script[2::2]:
            name = re.search(r"The reply names (.+?)\. ", turn).group(1)
            assert f"I ask where {name} was born.</think>" in turn or f"I answer {name}.</think>" in turn, (
                turn
            )
