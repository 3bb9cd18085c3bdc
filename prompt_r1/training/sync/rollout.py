"""The LangGraph loop as TRL's rollout generator: `GRPOTrainer(rollout_func=GraphRollout(environment, ...))`.

TRL calls `rollout_func(prompts, trainer)` once per generation step on every process, with that process's prompts
already repeated `num_generations` times for the groups. Each prompt becomes one episode of the same graph that
serves inference; all episodes of the call run concurrently on the process-wide event loop (`prompt_r1.core.aio`), so
the environment client's rate limiter, retries and HTTP connections persist across steps, and the policy's
generate calls are batched across episodes.

Episodes run through the shared `EpisodeRunner` (prompt_r1.runs.episode) with the loop's settings from one
`LoopConfig`. What goes back to the trainer is each `Episode.trajectory`, the token-exact ids the graph kept
(`prompt_r1.training.shared.trajectories`, which the async worker uses too). Extra fields (status, answer, turns, the agent's turn texts, usage)
reach the reward functions as columns; `prompt_r1.scoring.rewards.trl_reward` scores `turn_texts` and gives episodes
whose environment calls failed after their retries a None reward, which TRL leaves out of the group baseline.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import time
from collections import Counter
from typing import Any

from prompt_r1.agents.batching import derive_seed
from prompt_r1.core.aio import run_sync
from prompt_r1.core.errors import ConfigError
from prompt_r1.loop.graph import STATUSES, build_graph
from prompt_r1.runs.episode import Episode, EpisodeRunner
from prompt_r1.training.shared.ledger import call_scope
from prompt_r1.training.shared.progress import time_metrics, turn_parts
from prompt_r1.training.shared.trajectories import Trajectories, question_of
from prompt_r1.training.sync.policy import VLLMServerPolicy, trainer_policy

__all__ = ["GraphRollout"]


class GraphRollout(Trajectories):
    """A `rollout_func` for `trl.GRPOTrainer` that runs one Prompt-R1 episode per prompt (the environment, the
    loop's settings and the ablation as for `Trajectories`)."""

    def __init__(self, environment: Any, **settings: Any) -> None:
        super().__init__(environment, **settings)
        self.calls = 0
        self.last_results: list[Episode] = []  # the episodes of the latest call, for inspection
        self.last_batch_sizes: list[int] = []
        self.last_generate_s = 0.0  # the latest call's seconds in the policy's generate calls
        self.last_generate_turn_s: dict[int | None, float] = {}  # the same by turn (the batcher's split)
        self.last_times: dict[str, float] = {}  # the latest call's seconds, by part (_RolloutClock.split)
        self._last_step: tuple[int, bool] | None = None  # (step, training) of the latest call
        self._calls_at_step = 0
        self._last_call: tuple[int, bool, int] | None = None

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        _check_trainer(trainer)
        questions = [question_of(p) for p in prompts]
        seed = self.step_seed(trainer)
        clock = _RolloutClock()
        with _collect_only_the_rollouts_garbage():
            results, tokenizer = self.sample(trainer, questions, seed, call=self._last_call)
            output = self.to_trajectories(results, tokenizer)
        self.last_times = clock.split(self.last_generate_s, self.last_generate_turn_s, self.most_agent_turns)
        self.calls += 1
        self.last_results = results
        log_episode_metrics(
            trainer, results, generate_calls=len(self.last_batch_sizes), times=self.last_times
        )
        return output

    def sample(
        self,
        trainer: Any,
        questions: list[str],
        seed: int | None,
        *,
        call: tuple[int, bool, int] | None = None,
    ) -> tuple[list[Episode], Any]:
        """One episode per question with the trainer's current policy, sampling from `seed` in lockstep batches
        (None: unseeded, batched as replies arrive); the episodes and the policy's tokenizer."""
        with trainer_policy(trainer, max_new_tokens=self.max_turn_tokens) as agent, _sampling_rng(seed):
            # vLLM's server batches every rank's requests as they arrive: lockstep would cost time and buy nothing.
            if seed is not None and not isinstance(agent, VLLMServerPolicy):
                agent.lockstep, agent.sampling_seed = True, seed
            results = self.run_episodes(agent, questions, call=call)
        self.last_batch_sizes = list(agent.batches)  # batches answered this step, for logs and tests
        self.last_generate_s = getattr(agent, "generate_total_s", 0.0)
        self.last_generate_turn_s = dict(getattr(agent, "generate_turn_s", {}))
        return results, agent.tokenizer

    def step_seed(self, trainer: Any) -> int | None:
        """The seed of this call's sampling, from the run's seed, the step, training or evaluation, the process and
        the call within them; None when `reproducible_rollouts` is off. A step's episodes then sample the same
        numbers in every run of the same seed, and evaluating between steps does not change training's seeds."""
        step = trainer.state.global_step
        key = (step, bool(trainer.model.training))
        self._calls_at_step = self._calls_at_step + 1 if key == self._last_step else 0
        self._last_step = key
        # What the call ledger keys this call's episodes by (prompt_r1.training.shared.ledger).
        self._last_call = (step, key[1], self._calls_at_step)
        if not getattr(trainer.args, "reproducible_rollouts", True):
            return None
        parts = (trainer.args.seed, step, trainer.accelerator.process_index, self._calls_at_step)
        return derive_seed(*parts) if key[1] else derive_seed(*parts, 1)  # evaluation: seeds of its own

    def run_episodes(
        self, agent: Any, questions: list[str], *, call: tuple[int, bool, int] | None = None
    ) -> list[Episode]:
        """Run one episode per question concurrently on the process-wide event loop; episodes in input order.
        `call`: (step, training, call within the step) of a trainer's rollout call, which keys the episodes'
        environment calls in the call ledger (prompt_r1.training.shared.ledger); None: not recorded.

        An episode that failed in the agent or in this code (`agent_error`, `internal_error`) stops training with
        its error: it has no trajectory to learn from, and the policy is local, so it is a bug, not a fault."""
        graph = build_graph(agent, self.environment, loop=self.loop, token_exact=True)
        runner = EpisodeRunner(agent, self.environment, self.loop, graph=graph, tags=["rollout"])

        async def one(index: int, question: str) -> Episode:
            # Registered episodes let the batcher wait for each other's turns, and order them by index in lockstep
            # batches (see prompt_r1.agents.batching).
            registered = getattr(agent, "episode", None)
            scope = (
                call_scope(step=call[0], training=call[1], call=call[2], episode=index)
                if call is not None
                else contextlib.nullcontext()
            )
            with registered(index) if registered else contextlib.nullcontext(), scope:
                return await runner.run(question)

        async def run_all() -> list[Episode]:
            return await asyncio.gather(*(one(i, q) for i, q in enumerate(questions)))

        episodes = run_sync(run_all())
        broken = next((e for e in episodes if e.status in ("agent_error", "internal_error")), None)
        if broken is not None:
            raise RuntimeError(
                f"a rollout episode failed ({broken.status}): {broken.error}"
            ) from broken.exception
        return episodes


@contextlib.contextmanager
def _collect_only_the_rollouts_garbage():
    """Keep the objects that were there before the rollout (the model, the trainer, the libraries: millions) out
    of the garbage collector's passes while it runs, and hand them back after. The episodes make many short-lived
    objects, and each full collection they trigger otherwise walked the whole heap: a quarter of the rollout's
    CPU at 256 episodes in evals/bench/step_overhead.py. Nothing is leaked: `unfreeze` returns them to the
    oldest generation."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _sampling_rng(seed: int | None):
    """Torch's generators seeded with `seed` for the rollout (a `transformers` policy samples from them), and
    restored after it, so that training's own random numbers (dropout) do not depend on how long a rollout ran."""
    if seed is None:
        yield
        return
    import torch

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _check_trainer(trainer: Any) -> None:
    if getattr(trainer, "tools", None):
        raise ConfigError(
            "GraphRollout needs the trainer without `tools`: TRL honours env_mask only when tools are unset"
        )
    plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "deepspeed_plugin", None)
    stage = getattr(plugin, "zero_stage", None) if plugin is not None else None
    if stage == 3 and not getattr(trainer, "use_vllm", False) and not trainer.args.ds3_gather_for_generation:
        raise ConfigError(
            "ZeRO-3 generation without gathered parameters is a collective per forward pass, which deadlocks when "
            "ranks' episodes take different numbers of turns: keep ds3_gather_for_generation true, or use vLLM"
        )


