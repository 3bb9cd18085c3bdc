"""The LangGraph loop as the rollout worker of TRL's `AsyncGRPOTrainer` (`RolloutWorkerProtocol`).

    worker = GraphRolloutWorker(rows, agent=ServedAgent(...), environment=EnvironmentClient(...), rollout=...,
                                rewards=reward_functions(config), num_generations=8, max_inflight=32)
    AsyncGRPOTrainer(..., rollout_worker=worker, weight_transfer=...)

Episodes keep flowing while the trainer trains. The worker runs on the process-wide event loop
(`prompt_r1.core.aio`), so the environment client's rate limiter, retries and connections are those of every
other surface. It keeps up to `max_inflight` episodes, less its `headroom`, in flight or queued and not yet
trained, as whole groups of `num_generations` episodes of one question, each through the shared
`EpisodeRunner`. The headroom narrows the groups in flight too, with or without the bound on queued samples. The
agent is served by vLLM on the token-exact completions path (`ServedAgent` with a tokenizer), so every turn's
sampled ids and their sampling log-probabilities are kept.

A finished group is scored with the project's reward (the same reward functions as synchronous training, on
the same columns). Each episode becomes one `RolloutSample`:
- `input_ids`: prompt + trajectory, exactly as `Trajectories.to_trajectories` gives it to the sync trainer;
- `completion_mask`: 0 over the prompt, then the trajectory's `env_mask` (the environment's tokens are never
  trained on);
- `old_log_probs`: the sampling log-probabilities, aligned with `input_ids`;
- `advantage`: (reward − group mean) / (group std + 1e-8), as TRL's own worker computes it;
- `model_version`: the policy version live when the episode started, the oldest policy that sampled any of
  its tokens.
An episode whose environment failed after its retries has no reward (as in sync training). It is left out of
its group's baseline and not queued, and it is counted.

The trainer drops samples older than `max_staleness` versions when it takes them (`sample/dropped_stale_total`,
`sample/staleness_max`) and corrects the rest with its clipped importance ratio against `old_log_probs`.

The worker's own measures go to `metrics_queue` every group: episodes, failures, environment calls and latency,
cost, groups in flight. The per-episode figures the progress lines read (reward and its parts, turns,
environment calls, agent tokens) ride on each sample's `metrics`, which the trainer averages per step; so do the
seconds of the sample's group, by part, for the step lines' breakdown (`step_times.GroupClock`: `time/rollout_s`,
`time/generate_s`, `time/environment_s`, `time/loop_s`, and `time/scoring_s`, the worker's scoring of the group).

A run must not hang on a dead server. An episode the agent could not finish (the vLLM server gone) stops the
worker. So do `max_failed_groups` groups in a row in which the environment answered no call. `check_health`,
which the trainer calls whenever it waits, then raises that error as one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from prompt_r1.core.aio import background_loop
from prompt_r1.core.errors import PromptR1Error
from prompt_r1.loop.graph import STATUSES, build_graph
from prompt_r1.runs.episode import Episode, EpisodeRunner
from prompt_r1.training.asynchronous.step_times import GroupClock, TimedAgent, TimedEnvironment
from prompt_r1.training.shared.ledger import call_scope
from prompt_r1.training.shared.progress import time_metrics
from prompt_r1.training.shared.trajectories import Trajectories, question_of

__all__ = ["GraphRolloutWorker", "IdleClock", "RolloutFailed", "group_advantages"]


class RolloutFailed(PromptR1Error, RuntimeError):
    """The rollout worker cannot go on (the agent's server or the environment is gone)."""


class IdleClock:
    """Seconds the worker generated nothing: no group under way (none started, or all finished and waiting for
    room in the queue), or the agent's server paused for a weight sync (requests frozen). What the overlap
    benchmark reads as the worker's idle share (`evals/bench/grpo_step.py --async`); safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active, self._paused = 0, False
        self._since = time.monotonic()
        self._idle_s = 0.0

    def _mark(self) -> None:  # under the lock: close the interval that ends now
        now = time.monotonic()
        if self._active == 0 or self._paused:
            self._idle_s += now - self._since
        self._since = now

    def busy(self, delta: int) -> None:
        """A group started generating (+1) or stopped (-1)."""
        with self._lock:
            self._mark()
            self._active += delta

    def paused(self, paused: bool) -> None:
        """The agent's server paused (True) or resumed (False)."""
        with self._lock:
            self._mark()
            self._paused = paused

    def idle_s(self) -> float:
        """Idle seconds since the worker was built."""
        with self._lock:
            self._mark()
            return self._idle_s


def group_advantages(rewards: Sequence[float | None]) -> list[float | None]:
    """(r − mean) / (std + 1e-8) over the group's scored episodes (population std, as TRL's async worker); None
    stays None (an episode without a reward has no advantage)."""
    scored = [r for r in rewards if r is not None]
    if not scored:
        return [None] * len(rewards)
    mean = sum(scored) / len(scored)
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored))
    return [None if r is None else (r - mean) / (std + 1e-8) for r in rewards]


