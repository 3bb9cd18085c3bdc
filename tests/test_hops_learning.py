"""GRPO on the hops task (prompt_r1.tasks.hops) at one seed: the agent built for it has each skill and no chain,
and a short run teaches the first calls of the chain. `evals/bench/learning.py --task hops` makes the full
measurement over many seeds (docs/benchmarks.md); tests/test_hops_run.py runs the task through the trainer in
every run of the suite."""

from __future__ import annotations

import json

import pytest

from prompt_r1.tasks.hops import HopsTable, hops_environment, training_rows
from prompt_r1.tasks.hops_agent import (
    CHOICE_CEILING,
    COPY_FLOOR,
    READING_TARGET,
    SKILL_FLOOR,
    build_hops_model,
)
from prompt_r1.tasks.hops_training import (
    control,
    first_call_logprob,
    grpo_config,
    hops_trainer,
)
from prompt_r1.testing.servers import ScriptedServer

HELD_OUT = 10**9
STEPS = 30
# Under half of what two development seeds (100, 101) reached by step 30 on the benchmark's build.
LOGPROB_RISE = 0.3  # the right first call's log-probability, summed over its tokens
HOP1_RISE = 0.2
FROM_LAST_RISE = 0.15  # correct from the last reply, 1-hop questions
# The build runs its rounds until the agent reads (a few minutes on 2 cores); the first test to use it pays.
BUILD_TIMEOUT = pytest.mark.timeout(1200)
# Slow: the full build and 30 steps take 10-20 minutes on 2 cores. The default suite runs the task through the
# trainer on a briefly fine-tuned agent (tests/test_hops_run.py) and the task's parts (tests/test_hops.py).
pytestmark = pytest.mark.slow
CI_BUILD = dict(steps=200, batch_size=32)  # a lighter build than the benchmark's (300 steps of 64 a round)


@pytest.fixture(scope="module")
def hops_model(tmp_path_factory):
    return build_hops_model(tmp_path_factory.mktemp("hops") / "model", seed=0, **CI_BUILD)


@BUILD_TIMEOUT
def test_the_built_agent_has_each_skill_and_prefers_no_choice(hops_model):
    figures = json.loads((hops_model / "hops_build.json").read_text())
    assert min(figures["greedy"][s] for s in ("question", "follow", "copy")) >= READING_TARGET
    sampled = figures["sampled"]
    assert min(sampled[s] for s in ("question", "follow", "stop")) >= SKILL_FLOOR
    assert sampled["copy"] >= COPY_FLOOR
    assert max(sampled[s] for s in ("question", "follow", "stop")) <= CHOICE_CEILING


@BUILD_TIMEOUT
def test_a_short_grpo_run_teaches_the_chain_s_first_steps(hops_model, tmp_path):
    table = HopsTable(0)
    with ScriptedServer({"env": hops_environment(table)}, record=False) as server:
        config = grpo_config(
            tmp_path / "learn", hops_model, server.base_url, max_steps=STEPS, seed=0, data_seed=0
        )
        trainer = hops_trainer(config, table, training_rows(STEPS * 4 + 32, seed=0))
        before = {**control(trainer, trainer.rollout_func, step=HELD_OUT, samples=2),
                  "lp": first_call_logprob(trainer)}  # fmt: skip
        trainer.train()
        after = {**control(trainer, trainer.rollout_func, step=HELD_OUT, samples=2),
                 "lp": first_call_logprob(trainer)}  # fmt: skip
    b, a = before["honest_figures"], after["honest_figures"]
    print(f"hops task: before {before}\nafter {after}")
    # The reward comes at the end of the episode; the first call's tokens learn from it.
    assert after["lp"] > before["lp"] + LOGPROB_RISE, (before["lp"], after["lp"])
    assert a["from_last_reply_1"] - b["from_last_reply_1"] > FROM_LAST_RISE, (b, a)
    assert a["hop1"] - b["hop1"] > HOP1_RISE, (b, a)
    assert a["exact_calls"] > b["exact_calls"], (b, a)
    assert after["withheld"] < 0.15 and after["lying"] < 0.15, after
