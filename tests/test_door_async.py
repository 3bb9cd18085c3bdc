"""The door-codes task under the asynchronous trainer (prompt_r1.tasks.door_async): each group of episodes plays
a table of its own, the environment answers every episode from its group's table, and the golden answers and the
door figures come from the same one.

The fast tests run the real rollout worker (the LangGraph loop, the rate-limited environment client over HTTP,
the project's reward) with a scripted served agent in place of vLLM. The slow one is a short async run of a door
agent served by `vllm serve` (vLLM's CPU build)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import re
import time

import pytest
from helpers import wait_for

from prompt_r1.agents.batching import derive_seed
from prompt_r1.tasks.door_codes import (
    CODES,
    DOORS,
    DoorTable,
    door_codes,
    door_environment,
    named_doors,
    question_for,
    table_mark,
    training_rows,
)
from prompt_r1.testing.servers import ScriptedServer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def test_a_group_table_is_drawn_from_the_seed_and_the_group_and_is_no_step_table():
    table = DoorTable(seed=5)
    groups = [dict(table.group_codes(g)) for g in range(40)]
    assert groups[3] == DoorTable(seed=5).group_codes(3)  # a rerun's group 3 plays the same table
    assert groups[3] != DoorTable(seed=6).group_codes(3)
    for door in DOORS:  # no door keeps its code from group to group: nothing to learn by heart
        assert len({t[door] for t in groups}) > 3
    steps = [dict(table.draw(step)) for step in range(40)]
    assert not any(g == s for g in groups for s in steps)
    # The synchronous tables are what they were: the seed and the step alone.
    assert table.draw(7) == door_codes(derive_seed(5, 7))


def test_the_environment_answers_from_the_table_its_request_names():
    table = DoorTable(seed=2)
    respond = door_environment(table)

    def ask(door: str, system: str | None) -> str:
        messages = [{"role": "system", "content": system}] if system is not None else []
        return respond({"messages": [*messages, {"role": "user", "content": question_for(door)}]})

    table.draw(4)
    assert ask("ruby", "You are helpful.") == f"The ruby door code is {table.codes['ruby']}."  # the step's
    for group in (0, 9, 123):
        code = table.group_codes(group)["ruby"]
        assert ask("ruby", f"You are helpful.\n{table_mark(group)}") == f"The ruby door code is {code}."
    table.reply = "lying"
    lie = ask("ruby", table_mark(9)).rsplit(" ", 1)[1].rstrip(".")
    assert lie in CODES and lie != table.group_codes(9)["ruby"]


def _door_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from prompt_r1.core.prompts import INSTRUCTION_TEMPLATE
    from prompt_r1.testing.tiny_models import build_tiny_model

    corpus = [f"{question_for(d)} The {d} door code is {c}." for d in DOORS for c in CODES]
    tags = [f"<{t}>" for t in ("think", "interaction_prompt", "answer", "interaction_response")]
    tags += [t.replace("<", "</") for t in tags]  # one token each, as the door agents' tokenizer has them
    path = build_tiny_model(
        tmp_path / "agent", corpus=corpus, added_tokens=[INSTRUCTION_TEMPLATE, *tags], heads=2, kv_heads=1
    )
    return path, AutoTokenizer.from_pretrained(path)


def _door_agent(tokenizer, *, copy: bool, never_answers: bool = False):
    """A served agent (completions on token ids, as vLLM's) that asks about its question's door, then answers
    with the reply's code (`copy`) or always with the first code, ignoring the reply; or asks again and again
    (`never_answers`)."""

    def respond(body: dict) -> str:
        text = tokenizer.decode(body["prompt"])
        reply = re.findall(r"door code is (\w+)\.", text)
        if not reply or never_answers:  # the first turn
            door = named_doors(text.split("Which code opens the ")[-1].split("?")[0])[0]
            return f"<think>ask</think><interaction_prompt>{question_for(door)}</interaction_prompt>"
        return f"<think>ok</think><answer>{reply[-1] if copy else CODES[0]}</answer>"

    return respond


@contextlib.contextmanager
def _door_worker(
    tmp_path, *, copy: bool, groups: int, seed: int = 11, never_answers: bool = False, **options
):
    """The real rollout worker with the task's options (and `options`), started against a scripted agent server
    and the task's environment; yields (worker, environment server, table), stopped on exit."""
    from prompt_r1.agents.served import ServedAgent
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import AgentConfig
    from prompt_r1.tasks.door_async import door_worker_options
    from prompt_r1.tasks.door_training import grpo_config
    from prompt_r1.tasks.skeleton_async import GroupKeyedEnvironment
    from prompt_r1.training.asynchronous.worker import GraphRolloutWorker
    from prompt_r1.training.shared.rewards import reward_functions
    from prompt_r1.training.sync.rollout import GraphRollout

    path, tokenizer = _door_tokenizer(tmp_path)
    table = DoorTable(seed)
    agent_server = ScriptedServer(
        {"agent": _door_agent(tokenizer, copy=copy, never_answers=never_answers)},
        tokenizer=tokenizer,
        vllm_version="0.31.0",
        model_roots={"agent": str(path)},
    )
    with agent_server as served, ScriptedServer({"env": door_environment(table)}) as env:
        config = grpo_config(tmp_path / "out", path, env.base_url, num_generations=4)
        environment = GroupKeyedEnvironment(EnvironmentClient(config.environment_config()), table_mark)
        agent = ServedAgent(
            AgentConfig(
                model="agent",
                base_url=served.base_url,
                token_exact="on",
                tokenizer=str(path),
                max_new_tokens=32,
            ),
            api_key="unused-key",
        )
        worker = GraphRolloutWorker(
            training_rows(groups, seed=seed),
            agent=agent,
            environment=environment,
            rollout=GraphRollout(environment, loop=config.loop_config()),
            rewards=reward_functions(config),
            num_generations=4,
            **{"max_inflight": 16, **door_worker_options(table), **options},  # 16: four groups at once
        )
        worker.start()
        try:
            yield worker, env, table
        finally:
            worker.stop()


def _groups(tmp_path, *, copy: bool, groups: int, seed: int = 11):
    """Run the real rollout worker with the task's options until `groups` groups are queued; returns the samples,
    the environment's recorded requests and the table."""
    samples = []
    with _door_worker(tmp_path, copy=copy, groups=groups, seed=seed) as (worker, env, table):
        deadline = time.monotonic() + 120
        while len(samples) < 4 * groups and time.monotonic() < deadline:
            worker.check_health(60)
            with contextlib.suppress(queue.Empty):
                samples.append(worker.rollout_buffer.get(timeout=1))
        requests = list(env.requests)
    assert len(samples) >= 4 * groups, "the worker did not queue its groups in time"
    return samples, requests, table


@pytest.mark.parametrize("bound_queued", [True, False])
def test_the_worker_starts_no_group_beyond_max_inflight_counting_the_samples_queued(tmp_path, bound_queued):
    """Samples queued and not yet taken count against max_inflight as those in flight do: a trainer slower than
    the rollouts gets no groups that would come too late for it (and take its CPU meanwhile). Without the bound
    (as before) the worker runs on while nothing is taken."""
    with _door_worker(tmp_path, copy=True, groups=40, max_inflight=8, bound_queued=bound_queued) as (
        worker,
        _,
        _,
    ):
        if not bound_queued:  # runs ahead of a trainer that takes nothing
            wait_for(lambda: worker.rollout_buffer.qsize() > 8, "more than 8 samples queued", timeout=60)
            return
        wait_for(lambda: worker.rollout_buffer.qsize() >= 8, timeout=60)  # two groups of 4: the bound
        time.sleep(2.0)  # time enough for more groups against a scripted server answering at once
        worker.check_health(60)
        queued, started = worker.rollout_buffer.qsize(), worker.groups_done + len(worker.running)
        assert queued == 8 and started == 2
        for _ in range(4):  # the trainer takes a group's samples: room for one more group
            worker.rollout_buffer.get(timeout=1)
        wait_for(lambda: worker.groups_done == 3, timeout=60)
        time.sleep(0.5)
        assert worker.groups_done == 3 and worker.rollout_buffer.qsize() == 8


@pytest.mark.parametrize(("max_inflight", "headroom"), [(12, 4), (8, 8)])
def test_the_worker_keeps_its_headroom_free_but_always_a_steps_worth(tmp_path, max_inflight, headroom):
    """`headroom` samples of max_inflight stay free (groups in flight that come back late are dropped as stale),
    but never below one step's worth: 12 - 4 and max(8 - 8, 8) both leave room for two groups of 4."""
    with _door_worker(tmp_path, copy=True, groups=40, max_inflight=max_inflight, headroom=headroom) as (
        worker,
        _,
        _,
    ):
        wait_for(lambda: worker.rollout_buffer.qsize() >= 8, timeout=60)
        time.sleep(2.0)  # time enough for more groups against a scripted server answering at once
        worker.check_health(60)
        assert worker.rollout_buffer.qsize() == 8 and worker.groups_done + len(worker.running) == 2


def test_every_episode_is_answered_and_scored_from_its_own_groups_table(tmp_path):
    from transformers import AutoTokenizer

    samples, requests, table = _groups(tmp_path, copy=True, groups=12)
    # Each request names its group; the environment's reply is that group's code for the door asked.
    marked = set()
    for request in requests:
        system = request.body["messages"][0]["content"]
        group = int(re.search(r"\[door table (\d+)\]", system).group(1))
        door = named_doors(request.body["messages"][-1]["content"])[0]
        marked.add(group)
        assert door in DOORS and group >= 0
    assert len(marked) >= 12
    # An agent that copies the reply is always right against the golden answers of its group's table: both come
    # from the same draw, however the groups' episodes interleave.
    assert all(s.metrics["reward"] == pytest.approx(1.0) for s in samples)
    assert all(s.metrics["door/correct_from_reply"] == 1.0 for s in samples)
    assert all(s.metrics["door/asked_right"] == 1.0 for s in samples)
    # The reply each episode read is its own group's code for its question's door.
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "agent")
    for s in samples:
        text = tokenizer.decode(s.input_ids)
        door = named_doors(text.split("Which code opens the ")[1].split("?")[0])[0]
        assert f"The {door} door code is {table.group_codes(s.group_id)[door]}." in text
    assert len({s.group_id for s in samples}) >= 12
    assert len({json.dumps(table.group_codes(g)) for g in range(12)}) == 12