# Counters summed over a step's episodes (all processes), logged as means per episode.
_USAGE_KEYS = (
    "agent_calls",
    "agent_completion_tokens",
    "env_calls",
    "env_input_tokens",
    "env_output_tokens",
    "env_retries",
    "env_failed_calls",
)


def episode_statistics(results: list[Episode]) -> list[float]:
    """[episodes, turns, usage counters..., one count per status] for one process, in a fixed order."""
    statuses = Counter(e.status for e in results)
    usage = Counter()
    for e in results:
        usage.update(e.usage)
    return [
        float(len(results)),
        float(sum(len(e.turns) for e in results)),
        *(float(usage[k]) for k in _USAGE_KEYS),
        *(float(statuses[s]) for s in STATUSES),
    ]


class _RolloutClock:
    """Where a rollout call's seconds went, cheap enough to stay on (four clock readings and two hops to the
    event loop's thread): `generate` (the policy's generate calls, timed by the batcher), `loop` (the CPU time of
    the event loop's thread, where the graph, parsing, tokenising and the HTTP clients run, and of this thread,
    which assembles the trajectories), and `environment`: the rest of the wall time, which in lockstep batches is
    the wait for the environment's replies (the loop is idle during a generate call and during that wait).
    `generate` is split by turn too (`progress.turn_parts`: `generate_turn1`, ...)."""

    def __init__(self) -> None:
        self.wall, self.cpu, self.loop_cpu = time.monotonic(), time.thread_time(), _loop_thread_cpu()

    def split(
        self, generate_s: float, turn_s: dict[int | None, float] | None = None, turns: int = 0
    ) -> dict[str, float]:
        wall = time.monotonic() - self.wall
        loop = (_loop_thread_cpu() - self.loop_cpu) + (time.thread_time() - self.cpu)
        return {
            "rollout": wall,
            "generate": generate_s,
            "loop": loop,
            "environment": max(wall - generate_s - loop, 0.0),
            **turn_parts(turn_s or {}, turns),
        }