class GraphRolloutWorker:
    """`RolloutWorkerProtocol` for `AsyncGRPOTrainer`: groups of Prompt-R1 episodes, scored, as `RolloutSample`s.

    rows: training rows (`prompt`, `golden_answers`), cycled in order; agent: a token-exact agent (a vLLM-served
    `ServedAgent` with its tokenizer); environment: the environment client; rollout: a `Trajectories` (its loop
    settings and its `to_trajectories`, shared with sync training); rewards: the reward functions, the first the
    total (trained on), the others logged; max_inflight: most episodes in flight, an int or a callable read at
    `start` (the trainer resolves its `max_inflight_tasks` after the worker is built); headroom: samples of it kept
    free, at most down to one step's worth (the trainer passes one step's samples when TRL sized the bound).

    Each group has an index, counted from 0 in the order groups start; its episodes carry it in their run config's
    metadata (`rollout_group`), which every environment call sees. A task whose facts differ per group (the
    door-codes task draws a table per group) passes `group_row(group, row)`, the row a group plays (its golden
    answers), and `episode_metrics(group, row, episode)`, figures of its own added to each sample's metrics and
    averaged per step by the trainer."""

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        *,
        agent: Any,
        environment: Any,
        rollout: Trajectories,
        rewards: Sequence[Callable[..., list]],
        num_generations: int,
        max_inflight: int | Callable[[], int],
        queue_maxsize: int = 1024,
        max_failed_groups: int = 3,
        price: Callable[[dict[str, Any]], float | None] | None = None,
        group_row: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None,
        episode_metrics: Callable[[int, dict[str, Any], Episode], dict[str, float]] | None = None,
        may_start: Callable[[set[int]], str | None] | None = None,
        bound_queued: bool = True,
        headroom: int = 0,
    ) -> None:
        if getattr(agent, "tokenizer", None) is None:
            raise RolloutFailed(
                "the async rollout worker needs a token-exact agent (a vLLM server and the agent's tokenizer): "
                f"{getattr(agent, 'token_exact', 'no tokenizer')}"
            )
        if not rows:
            raise RolloutFailed("the async rollout worker has no training rows")
        self.rows, self.agent, self.environment, self.rollout = list(rows), agent, environment, rollout
        self.rewards, self.num_generations = list(rewards), num_generations
        self._max_inflight, self.max_failed_groups = max_inflight, max_failed_groups
        self.price = (
            price  # an episode's state -> its dollars (the environment's calls), for rollout/cost_usd_total
        )
        self.group_row, self.episode_metrics = group_row, episode_metrics
        # Samples queued and not yet taken count against `max_inflight` as those in flight do: a group started
        # behind more than that would come too late to be trained (TRL sizes max_inflight_tasks as max_staleness
        # steps of samples), and where the trainer is the slower side it would take the CPU or GPU from it.
        self.bound_queued = bound_queued
        # Samples of `max_inflight` kept free (floored at one step's worth, so a small bound still fills a step).
        # Groups in flight finish at different times: with a full `max_staleness` steps of them started, the slowest
        # come back more than `max_staleness` versions late and the trainer drops them, their calls paid for nothing.
        self.headroom = headroom
        # The spend caps' gate (`prompt_r1.training.asynchronous.spend`): given the groups in flight, why the next
        # group must not start (None: it may). `capped` is that reason once no group can start any more.
        self.may_start, self.capped = may_start, None
        self._draining = threading.Event()
        self.rollout_buffer: queue.Queue = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue = queue.Queue()
        self.model_version = 0
        # The first group's number: groups are numbered in row order, so a resumed run starts past the ones trained.
        self.start_group = 0
        # Each finished group's policy version (None: it had no scored episode, so nothing of it can be trained):
        # what a checkpoint needs to tell a group still to come from one that will never be trained.
        self.finished: dict[int, int | None] = {}
        self.groups_done = self.samples_queued = self.failed_episodes = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._future: Any = None
        self._heartbeat = time.time()
        self._failed_in_a_row = 0
        self.running: set[int] = set()  # the groups started and not finished
        self.idle = IdleClock()

    # ---- RolloutWorkerProtocol -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start producing groups on the process-wide event loop (called by the trainer after its first sync)."""
        if self._future is not None:
            return
        self._heartbeat = time.time()
        self._future = asyncio.run_coroutine_threadsafe(self._produce(), background_loop())

    def stop(self) -> None:
        """Stop producing: episodes in flight are cancelled, nothing more is queued."""
        self._stop.set()
        if self._future is not None and not self._future.done():
            self._future.cancel()
            # Cancelled, or the error check_health reports: either way the worker is done.
            with contextlib.suppress(BaseException):
                self._future.result(timeout=30)

    def drain(self, timeout: float = 600.0) -> None:
        """Start no more groups and wait, up to `timeout` s, for those in flight to finish (their calls are paid
        and counted, their samples queued): what a stop at the spend cap does before its checkpoint."""
        self._draining.set()
        if self._future is not None:
            with contextlib.suppress(BaseException):  # done, or the error check_health reports
                self._future.result(timeout=timeout)

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None:
        """Raise `RolloutFailed` if the worker stopped on an error, died, or produced nothing for `stale_after_s`."""
        if self.error is not None:
            raise RolloutFailed(self.error)
        if self.capped is not None and not self.running and self.rollout_buffer.empty():
            from prompt_r1.training.shared.spend import SpendCapReached

            # The trainer waits for samples no group will bring (some dropped as stale or unscored).
            raise SpendCapReached(
                f"the rollout worker can start no more groups ({self.capped}) and the trainer has too few samples "
                "for its step; the last checkpoint is the run's: resume with a higher cap to go on"
            )
        ended = self._stop.is_set() or self._draining.is_set() or self.capped is not None  # on purpose
        if self._future is not None and self._future.done() and not ended:
            exc = None if self._future.cancelled() else self._future.exception()
            raise RolloutFailed(f"the rollout worker stopped: {exc!r}")
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            raise RolloutFailed(
                f"the rollout worker finished no group in {age:.0f} s (heartbeat_stale_after_s {stale_after_s:.0f}): "
                "the agent's vLLM server or the environment is not answering"
            )

    # ---- production ------------------------------------------------------------------------------------------

    async def _produce(self) -> None:
        limit = self._max_inflight() if callable(self._max_inflight) else self._max_inflight
        limit = max(limit - self.headroom, min(limit, self.headroom))
        slots = asyncio.Semaphore(max(1, limit // self.num_generations))  # whole groups
        # Each group's episodes count their calls on its clock (`_group`).
        agent, environment = TimedAgent(self.agent), TimedEnvironment(self.environment)
        graph = build_graph(agent, environment, loop=self.rollout.loop, token_exact=True)
        runner = EpisodeRunner(
            agent,
            environment,
            self.rollout.loop,
            graph=graph,
            price=self.price,
            tags=["async-rollout"],
        )
        tasks: set[asyncio.Task] = set()
        try:
            for group_id in itertools.count(self.start_group):
                await slots.acquire()
                await self._room_ahead(limit)
                if not await self._may_go_on(tasks):
                    slots.release()
                    # Drained or capped: the groups in flight finish (their calls are paid), none starts.
                    await asyncio.gather(*tasks, return_exceptions=True)
                    break
                row = self.rows[group_id % len(self.rows)]
                if self.group_row is not None:
                    row = self.group_row(group_id, row)
                task = asyncio.get_running_loop().create_task(self._group(runner, group_id, row))
                tasks.add(task)
                self.running.add(group_id)
                task.add_done_callback(
                    lambda t, g=group_id: (tasks.discard(t), slots.release(), self.running.discard(g))
                )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _room_ahead(self, limit: int) -> None:
        """Wait until the samples queued and those the groups in flight will bring leave room for one more group
        within `limit` (with `bound_queued`), or the worker stops."""
        while self.bound_queued and (
            self.rollout_buffer.qsize() + len(self.running) * self.num_generations >= limit
        ):
            if self._stop.is_set() or self._draining.is_set() or self.error is not None:
                return
            await asyncio.sleep(0.02)

    async def _may_go_on(self, tasks: set[asyncio.Task]) -> bool:
        """Whether the next group may start: not stopped, draining or failed, and within the spend cap. A group the
        cap refuses waits for one in flight to finish (freeing its share); with none in flight the cap is
        reached for good (`capped`)."""
        while True:
            if self._stop.is_set() or self._draining.is_set() or self.error is not None:
                return False
            why = self.may_start(set(self.running)) if self.may_start is not None else None
            if why is None:
                return True
            if not tasks:
                self.capped = why
                return False
            await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)

    async def _group(self, runner: EpisodeRunner, group_id: int, row: dict[str, Any]) -> None:
        try:
            version = self.model_version
            clock = GroupClock(turns=self.rollout.most_agent_turns)
            question = question_of(row["prompt"])
            tag = {"rollout_group": group_id}

            async def episode(index: int) -> Episode:
                # The call ledger keys each call by its group (as the step), episode and turn.
                with call_scope(step=group_id, training=True, call=0, episode=index):
                    return await runner.run(question, metadata=tag)

            self.idle.busy(+1)
            try:
                with clock.running():
                    episodes = await asyncio.gather(*(episode(i) for i in range(self.num_generations)))
            finally:
                self.idle.busy(-1)  # what follows is scoring and, with a full queue, waiting for room
            await self._deliver(group_id, row, version, episodes, clock.split())
        except asyncio.CancelledError:
            raise
        except RolloutFailed as exc:
            self.error = self.error or str(exc)
        except Exception as exc:  # noqa: BLE001 (a bug here must stop the run with its message, not hang it)
            self.error = self.error or f"the rollout worker failed: {type(exc).__name__}: {exc}"

    async def _deliver(
        self,
        group_id: int,
        row: dict[str, Any],
        version: int,
        episodes: list[Episode],
        times: dict[str, float],
    ) -> None:
        """Score the group and queue its samples; `times`: where its seconds went (`GroupClock.split`)."""
        broken = next((e for e in episodes if e.status in ("agent_error", "internal_error")), None)
        if broken is not None:  # the policy is the vLLM server: its failure is the run's, not an outcome
            raise RolloutFailed(f"a rollout episode failed ({broken.status}): {broken.error}")
        started = time.monotonic()
        samples, metrics = self.score(group_id, row, version, episodes)
        # The step lines' breakdown: each sample carries its group's seconds, which the trainer averages per step.
        seconds = time_metrics({**times, "scoring": time.monotonic() - started})
        for sample in samples:
            sample.metrics.update(seconds)
        self.finished[group_id] = version if samples else None
        failed = sum(1 for e in episodes if e.status == "environment_error")
        # The environment is gone when it answered none of a group's calls (episodes that never called it, such
        # as a malformed first turn, still score and would keep a run going on nothing but them).
        answered = sum(e.usage.get("env_calls", 0) for e in episodes)
        self._failed_in_a_row = self._failed_in_a_row + 1 if failed and not answered else 0
        if self._failed_in_a_row >= self.max_failed_groups:
            error = next(e.error for e in episodes if e.status == "environment_error")
            raise RolloutFailed(
                f"the environment answered none of the calls of {self._failed_in_a_row} groups in a row, after "
                f"its retries: {error}"
            )
        for sample in samples:
            sample.enqueued_at = time.time()
            while True:  # backpressure: a full queue waits for the trainer, without blocking the event loop
                if (
                    self._stop.is_set() or self._draining.is_set()
                ):  # the run ends: its calls are counted already
                    return
                try:
                    self.rollout_buffer.put_nowait(sample)
                    break
                except queue.Full:
                    await asyncio.sleep(0.05)
        self.groups_done += 1
        self.samples_queued += len(samples)
        self.failed_episodes += failed
        metrics["rollout/group_s"] = times["rollout"]
        self.metrics_queue.put(metrics)
        self._heartbeat = time.time()

    def score(
        self, group_id: int, row: dict[str, Any], version: int, episodes: list[Episode]
    ) -> tuple[list[Any], dict[str, float]]:
        """The group's `RolloutSample`s (episodes with a reward) and the worker's metrics for it."""
        import numpy as np
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        tokenizer = self.agent.tokenizer
        out = self.rollout.to_trajectories(episodes, tokenizer)
        columns = {
            k: v for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask")
        }
        columns["golden_answers"] = [row.get("golden_answers")] * len(episodes)
        completions = [" ".join(texts) for texts in out["turn_texts"]]
        prompts = [row["prompt"]] * len(episodes)
        scores = {f.__name__: f(prompts, completions, out["completion_ids"], **columns) for f in self.rewards}
        totals = scores[self.rewards[0].__name__]
        advantages = group_advantages(totals)
        scored = [t for t in totals if t is not None]
        zero_std = float(len(scored) > 0 and max(scored) == min(scored))
        samples = []
        for i, episode in enumerate(episodes):
            if advantages[i] is None:
                continue
            prompt_ids, completion = out["prompt_ids"][i], out["completion_ids"][i]
            metrics = {
                "reward": float(totals[i]),
                "frac_reward_zero_std": zero_std,
                "episode/turns": float(len(episode.turns)),
                "episode/env_calls": float(episode.usage.get("env_calls", 0)),
                "episode/agent_completion_tokens": float(episode.usage.get("agent_completion_tokens", 0)),
                # shares of each ending, as the synchronous rollout logs them (the step lines' stuck signs read them)
                **{f"episode/status_{status}": float(episode.status == status) for status in STATUSES},
            }
            for f in self.rewards[1:]:
                value = scores[f.__name__][i]
                metrics[f"rewards/{f.__name__}/mean"] = math.nan if value is None else float(value)
            if self.episode_metrics is not None:
                metrics.update(self.episode_metrics(group_id, row, episode))
            samples.append(
                RolloutSample(
                    prompt=list(row["prompt"]) if not isinstance(row["prompt"], str) else row["prompt"],
                    completion=[{"role": "assistant", "content": completions[i]}],
                    input_ids=np.asarray(prompt_ids + completion, dtype=np.int64),
                    completion_mask=np.asarray([0] * len(prompt_ids) + out["env_mask"][i], dtype=np.int64),
                    old_log_probs=np.asarray([0.0] * len(prompt_ids) + out["logprobs"][i], dtype=np.float32),
                    advantage=float(advantages[i]),
                    model_version=version,
                    group_id=group_id,
                    metrics=metrics,
                )
            )
        env_seconds = [
            t["environment_call"].get("latency_s")
            for e in episodes
            for t in e.turns
            if isinstance(t.get("environment_call"), dict)
            and t["environment_call"].get("latency_s") is not None
        ]
        costs = [e.cost_usd for e in episodes if e.cost_usd is not None]
        metrics = {
            "rollout/groups_total": 1.0,
            "rollout/episodes_total": float(len(episodes)),
            "rollout/failed_episodes_total": float(len(episodes) - len(samples)),
            "rollout/env_calls_total": float(sum(e.usage.get("env_calls", 0) for e in episodes)),
            "rollout/episode_s": sum(e.latency_s for e in episodes) / len(episodes),
            "rollout/policy_version": float(version),
        }
        if env_seconds:
            metrics["rollout/env_latency_s"] = sum(env_seconds) / len(env_seconds)
        if costs:
            metrics["rollout/cost_usd_total"] = float(sum(costs))
        return samples, metrics
