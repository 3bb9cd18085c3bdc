"""Where an asynchronous step's seconds went (prompt_r1.training.asynchronous.step_times): the rollout worker's
seconds a group (generate, environment, loop, scoring), and the step's own parts (the wait for samples, training,
the weight sync, the rest), in the step lines and the logged metrics.

The clocks are checked with clock readings the tests give them, so that the parts are known exactly; the wiring
with the real rollout worker (scripted servers, no vLLM) and with TRL's async trainer in this process (fed by a
worker of samples whose group seconds the test chose) is checked by what must add up, never by how long anything
took."""

from __future__ import annotations

import asyncio
import io
import os
import re
from collections import Counter, defaultdict

import pytest
from helpers import tiny_grpo_config

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

# A group's seconds as the worker would put them on its samples: 1 s of rollout, and 0.05 s scoring it.
GROUP = {
    "time/rollout_s": 1.0,
    "time/generate_s": 0.25,
    "time/environment_s": 0.5,
    "time/loop_s": 0.25,
    "time/scoring_s": 0.05,
}


class _Now:
    """A clock that moves only when told."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _line(logs: dict, seconds: float, step: int = 1, last_step: int = 0) -> str:
    from transformers import TrainerControl, TrainerState

    from prompt_r1.training.shared.progress import StepLines

    stream = io.StringIO()
    lines, state = StepLines(stream), TrainerState(max_steps=4, global_step=last_step)
    lines.on_train_begin(None, state, TrainerControl())
    lines._last -= seconds  # the steps since the last line took `seconds`
    state.global_step = step
    lines.on_log(None, state, TrainerControl(), logs={"reward": 0.5, **logs})
    return stream.getvalue()


def test_the_async_step_line_says_where_the_step_and_its_groups_seconds_went():
    step = {"time/wait_s": 0.75, "time/training_s": 0.5, "time/weight_sync_s": 0.25, "time/other_s": 0.5}
    line = _line({**GROUP, **step, "sample/staleness_max": 1.0}, seconds=2.0)
    # The groups' parts as logged, and the step's, which the step clock made add up to its 2 s.
    assert (
        "(rollout 1.00 s a group: generate 0.25, env 0.50, loop 0.25; scoring 0.05 s; "
        "step: wait 0.75 s, training 0.50 s, sync 0.25 s, other 0.50 s)  staleness <= 1" in line
    ), line
    # A line over two steps: the logged figures are means per step, and so is the step's time.
    assert "other 0.50 s)" in _line({**GROUP, **step}, seconds=4.0, step=3, last_step=1)
    # Samples without their group's seconds (replayed, or another worker's): the step's parts alone.
    assert "  (step: wait 0.75 s, training 0.50 s, sync 0.25 s, other 0.50 s)" in _line(step, seconds=2.0)
    # The step clock's rest as logged, not what the line's own time leaves: a clock that misses a part shows it.
    assert "other 0.50 s)" in _line({**GROUP, **step}, seconds=3.0)
    # A synchronous trainer without the step clock: the rollout's parts, then the rest of the step.
    sync = {key: GROUP[key] for key in GROUP if key != "time/scoring_s"}
    assert "(rollout 1.00 s: generate 0.25, env 0.50, loop 0.25; rest 1.00 s)" in _line(sync, seconds=2.0)
    # Generation by turn, where it was logged.
    turns = {"time/generate_turn1_s": 0.15, "time/generate_turn2_s": 0.1, "time/generate_turn3_s": 0.0}
    assert "generate 0.25 (by turn 0.15, 0.10, 0.00), env 0.50" in _line({**sync, **turns}, seconds=2.0)


def test_a_groups_clock_splits_its_wall_time_by_what_its_episodes_wait_for():
    from prompt_r1.training.asynchronous.step_times import GroupClock

    now = _Now(10.0)
    clock = GroupClock(now)
    now.t = 11.0  # 1 s before any episode waits: the loop's
    generating = clock.waiting("generate")
    generating.__enter__()
    now.t = 12.0
    with clock.waiting("environment"):  # one episode waits for the environment while another generates:
        now.t = 13.0  # the group waits for the policy
        generating.__exit__(None, None, None)
        now.t = 15.5  # the environment alone
    now.t = 16.0
    # A generation of no known turn, in a loop of no known most turns: no part by turn.
    assert clock.split() == {"rollout": 6.0, "generate": 2.0, "environment": 2.5, "loop": 1.5}


def test_a_groups_generation_is_shared_among_the_turns_its_episodes_wait_for():
    from prompt_r1.training.asynchronous.step_times import GroupClock

    now = _Now(0.0)
    clock = GroupClock(now, turns=3)
    first = clock.waiting("generate", 0)
    first.__enter__()
    now.t = 1.0  # one episode's first turn alone
    with clock.waiting("generate", 1):
        now.t = 2.0  # two episodes, one at each turn: the moment is shared
        first.__exit__(None, None, None)
        now.t = 4.0  # the second turn alone
    times = clock.split()
    assert times["generate"] == 4.0
    # The third turn, which none reached, is there at 0: a mean over groups counts every group.
    assert {k: v for k, v in times.items() if "turn" in k} == {
        "generate_turn1": 1.5, "generate_turn2": 2.5, "generate_turn3": 0.0
    }  # fmt: skip


def _counting_clock(splits: list | None = None) -> type:
    """The group clock, also counting the calls its group's episodes waited on (`calls`, by part); each split is
    kept in `splits` with those counts."""
    from prompt_r1.training.asynchronous.step_times import GroupClock

    class Counting(GroupClock):
        def __init__(self, **options) -> None:
            super().__init__(**options)
            self.calls: Counter = Counter()

        def waiting(self, part, turn=None):
            self.calls[part] += 1
            return super().waiting(part, turn)

        def split(self):
            times = super().split()
            if splits is not None:
                splits.append((times, dict(self.calls)))
            return times

    return Counting


def test_the_agent_and_the_environment_count_their_calls_on_the_calling_groups_clock():
    from prompt_r1.training.asynchronous.step_times import GroupClock, TimedAgent, TimedEnvironment

    counting = _counting_clock()

    class Agent:
        tokenizer = "the agent's"

        async def generate(self, request):
            await asyncio.sleep(0)  # the other groups' episodes run meanwhile
            return f"output of {request}"

    class Environment:
        retries = 0

        async def respond(self, prompt, history=(), **options):
            await asyncio.sleep(0)
            return f"reply to {prompt}"

    agent, environment = TimedAgent(Agent()), TimedEnvironment(Environment())
    assert agent.tokenizer == "the agent's" and environment.retries == 0  # the wrapped objects' attributes

    async def asks(n: int) -> str:  # an episode that prompts the environment once
        await agent.generate(n)
        return await environment.respond(f"prompt {n}", system_prompt="s")

    async def group(clock: GroupClock, episodes: list) -> list[str]:
        with clock.running():  # the episodes run in tasks of their own, made from the group's
            return await asyncio.gather(*episodes)

    asking, answering = counting(), counting()

    async def both():
        await agent.generate("outside any group")  # counted on no clock
        return await asyncio.gather(
            group(asking, [asks(0), asks(1)]), group(answering, [agent.generate(n) for n in range(3)])
        )

    assert asyncio.run(both())[0] == ["reply to prompt 0", "reply to prompt 1"]
    assert asking.calls == {"generate": 2, "environment": 2} and answering.calls == {"generate": 3}


def test_the_trainers_clock_splits_each_step_into_parts_that_add_up_to_it():
    from prompt_r1.training.shared.step_clock import StepClock

    now, metrics = _Now(0.0), defaultdict(list)
    clock = StepClock(metrics, now)
    clock.synced(5.0)  # TRL's first weight sync, before training begins: no step's
    now.t = 10.0
    clock.on_train_begin(None, None, None)
    for wait in (0.5, 0.25):
        metrics["perf/rollout_wait_s"].append(wait)  # TRL's queue wait for the step's samples
        now.t += wait + 0.25  # the wait, then taking the samples
        clock.on_step_begin(None, None, None)
        now.t += 1.0  # forward, backward, optimizer step
        clock.on_optimizer_step(None, None, None)
        now.t += 0.5
        clock.synced(0.5)  # the weight sync, then the step's other callbacks
        now.t += 0.125
        clock.on_step_end(None, None, None)
        logged = {key: values[-1] for key, values in metrics.items()}
        assert logged["time/step_s"] == pytest.approx(wait + 1.875)
        assert logged["time/wait_s"] == wait and logged["time/training_s"] == 1.0
        assert logged["time/weight_sync_s"] == 0.5 and logged["time/other_s"] == pytest.approx(0.375)
        metrics.clear()  # TRL's log empties the sink: the next step's wait is a new list's


def test_the_worker_times_each_group_and_puts_its_seconds_on_its_samples(tmp_path, monkeypatch):
    from test_door_async import _groups

    from prompt_r1.training.asynchronous import worker as worker_module

    splits = []
    monkeypatch.setattr(worker_module, "GroupClock", _counting_clock(splits))
    samples, _, _ = _groups(tmp_path, copy=True, groups=3)
    # Every finished group's 4 episodes each asked the agent twice and the environment once, on its own clock.
    assert splits and all(calls == {"generate": 8, "environment": 4} for _, calls in splits)
    rollouts = {times["rollout"] for times, _ in splits}
    for sample in samples:
        seconds = sample.metrics
        assert seconds["time/rollout_s"] in rollouts  # its own group's
        parts = [seconds[f"time/{part}_s"] for part in ("generate", "environment", "loop")]
        assert sum(parts) == pytest.approx(seconds["time/rollout_s"]) and min(parts) >= 0
        # Its generation by turn: each episode's two turns took some, and the turns add up to the generation.
        turns = [value for key, value in seconds.items() if key.startswith("time/generate_turn")]
        assert sum(turns) == pytest.approx(seconds["time/generate_s"]) and min(turns[:2]) > 0
        assert seconds["time/scoring_s"] >= 0


class _SampleQueue:
    """The worker's queue, never empty: samples of the policy version of the moment, two to a group, each with
    the group's seconds of `GROUP`. Each step's first sample takes `wait_s` to come."""

    def __init__(self, worker, tokenizer, per_step: int, wait_s: float) -> None:
        self.worker, self.per_step, self.wait_s, self.taken = worker, per_step, wait_s, 0
        self.ids = tokenizer("The name is Ada.")["input_ids"]

    def get(self, timeout=None):
        import time

        import numpy as np
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        if self.taken % self.per_step == 0:
            time.sleep(self.wait_s)
        self.taken += 1
        n = len(self.ids)
        return RolloutSample(
            prompt="Which name?",
            completion=[{"role": "assistant", "content": "Ada"}],
            input_ids=np.asarray(self.ids, dtype=np.int64),
            completion_mask=np.asarray([0] * (n - 3) + [1] * 3, dtype=np.int64),
            old_log_probs=np.asarray([0.0] * (n - 3) + [-1.0] * 3, dtype=np.float32),
            advantage=1.0 if self.taken % 2 else -1.0,
            model_version=self.worker.model_version,
            group_id=self.taken // 2,
            metrics={"reward": 1.0, **GROUP},
            enqueued_at=time.time(),
        )

    def qsize(self) -> int:
        return 0


class _Worker:
    """In the rollout worker's place: its queue and the rest of TRL's worker protocol."""

    def __init__(self, tokenizer, per_step: int, wait_s: float) -> None:
        import queue

        self.model_version = 0
        self.rollout_buffer = _SampleQueue(self, tokenizer, per_step, wait_s)
        self.metrics_queue = queue.Queue()

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None: ...


class _Transfer:
    """The weight transfer, taking `seconds` to send the weights."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def init_weight_transfer(self) -> None: ...

    def pause(self) -> None: ...

    def send_weights(self, iterator) -> None:
        import time

        for _ in iterator:
            pass
        time.sleep(self.seconds)

    def resume(self) -> None: ...

    def destroy(self) -> None: ...


