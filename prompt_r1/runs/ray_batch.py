"""Batch episodes in Ray actors, with one machine's guarantees: `prompt-r1 batch … --ray [ADDRESS]` (prompt_r1.runs.batch
runs it when `BatchSettings.ray` is set; nothing else changes for the caller).

    with RayEpisodes(settings, agent_config, environment_config, loop, prices) as episodes:
        row = await episodes.work(sample)            # the same row a local run writes

Why Ray core (actors and tasks) and not Ray Data: the driver keeps today's worker pool (prompt_r1.runs.pool): it
reads the input, skips finished ids, writes every row through the one `ResultStore`, stops on a budget, failures or
a signal, and shows one progress line. Only an episode's run moves: `work(sample)` sends the sample to the least
busy actor and awaits its row. So every guarantee of a local batch holds by the same code, and the new ones are a
few lines each. Ray Data's `map_batches` would own the reading, batching, retries and output instead: its retries
rerun a whole batch (sending its calls again), its writers are many, and the resume and budget rules would have to
be rebuilt around it.

- **Actors.** `--ray-actors` actors, each with `--ray-actor-cpus`/`--ray-actor-gpus`, each holding one agent
  (loaded once: a served agent's client, a local model, an in-process vLLM engine on its GPU) and one environment
  client; each runs up to `concurrency / actors` episodes at once (an async actor).
- **One limit.** Every actor's environment client names the same shared store (`--env-rate-store redis://…`), so
  the provider limit is one limit (prompt_r1.clients.shared_limit). A local Ray without a store starts a
  `redis-server` for the run (prompt_r1.clients.redis_process); a cluster without one is refused.
- **One budget.** Every paid call is added to the run's spending in the store (prompt_r1.clients.shared_spend);
  an actor checks it before each call it would pay for, and the driver before each episode. An episode stopped by
  the budget mid-way writes no row: the next run replays its paid calls and goes on.
- **No call paid twice.** Each paid environment call is recorded in the run's call ledger
  (prompt_r1.runs.call_ledger, one keeper actor on the driver's node writing NAME.calls.sqlite beside --out)
  before the episode sees its reply. An episode run again (its actor died with its node, or the driver was
  killed and rerun) gets its recorded calls from the ledger and sends only the ones never paid for. A call in
  flight when its node died was sent and never answered to us: that one alone is sent again.
- **Faults.** An actor lost mid-episode (its node died) costs that episode a retry on another actor, nothing
  else; the lost actor is restarted by Ray where there is room.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib.metadata
import os
import platform
import socket
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from prompt_r1.clients.costs import PriceTable, UsageMeter
from prompt_r1.clients.environment import EnvironmentReply
from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig, rate_store_password
from prompt_r1.core.errors import BackendUnavailable, ConfigError, PromptR1Error
from prompt_r1.core.urls import is_shared_store
from prompt_r1.data.datasets import Sample
from prompt_r1.runs.batch_rows import episode_row
from prompt_r1.runs.call_ledger import EpisodeLedger, ledger_path_for, request_key
from prompt_r1.runs.episode import FAILED_STATUSES, EpisodeRunner
from prompt_r1.runs.metering import episode_cost
from prompt_r1.runs.ray_settings import RAY_EXTRA_HINT, RaySettings

__all__ = ["ClusterUnreachable", "RayEpisodes", "import_ray"]

# Tries of one sample when its actor dies under it (each on the least busy live actor).
ACTOR_TRIES = 4
READY_SECONDS = 300.0  # how long the actors may take to start (a model to load) before the run gives up

_EPISODE: contextvars.ContextVar[str] = contextvars.ContextVar("prompt_r1_ray_episode")


class ClusterUnreachable(PromptR1Error):
    """The Ray address answers nothing (the command exits 3)."""


class BudgetReached(BaseException):
    """Raised in an actor before a call the budget cannot pay: a BaseException, so the episode is stopped (no
    row), not recorded as its failure."""


def import_ray():
    """Ray, or one line naming the extra that brings it."""
    try:
        import ray
    except ModuleNotFoundError:
        raise BackendUnavailable(f"--ray needs Ray, which is not installed: {RAY_EXTRA_HINT}") from None
    return ray


def _versions() -> dict[str, str]:
    try:
        ours = importlib.metadata.version("prompt-r1")
    except importlib.metadata.PackageNotFoundError:
        ours = "unknown"
    return {"python": platform.python_version(), "prompt-r1": ours, "node": socket.gethostname()}


def _reachable(address: str) -> str | None:
    """None when something listens at HOST:PORT (or the address is `auto`), else why not."""
    if address == "auto":
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5.0):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


class LedgerKeeper:
    """The run's one ledger writer (a Ray actor on the driver's node; see prompt_r1.runs.call_ledger)."""

    def __init__(self, path: str) -> None:
        self.path, self._ledger = path, None

    @property
    def ledger(self) -> EpisodeLedger:
        # Opened at the first call, so that a run refused while starting (the actors' versions) leaves no file.
        if self._ledger is None:
            self._ledger = EpisodeLedger.open(self.path)
        return self._ledger

    def lookup(self, episode: str, turn: int, request: str) -> dict[str, Any] | None:
        return self.ledger.lookup(episode, turn, request)

    def record(self, episode: str, turn: int, request: str, reply: dict[str, Any]) -> None:
        self.ledger.record(episode, turn, request, reply)

    def forget(self, episode: str) -> None:
        self.ledger.forget(episode)


class LedgeredEnvironment:
    """An actor's environment: each call answered from the ledger when its episode paid for it before, else sent
    (within the budget), recorded, then handed on."""

    def __init__(self, inner: Any, keeper: Any, prices: PriceTable, spend: Any, budget: float | None) -> None:
        self.inner, self.keeper, self.prices, self.spend, self.budget = inner, keeper, prices, spend, budget
        self.replayed = 0

    async def respond(self, prompt: str, history=(), *, run_config=None, **options: Any) -> EnvironmentReply:
        episode = _EPISODE.get()
        model = str(getattr(self.inner, "model_name", "") or "")
        turn, key = len(history), request_key(model, prompt, history)
        recorded = await self.keeper.lookup.remote(episode, turn, key)
        if recorded is not None:
            self.replayed += 1
            return EnvironmentReply(**recorded)
        if self.budget is not None and await self.spend.total() >= self.budget:
            raise BudgetReached
        reply = await self.inner.respond(prompt, history, run_config=run_config, **options)
        await self.keeper.record.remote(
            episode, turn, key, reply.to_dict()
        )  # on disk before the episode sees it
        if self.spend is not None:
            await self.spend.add(
                self.prices.cost(reply.model or model, reply.input_tokens, reply.output_tokens) or 0.0
            )
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class EpisodeActor:
    """One agent and one environment client, loaded once; episodes run on them as the driver sends samples."""

    def __init__(self, agent_config: AgentConfig, environment_config: EnvironmentConfig, loop: LoopConfig,
                 prices: PriceTable, keeper: Any, spend_key: str | None, budget: float | None) -> None:  # fmt: skip
        from prompt_r1.agents import load_agent
        from prompt_r1.clients.environment import EnvironmentClient
        from prompt_r1.clients.shared_spend import SharedSpend

        self.prices, self.budget = prices, budget
        self.agent_model = str(agent_config.model or "agent")
        url = environment_config.rate_store
        self.spend = (
            SharedSpend.connect(url, spend_key, rate_store_password(url)) if spend_key is not None else None
        )
        self.environment = LedgeredEnvironment(
            EnvironmentClient(environment_config), keeper, prices, self.spend, budget
        )
        self.runner = EpisodeRunner(
            load_agent(agent_config),
            self.environment,
            loop,
            price=lambda state: episode_cost(state, prices, self.agent_model),
            tags=["batch", "ray"],
        )
        self.agent_paid = agent_config.resolved_backend == "served"

    def ready(self) -> dict[str, str]:
        return _versions()

    async def run(self, sample: Sample) -> dict[str, Any]:
        """The sample's row, or {"budget": True} when the budget stopped it; with the run's spending so far."""
        token = _EPISODE.set(str(sample.id))
        try:
            row, _ = await episode_row(self.runner, sample)
        except BudgetReached:
            return {"budget": True, "spent": self.spend.last if self.spend else 0.0}
        finally:
            _EPISODE.reset(token)
        usage = row.get("usage") or {}
        agent_cost = self.prices.cost(
            self.agent_model, usage.get("agent_prompt_tokens", 0), usage.get("agent_completion_tokens", 0)
        )
        if self.spend is not None and self.agent_paid and agent_cost:
            await self.spend.add(agent_cost)
        return {"row": row, "spent": self.spend.last if self.spend else 0.0}


def meter_row(meter: UsageMeter, row: dict[str, Any], agent_model: str) -> None:
    """Add what a row's episode used to the driver's meter (for the summary and the progress line)."""
    turns = row.get("turns") or []
    for turn in turns:
        call = turn.get("environment_call")
        if call:
            meter.add(
                "environment", call.get("model") or "environment", call["input_tokens"], call["output_tokens"]
            )
    usage = row.get("usage") or {}
    read, written = usage.get("agent_prompt_tokens", 0), usage.get("agent_completion_tokens", 0)
    if read or written:
        meter.add("agent", agent_model, read, written, calls=max(1, len(turns)))


class RayEpisodes:
    """The driver's side: connect (or start a local Ray and store), start the actors and the ledger keeper, check
    the cluster runs the driver's versions, then `work(sample)` per episode. A context manager; leaving it stops
    what it started."""

    def __init__(self, settings: Any, agent_config: AgentConfig, environment_config: EnvironmentConfig,
                 loop: LoopConfig, prices: PriceTable, *, meter: UsageMeter | None = None) -> None:  # fmt: skip
        self.settings, self.ray_settings = settings, settings.ray
        self.agent_config, self.environment_config = agent_config, environment_config
        self.loop, self.prices = loop, prices
        self.meter = meter if meter is not None else UsageMeter(prices)
        self.agent_model = str(agent_config.model or "agent")
        self.spent = 0.0
        self.actors: list[Any] = []
        self.load: dict[int, int] = {}
        self.lost: set[int] = set()
        self.retried = 0
        self._stack = contextlib.ExitStack()

    # ---- start and stop -------------------------------------------------------------------------------------
    def __enter__(self) -> RayEpisodes:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _start(self) -> None:
        ray = import_ray()
        rs = self.ray_settings
        store = self.environment_config.rate_store
        if not is_shared_store(store):
            if not rs.local:
                raise ConfigError(check_store_for(rs))
            from prompt_r1.clients.redis_process import RedisServer

            server = self._stack.enter_context(RedisServer(die_with_parent=True))
            self.environment_config = replace(self.environment_config, rate_store=server.url)
        self._connect(ray)
        self._check_room(ray)
        # One driver, one run: its spending counts under a key of its own, from zero.
        spend_key = f"prompt-r1:spend:ray:{uuid.uuid4().hex}" if self.settings.budget is not None else None
        keeper_path = (
            ":memory:"
            if (rs.address or "").startswith("ray://")
            else str(ledger_path_for(Path(self.settings.out).resolve()))
        )
        if keeper_path != ":memory:" and Path(keeper_path).exists():
            EpisodeLedger.open(keeper_path).close()  # refused now (not a ledger), before an actor starts
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        self.keeper = ray.remote(LedgerKeeper).options(
            num_cpus=0, max_restarts=-1, max_task_retries=-1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True),
        ).remote(keeper_path)  # fmt: skip
        per_actor = max(1, -(-self.settings.concurrency // rs.actors))
        actor_class = ray.remote(EpisodeActor).options(
            num_cpus=rs.actor_cpus, num_gpus=rs.actor_gpus, max_concurrency=per_actor,
            max_restarts=-1, max_task_retries=0,
        )  # fmt: skip
        self.actors = [
            actor_class.remote(
                self.agent_config,
                self.environment_config,
                self.loop,
                self.prices,
                self.keeper,
                spend_key,
                self.settings.budget,
            )
            for _ in range(rs.actors)
        ]
        self.load = dict.fromkeys(range(len(self.actors)), 0)
        self._check_versions(ray)

    def _connect(self, ray) -> None:
        rs = self.ray_settings
        if rs.address is not None:
            reason = _reachable(rs.address)
            if reason is not None:
                raise ClusterUnreachable(
                    f"cannot reach the Ray cluster at {rs.address} ({reason}); start it or fix --ray"
                )
        options: dict[str, Any] = dict(address=rs.address, log_to_driver=False, configure_logging=False)
        if rs.local:
            options.update(
                include_dashboard=False, num_cpus=max(os.cpu_count() or 1, int(rs.actors * rs.actor_cpus))
            )
        try:
            ray.init(**options)
        except ConnectionError as exc:
            raise ClusterUnreachable(
                f"cannot reach the Ray cluster at {rs.address} ({str(exc).splitlines()[0]})"
            ) from None
        except RuntimeError as exc:
            text = str(exc)
            if "ersion mismatch" in text:
                raise ConfigError(
                    f"the Ray cluster at {rs.address} runs other versions than this driver: {' '.join(text.split())[:300]}"
                ) from None
            raise
        self._stack.callback(ray.shutdown)

    def _check_room(self, ray) -> None:
        rs = self.ray_settings
        total = ray.cluster_resources()
        for what, each, have in (
            ("CPU", rs.actor_cpus, total.get("CPU", 0)),
            ("GPU", rs.actor_gpus, total.get("GPU", 0)),
        ):
            if each > have:
                raise ConfigError(
                    f"each actor asks for {each:g} {what} but the Ray cluster has {have:g}: lower "
                    f"--ray-actor-{what.lower()}s or add nodes"
                )

    def _check_versions(self, ray) -> None:
        """Every actor started and runs the driver's Python and prompt-r1, before a sample is sent."""
        refs = [actor.ready.remote() for actor in self.actors]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=READY_SECONDS)
        if pending:
            raise ClusterUnreachable(
                f"{len(pending)} of {len(refs)} Ray actors did not start within {READY_SECONDS:g} s (no room on the "
                "cluster for --ray-actors of --ray-actor-cpus/-gpus each?)"
            )
        mine = _versions()
        for found in ray.get(ready):
            for what in ("python", "prompt-r1"):
                if found[what] != mine[what]:
                    raise ConfigError(
                        f"Ray node {found['node']} runs {what} {found[what]}, this driver {mine[what]}: install "
                        "the same versions on every node"
                    )

    # ---- the run ----------------------------------------------------------------------------------------------
    def stop_rule(self):
        """The driver's budget rule: stop starting episodes once the run's spending (as the actors last saw it in
        the store) reaches the budget."""
        budget = self.settings.budget
        if budget is None:
            return None

        def over_budget() -> str | None:
            return (
                f"budget of ${budget:g} reached (${self.spent:.4f} spent)" if self.spent >= budget else None
            )

        return over_budget

    async def work(self, sample: Sample) -> dict[str, Any]:
        """The sample's row, run on the least busy live actor; again on another when its actor dies under it."""
        ray = import_ray()
        errors = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
        last: BaseException | None = None
        for _ in range(ACTOR_TRIES):
            index = min(self.load, key=lambda i: (i in self.lost, self.load[i]))
            self.load[index] += 1
            try:
                result = await self.actors[index].run.remote(sample)
            except errors as exc:
                self.lost.add(index)  # Ray restarts it where there is room; others are preferred meanwhile
                self.retried += 1
                last = exc
                continue
            finally:
                self.load[index] -= 1
            self.lost.discard(index)
            self.spent = max(self.spent, float(result.get("spent") or 0.0))
            if result.get("budget"):
                raise asyncio.CancelledError  # no row: the pool counts it cancelled, the next run replays its calls
            row = result["row"]
            meter_row(self.meter, row, self.agent_model)
            return row
        raise RuntimeError(f"every try of this episode lost its Ray actor ({type(last).__name__})")

    async def after_write(self, sample: Sample, row: dict[str, Any]) -> None:
        """A finished row's calls leave the ledger (a rerun skips the id); a failed row's stay, to be replayed."""
        if row["status"] not in FAILED_STATUSES:
            await self.keeper.forget.remote(str(sample.id))


def check_store_for(rs: RaySettings) -> str:
    return (
        f"--ray {rs.address} spreads the run over machines: give --env-rate-store redis://HOST:PORT (a Redis every "
        "node reaches) so that the provider limit and the budget stay one"
    )


@contextlib.contextmanager
def ray_episodes(*args: Any, **kwargs: Any) -> Iterator[RayEpisodes]:
    with RayEpisodes(*args, **kwargs) as episodes:
        yield episodes
