"""GRPO learns on the door-codes task (prompt_r1.testing.door_codes), at a fixed seed: the check that
`evals/bench/learning.py` makes over several seeds, at a size CI affords (about 90 s on 2 cores). A run is not
bit-for-bit repeatable (the order in which concurrent episodes reach the batched policy varies), hence a margin
rather than a figure."""

from __future__ import annotations

import statistics

from prompt_r1.testing.door_codes import (
    CODES,
    build_door_model,
    door_codes,
    door_environment,
    format_episodes,
    grpo_config,
    named_doors,
    question_for,
    reading_episodes,
    training_rows,
)
from prompt_r1.testing.servers import ScriptedServer

STEPS = 60
# Under half the smallest gain seen at this size: +0.38, +0.33, +0.38 over 3 seeds, +0.41 at seed 0.
MARGIN = 0.15


def test_the_environment_gives_a_code_only_for_one_named_door():
    codes = door_codes(0)
    respond = door_environment(codes)
    ask = lambda text: respond({"messages": [{"role": "user", "content": text}]})  # noqa: E731
    assert ask(question_for("jade")) == f"The jade door code is {codes['jade']}."
    assert ask("Which code?") == "Name the door."
    assert ask("The jade door or the ruby door?") == "Name one door."
    assert ask("Jadeite is not jade.") == f"The jade door code is {codes['jade']}."  # whole words only


def test_fine_tuning_holds_no_facts_only_replies_to_copy():
    codes_of = {}
    for question, ask, reply, answer in reading_episodes(2000, seed=3):
        door = named_doors(question)[0]
        assert named_doors(ask) == [door]
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


def test_grpo_raises_the_reward_on_the_door_task(tmp_path):
    from prompt_r1.training.progress import step_series
    from prompt_r1.training.trainer import build_trainer

    model = build_door_model(tmp_path / "model", seed=0)
    codes = door_codes(0)
    rows = training_rows(STEPS * 4 + 32, seed=0, codes=codes)
    with ScriptedServer({"env": door_environment(codes)}, record=False) as server:
        config = grpo_config(tmp_path / "run", model, server.base_url, max_steps=STEPS, seed=0)
        trainer = build_trainer(config, train_rows=rows)
        trainer.train()
    total = step_series(trainer.state.log_history)["reward"]
    first, last = statistics.fmean(total[:10]), statistics.fmean(total[-10:])
    print(f"door task: reward {first:+.3f} -> {last:+.3f} over {STEPS} steps")
    assert last - first > MARGIN, (first, last, [round(r, 2) for r in total])