def test_the_async_trainers_step_lines_and_metrics_carry_the_parts_and_they_add_up(tmp_path, capsys):
    """TRL's async trainer in this process, fed by a worker whose samples carry the group seconds of `GROUP`:
    each step line shows them, and the step's own parts, which add up to the step's time in the metrics too."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from prompt_r1.testing.tiny_models import build_tiny_model
    from prompt_r1.training.asynchronous import on_cpu
    from prompt_r1.training.asynchronous.trainer import trainer_class
    from prompt_r1.training.shared import progress

    model = build_tiny_model(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(model)
    config = tiny_grpo_config(
        tmp_path / "out",
        model,
        async_grpo=True,
        bf16=False,
        max_steps=3,
        vllm_server_base_url="http://127.0.0.1:9",
    )
    per_step = config.per_device_train_batch_size
    with on_cpu.cpu_trainer("cpu"):
        trainer = trainer_class()(
            model=str(model),
            args=config,
            train_dataset=Dataset.from_list([{"prompt": "Which name?"}] * 8),
            processing_class=tokenizer,
            rollout_worker=_Worker(tokenizer, per_step, wait_s=0.05),
            weight_transfer=_Transfer(0.05),
        )
    on_cpu.install(trainer.accelerator.device)
    progress.install(trainer)
    trainer.train()

    err = capsys.readouterr().err
    step = r"step: wait ([\d.]+) s, training ([\d.]+) s, sync ([\d.]+) s, other ([\d.]+) s"
    lines = re.findall(
        r"step (\d)/3  .*  [\d.]+ s  \(rollout 1\.00 s a group: generate 0\.25, env 0\.50, loop 0\.25; "
        rf"scoring 0\.05 s; {step}\)  staleness <= \d",
        err,
    )
    assert [found[0] for found in lines] == ["1", "2", "3"], err[-3000:]
    logged = [row for row in trainer.state.log_history if "time/step_s" in row]
    assert len(logged) == 3
    for row in logged:
        parts = [row[f"time/{part}_s"] for part in ("wait", "training", "weight_sync", "other")]
        # "other" is what the named parts leave of the step: a negative one would be a wait counted twice.
        assert row["time/other_s"] >= 0 and sum(parts) == pytest.approx(row["time/step_s"])
        # The wait is TRL's own figure for the step; the sync is the trainer's, each of which sends the weights.
        assert row["time/wait_s"] == row["perf/rollout_wait_s"] > 0.04  # the queue took 0.05 s
        assert row["time/weight_sync_s"] > 0.04 and row["time/training_s"] > 0
        assert row["time/generate_s"] == GROUP["time/generate_s"]  # the groups' own, averaged