def test_an_agent_that_ignores_the_reply_is_right_only_by_chance(tmp_path):
    """Always answering the same code: right where the group's table gives the question's door that code, about
    1 time in 8, as in the synchronous task."""
    samples, _, _ = _groups(tmp_path, copy=False, groups=48)
    correct = [s.metrics["door/correct"] for s in samples]
    share = sum(correct) / len(correct)
    assert 0.03 < share < 0.25, share  # 48 groups: 1/8 give or take sampling
    assert json.dumps([s.metrics for s in samples])  # the metrics are plain numbers the trainer can average


def test_an_agent_calling_until_max_turns_is_logged_and_the_step_lines_say_it_is_stuck(tmp_path):
    """The async worker logs each episode's ending as the synchronous rollout does, so the step lines' stuck
    sign "called the environment until max_turns" fires under the async trainer too."""
    from types import SimpleNamespace

    from prompt_r1.training.shared.progress import StepLines

    samples = []
    with _door_worker(tmp_path, copy=True, groups=2, never_answers=True) as (worker, _, _):
        deadline = time.monotonic() + 120
        while len(samples) < 8 and time.monotonic() < deadline:
            worker.check_health(60)
            with contextlib.suppress(queue.Empty):
                samples.append(worker.rollout_buffer.get(timeout=1))
    assert len(samples) == 8
    assert all(s.metrics["episode/status_max_turns"] == 1.0 for s in samples)
    assert all(s.metrics["episode/status_answered"] == 0.0 for s in samples)
    lines, state = StepLines(stream=io.StringIO(), stuck_steps=2), SimpleNamespace(is_world_process_zero=True)
    logs = {key: sum(s.metrics[key] for s in samples) / len(samples) for key in samples[0].metrics}
    for step in (1, 2):  # what the trainer logs: the samples' metrics averaged
        state.global_step, state.max_steps = step, 2
        lines.on_log(None, state, None, logs=logs)
    assert any("until max_turns" in warning for warning in lines.warnings)


