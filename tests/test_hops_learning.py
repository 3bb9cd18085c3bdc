"""GRPO on the hops task (prompt_r1.tasks.hops) at one seed: the agent built for it has each skill and no chain,
a run is reproducible, and a short run teaches the first calls of the chain. `evals/bench/learning.py --task hops`
makes the full measurement over many seeds (docs/benchmarks.md)."""

from __future__ import annotations

import json
import random

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
    HOPS_METRICS,
    HopsRollout,
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
# Slow for now: under load the build ran past its timeout, and whether seed 0's lighter build passes its own check
# was not confirmed on an idle machine (the benchmark's seed 91899 did not). tests/test_hops.py stays in CI.
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


class Recording(HopsRollout):
    def __call__(self, prompts, trainer):
        output = super().__call__(prompts, trainer)
        self.__dict__.setdefault("outputs", []).append(output)
        return output


def _trainer(model, tmp_path, name, server, table, *, steps, seed=0, **settings):
    from functools import partial

    from prompt_r1.training.sync.trainer import build_trainer

    config = grpo_config(tmp_path / name, model, server.base_url, max_steps=steps, seed=seed, data_seed=seed,
                         **settings)  # fmt: skip
    rows = training_rows(steps * 4 + 32, seed=seed)
    return build_trainer(config, train_rows=rows, rollout=partial(Recording, table=table))


@BUILD_TIMEOUT
def test_the_same_seed_gives_the_same_multi_call_run_whatever_order_replies_arrive_in(hops_model, tmp_path):
    import torch

    runs = []
    for name, latency_seed in (("a", 1), ("b", 2)):
        rng = random.Random(latency_seed)
        table = HopsTable(0)
        latency = lambda rng=rng: rng.uniform(0, 0.03)  # noqa: E731 (replies arrive in another order each run)
        with ScriptedServer({"env": hops_environment(table)}, record=False, latency=latency) as server:
            trainer = _trainer(hops_model, tmp_path, name, server, table, steps=2)
            trainer.train()
        runs.append(trainer)
    ids = [[o["completion_ids"] for o in t.rollout_func.outputs] for t in runs]
    masks = [o["env_mask"] for o in runs[0].rollout_func.outputs]
    assert ids[0] == ids[1]
    # Several environment replies inside one trajectory: the mask switches off and on again per call.
    assert any(
        sum(1 for a, b in zip(m, m[1:], strict=False) if a == 0 and b == 1) >= 2
        for step in masks
        for m in step
    )
    for (name, a), b in zip(
        runs[0].model.state_dict().items(), runs[1].model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    logged = runs[0].state.log_history[0]
    assert all(key in logged for key in HOPS_METRICS)


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