def _loop_thread_cpu() -> float:
    async def read() -> float:
        return time.thread_time()

    return run_sync(read())


def log_episode_metrics(
    trainer: Any,
    results: list[Episode],
    *,
    generate_calls: int | None = None,
    times: dict[str, float] | None = None,
) -> None:
    """Add per-episode means over all processes to the trainer's logged metrics (TRL's `report_to`), this
    process's number of policy generate calls in the step (fewer, fuller batches are faster on an accelerator),
    and where its rollout's seconds went (`times`, as `time/rollout_s`, `time/generate_s`, ...)."""
    metrics = getattr(trainer, "_metrics", None)
    if metrics is None:
        return
    import torch

    mode = "train" if trainer.model.training else "eval"
    local = torch.tensor(episode_statistics(results), dtype=torch.float64, device=trainer.accelerator.device)
    total = (
        trainer.accelerator.reduce(local, reduction="sum") if trainer.accelerator.num_processes > 1 else local
    )
    values = total.tolist()
    episodes = values[0] or math.nan
    metrics[mode]["episode/turns"].append(values[1] / episodes)
    for key, value in zip(_USAGE_KEYS, values[2 : 2 + len(_USAGE_KEYS)], strict=True):
        metrics[mode][f"episode/{key}"].append(value / episodes)
    for status, value in zip(STATUSES, values[2 + len(_USAGE_KEYS) :], strict=True):
        metrics[mode][f"episode/status_{status}"].append(value / episodes)
    if generate_calls is not None:
        metrics[mode]["rollout/generate_calls"].append(float(generate_calls))
    for key, seconds in time_metrics(times or {}).items():
        metrics[mode][key].append(seconds)