def test_the_benchmark_prints_async_beside_sync_with_the_sync_spread_and_a_verdict_per_seed():
    from helpers import ROOT, load_script

    bench = load_script(ROOT / "evals" / "bench" / "learning.py", "learning_bench")

    def run(seed, gain, collapsed=False, after=0.9):
        return {
            "seed": seed,
            "gain": gain,
            "collapsed": collapsed,
            "after": {"from_reply": after},
            "series": {},
        }

    sync = [run(1, 0.5), run(2, 0.6), run(3, 0.4)]
    runs = [
        run(1, 0.45),
        run(2, 0.7),
        run(3, 0.1, collapsed=True, after=0.2),
        {"seed": 4, "build_error": "x"},
    ]
    lines = bench.comparison(sync, runs).splitlines()
    assert lines[1].split()[:3] == ["1", "+0.50", "+0.45"] and lines[1].endswith("within the sync spread")
    assert lines[2].endswith("above the sync spread")
    assert "90% / 20%" in lines[3] and lines[3].endswith("below the sync spread; COLLAPSED")
    assert "not trained" in lines[4]
    assert lines[-1] == (
        "async vs sync: mean gain +0.42 vs +0.50; sync spread +0.40 to +0.60 over 3 seeds; 2/3 async seeds "
        "within or above it without collapsing; 1 collapsed (sync: 0)"
    )


