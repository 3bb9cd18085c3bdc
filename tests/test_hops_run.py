"""The hops task through the real synchronous trainer, short enough for every run of the suite: several
environment replies in one trajectory, masked per call, and the same seed giving the same run whatever order the
replies arrive in. The agent is the build's first round alone (it plays the protocol; it is not checked for
skill): tests/test_hops_learning.py (slow) checks the full build and that a short run learns, and
`evals/bench/learning.py --task hops` measures learning over many seeds."""

from __future__ import annotations

import random
from functools import partial

import pytest

from prompt_r1.tasks.hops import HopsTable, hops_environment, training_rows
from prompt_r1.tasks.hops_agent import whole_chain_stage
from prompt_r1.tasks.hops_training import HOPS_METRICS, HopsRollout, grpo_config
from prompt_r1.testing.servers import ScriptedServer

# About two minutes of CPU on 2 cores (the agent's 80 fine-tuning steps most of it); more on a loaded machine.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def chain_player(tmp_path_factory):
    """A tiny agent fine-tuned briefly on whole chains: it asks, follows replies and answers."""
    return whole_chain_stage(tmp_path_factory.mktemp("hops") / "model", seed=0, steps=80, episodes=96,
                             batch_size=32)  # fmt: skip


class Recording(HopsRollout):
    def __call__(self, prompts, trainer):
        output = super().__call__(prompts, trainer)
        self.__dict__.setdefault("outputs", []).append(output)
        return output


def _trainer(model, tmp_path, name, server, table, *, steps, seed=0, **settings):
    from prompt_r1.training.sync.trainer import build_trainer

    config = grpo_config(tmp_path / name, model, server.base_url, max_steps=steps, seed=seed, data_seed=seed,
                         **settings)  # fmt: skip
    rows = training_rows(steps * 4 + 32, seed=seed)
    return build_trainer(config, train_rows=rows, rollout=partial(Recording, table=table))


def test_the_same_seed_gives_the_same_multi_call_run_whatever_order_replies_arrive_in(chain_player, tmp_path):
    import torch

    runs = []
    for name, latency_seed in (("a", 1), ("b", 2)):
        rng = random.Random(latency_seed)
        table = HopsTable(0)
        latency = partial(rng.uniform, 0, 0.03)  # replies arrive in another order each run
        with ScriptedServer({"env": hops_environment(table)}, record=False, latency=latency) as server:
            trainer = _trainer(chain_player, tmp_path, name, server, table, steps=2)
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