# ---- on vLLM's CPU build -------------------------------------------------------------------------------------------


def _reading_agent(path, seed: int = 0):
    """A door agent of the served shape after a short reading stage alone (seconds): it asks about the
    question's door and copies the reply's code some of the time (about a third after 200 steps)."""
    from prompt_r1.core.prompts import INSTRUCTION_TEMPLATE
    from prompt_r1.tasks.door_codes import ANSWER, SERVED_SHAPE, reading_episodes
    from prompt_r1.testing.tiny_models import build_protocol_model

    corpus = [f"{question_for(d)} The {d} door code is {c}." for d in DOORS for c in CODES]
    corpus += [ANSWER.format(thought="ok", code=c) for c in CODES]
    tags = [f"<{t}>" for t in ("think", "interaction_prompt", "answer", "interaction_response")]
    tags += [t.replace("<", "</") for t in tags]
    return build_protocol_model(
        path,
        reading_episodes(256, seed=seed),
        corpus=corpus,
        added_tokens=[INSTRUCTION_TEMPLATE, *tags],
        seed=seed,
        batch_size=64,
        steps=200,
        **SERVED_SHAPE,
    )


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_a_short_async_door_run_trains_on_each_groups_table_and_stops_its_server(tmp_path):
    pytest.importorskip("vllm", reason="the vllm extra is not installed")
    from prompt_r1.tasks.door_async import train_async
    from prompt_r1.tasks.door_training import DOOR_METRICS
    from prompt_r1.training.shared.progress import step_series

    model = _reading_agent(tmp_path / "agent")
    table = DoorTable(3)
    with ScriptedServer({"env": door_environment(table)}, latency=0.05) as env:
        run = train_async(
            model,
            table,
            training_rows(64, seed=3),
            env.base_url,
            tmp_path / "run",
            seed=3,
            held_out_step=10**9,
            per_device_train_batch_size=16,
            num_generations=8,
            max_steps=3,
            max_staleness=1,
        )
    assert run["server_returncode"] is not None  # the vLLM server was stopped
    series = step_series(run["log_history"], extra=DOOR_METRICS)
    assert len(series["reward"]) == 3
    for name in DOOR_METRICS:  # logged every step from the worker's samples, as shares
        assert all(0.0 <= v <= 1.0 for v in series[name]), (name, series[name])
    # Answered from the reply only after asking about the question's door, and then rightly (a share of `correct`).
    for asked, correct, from_reply in zip(*(series[name] for name in DOOR_METRICS), strict=True):
        assert from_reply <= min(asked, correct)
    assert sum(series["door/correct_from_reply"]) > 0  # the reading agent asks and copies, some of the time
    # The async trainer's config, with the synchronous benchmark's KL term, logged every step.
    assert run["config"].async_grpo and run["config"].beta == 0.04
    assert len([row["ref_kl"] for row in run["log_history"] if "ref_kl" in row]) == 3
    # Evaluated as the synchronous benchmark evaluates, on a held-out table.
    for figures in (run["before"], run["after"]):
        assert set(figures) == {"honest", "withheld", "lying", "asked_right", "from_reply"}
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_the_spend_cap_is_held_by_the_worker_and_every_call_it_paid_for_is_counted(tmp_path):
    """max_env_calls under --async: the real worker, gated by the cap (`AsyncSpendCap.may_start`), starts no group
    whose calls could take the run past it, and every call it paid for is counted and on disk in the call ledger,
    keyed by its group, whether or not its samples are ever trained."""
    from prompt_r1.agents.served import ServedAgent
    from prompt_r1.clients.costs import PriceTable
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import AgentConfig
    from prompt_r1.tasks.door_async import door_worker_options
    from prompt_r1.tasks.door_training import grpo_config
    from prompt_r1.tasks.skeleton_async import GroupKeyedEnvironment
    from prompt_r1.training.asynchronous.spend import AsyncSpendCap
    from prompt_r1.training.asynchronous.worker import GraphRolloutWorker
    from prompt_r1.training.shared.ledger import CallLedger, LedgerEnvironment, ledger_path
    from prompt_r1.training.shared.rewards import reward_functions
    from prompt_r1.training.sync.rollout import GraphRollout

    path, tokenizer = _door_tokenizer(tmp_path)
    table = DoorTable(3)
    served = ScriptedServer(
        {"agent": _door_agent(tokenizer, copy=True)}, tokenizer=tokenizer, vllm_version="0.31.0",
        model_roots={"agent": str(path)},
    )  # fmt: skip
    with served, ScriptedServer({"env": door_environment(table)}, latency=0.05) as env:
        config = grpo_config(tmp_path / "out", path, env.base_url, num_generations=4)
        ledger = CallLedger.open(ledger_path(config.output_dir, 0), {"seed": 3})
        environment = LedgerEnvironment(
            GroupKeyedEnvironment(EnvironmentClient(config.environment_config()), table_mark),
            ledger,
            PriceTable.load(None),
        )
        agent = ServedAgent(
            AgentConfig(model="agent", base_url=served.base_url, token_exact="on", tokenizer=str(path),
                        max_new_tokens=32),
            api_key="unused-key",
        )  # fmt: skip
        worker = GraphRolloutWorker(
            training_rows(40, seed=3), agent=agent, environment=environment,
            rollout=GraphRollout(environment, loop=config.loop_config()), rewards=reward_functions(config),
            num_generations=4, max_inflight=64, **door_worker_options(table),
        )  # fmt: skip
        # A group may make 4 episodes x 2 turns = 8 calls; each of these episodes makes one. Nothing takes the
        # samples here, and queued samples count against max_inflight: it is set high, so the cap is what stops.
        cap = AsyncSpendCap(None, environment, worker, group_calls=8, max_calls=22)
        worker.may_start = cap.may_start
        worker.start()
        try:
            wait_for(lambda: worker.capped is not None and not worker.running, "the worker to be capped", 120)
            worker.check_health(60)
        finally:
            worker.stop()
        paid = len(env.requests)
    assert "max_env_calls 22" in worker.capped
    assert (
        14 < paid <= 22
    )  # up to the cap, never past it: the last group's 8 possible calls would have passed it
    assert ledger.totals()["calls"] == environment.take().calls == paid  # every paid call counted and on disk
    groups = worker.groups_done
    assert (
        ledger.totals()["steps"] == groups and groups * 4 == paid
    )  # keyed by group: one call an episode here


def test_a_group_keyed_environment_takes_one_of_mark_or_system():
    from prompt_r1.tasks.skeleton_async import GroupKeyedEnvironment

    for keyed in ({}, {"mark": table_mark, "system": str}):
        with pytest.raises(TypeError, match="one of mark or system"):
            GroupKeyedEnvironment(object(), **keyed)
