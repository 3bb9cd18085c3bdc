"""Batch and eval rows in Ray actors, with one machine's guarantees: `prompt-r1 batch … --ray [ADDRESS]` and
`prompt-r1 eval … --ray` (prompt_r1.runs.batch and prompt_r1.evaluation.harness use it when given `RaySettings`;
nothing else changes for the caller).

    with RayEpisodes(ray_settings, episode_work, out=out, concurrency=32, budget=5.0, agent_config=agent_config,
                     environment_config=environment_config, loop=loop, prices=prices,
                     options={"agent_model": "agent"}) as episodes:
        row = await episodes.work(sample)            # the same row a local run writes

Why Ray core (actors and tasks) and not Ray Data: the driver keeps today's worker pool (prompt_r1.runs.pool): it
reads the input, skips finished ids, writes every row through the one `ResultStore`, stops on a budget, failures or
a signal, and shows one progress line. Only the making of a row moves: `work(item)` sends the item to the least
busy actor, which makes it with the surface's own row maker (the actors: prompt_r1.runs.ray_actors), and awaits
the row. So every guarantee of a local batch holds by the same code, and the new ones are a
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
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from prompt_r1.clients.costs import PriceTable, UsageMeter
from prompt_r1.clients.shared_spend import run_key
from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig
from prompt_r1.core.errors import BackendUnavailable, ConfigError, PromptR1Error
from prompt_r1.core.urls import is_shared_store
from prompt_r1.runs.call_ledger import EpisodeLedger, ledger_path_for
from prompt_r1.runs.episode import FAILED_STATUSES
from prompt_r1.runs.ray_actors import EpisodeActor, LedgerKeeper, versions
from prompt_r1.runs.ray_settings import CONNECT_SECONDS, RAY_EXTRA_HINT, RaySettings

__all__ = ["ClusterUnreachable", "RayEpisodes", "import_ray"]

# Tries of one item when its actor dies under it (each on the least busy live actor).
ACTOR_TRIES = 4
READY_SECONDS = 300.0  # how long the actors may take to start (a model to load) before the run gives up


class ClusterUnreachable(PromptR1Error):
    """The Ray address answers nothing (the command exits 3)."""


def import_ray():
    """Ray, or one line naming the extra that brings it."""
    try:
        import ray
    except ModuleNotFoundError:
        raise BackendUnavailable(f"--ray needs Ray, which is not installed: {RAY_EXTRA_HINT}") from None
    return ray


def why_unreachable(address: str, seconds: float = CONNECT_SECONDS) -> str | None:
    """None when a Ray cluster answers at the address within `seconds`, else why not. Probed here, with a
    deadline, because `ray.init` on an address that takes a connection and never answers as Ray does (a dead
    head's port reused, a firewall, another service) retries for minutes. A GCS address must answer Ray's own
    first request (its cluster id); a Ray Client address (ray://) must open a gRPC channel; `auto` is the
    address Ray would read (RAY_ADDRESS, the cluster started on this machine), none being Ray's own refusal."""
    deadline = time.monotonic() + seconds
    if address == "auto":
        address = _auto_address()
        if address is None:
            return None
    client = address.startswith("ray://")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=min(5.0, seconds)):
            pass
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    import grpc

    left = max(0.1, deadline - time.monotonic())
    with grpc.insecure_channel(address.removeprefix("ray://")) as channel:
        try:
            if client:
                grpc.channel_ready_future(channel).result(timeout=left)
                return None
            from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

            stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=left)
        except grpc.FutureTimeoutError:
            return f"no Ray Client answered within {seconds:g} s"
        except grpc.RpcError as exc:
            code = exc.code()
            # A cluster that asks for a token answered as Ray: ray.init says the rest.
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                return None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return f"no Ray cluster answered within {seconds:g} s"
            return f"no Ray cluster answers there: {code.name.lower()}"
    return None


def _auto_address() -> str | None:
    """The HOST:PORT `ray.init("auto")` would join, or None when there is none (or Ray does not say)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address("auto")
    except Exception:  # Ray's own lookup: its errors are ray.init's to report
        return None


def unreachable_line(address: str, reason: str) -> str:
    return f"cannot reach the Ray cluster at {address} ({reason}); start it or fix --ray"


def row_calls(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row's environment calls: an episode's turns' or a baseline's `environment_calls`."""
    calls = [t["environment_call"] for t in row.get("turns") or () if t.get("environment_call")]
    return [*calls, *(row.get("environment_calls") or ())]


def meter_row(meter: UsageMeter, row: dict[str, Any], agent_model: str) -> None:
    """Add what a row used to the driver's meter (for the summary, the progress line and the budget): its
    environment calls, less those answered from the ledger (`cached`: paid by the try or the run that sent them),
    and the agent's tokens."""
    for call in row_calls(row):
        if call.get("cached"):
            continue
        meter.add(
            "environment", call.get("model") or "environment", call["input_tokens"], call["output_tokens"]
        )
    usage = row.get("usage") or {}
    read, written = usage.get("agent_prompt_tokens", 0), usage.get("agent_completion_tokens", 0)
    if read or written:
        calls = usage.get("agent_calls") or max(1, len(row.get("turns") or ()))
        meter.add("agent", agent_model, read, written, calls=calls)


class RayEpisodes:
    """The driver's side: connect (or start a local Ray and store), start the actors and the ledger keeper, check
    the cluster runs the driver's versions, then `work(item)` per row. A context manager; leaving it stops what
    it started.

    make_work, options: the surface's row maker, built in each actor as `make_work(agent, environment, loop,
    prices, **options)` (a module-level function: Ray sends it by name). out: the results file (the ledger sits
    beside it). key: an item's ledger key (its row's key, as text)."""

    def __init__(self, ray_settings: RaySettings, make_work: Callable[..., Any], *, out: Path, concurrency: int,
                 budget: float | None, agent_config: AgentConfig | None,
                 environment_config: EnvironmentConfig | None, loop: LoopConfig, prices: PriceTable,
                 meter: UsageMeter | None = None, options: dict[str, Any] | None = None,
                 key: Callable[[Any], str] = lambda sample: str(sample.id)) -> None:  # fmt: skip
        self.ray_settings, self.make_work, self.options = ray_settings, make_work, dict(options or {})
        self.out, self.concurrency, self.budget, self.key = Path(out), concurrency, budget, key
        self.agent_config, self.environment_config = agent_config, environment_config
        self.loop, self.prices = loop, prices
        self.meter = meter if meter is not None else UsageMeter(prices)
        self.agent_model = str(getattr(agent_config, "model", None) or "agent")
        # What the run spent before its rows (eval's prompt-optimiser searches, on this meter): the rows may spend
        # only the rest of the budget.
        self.before = self.meter.cost
        self.spent = 0.0  # the rows' spending in the store, as the actors last saw it
        self.actors: list[Any] = []
        self.load: dict[int, int] = {}
        self.lost: set[int] = set()
        self.retried = 0  # tries of an item lost with its actor (its node died), run again on another
        self.replayed = 0  # environment calls answered from the ledger instead of being sent again
        self.retries = 0  # the actors' environment clients' retries, as the rows' calls report their attempts
        self.start_seconds = 0.0  # joining or starting Ray, the store and the actors (their agents loaded)
        self._stack = contextlib.ExitStack()

    # ---- start and stop -------------------------------------------------------------------------------------
    def __enter__(self) -> RayEpisodes:
        started = time.monotonic()
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def figures(self) -> dict[str, Any]:
        """What the Ray side of the run did, for the summary."""
        return {
            "actors": len(self.actors),
            "start_seconds": round(self.start_seconds, 3),
            "retried_episodes": self.retried,
            "replayed_calls": self.replayed,
        }

    def _start(self) -> None:
        ray = import_ray()
        rs = self.ray_settings
        if self.environment_config is not None:
            store = self.environment_config.rate_store
            if not is_shared_store(store):
                if not rs.local:
                    raise ConfigError(check_store_for(rs))
                from prompt_r1.clients.redis_process import RedisServer

                server = self._stack.enter_context(RedisServer(die_with_parent=True))
                self.environment_config = replace(self.environment_config, rate_store=server.url)
        self._connect(ray)
        self._check_room(ray)
        # The run's spending lives in its store, under the results file's resolved path: with a store the user
        # gave, a rerun adds to what earlier runs spent (as `--shard` runs do; prompt_r1.runs.shared_budget); with
        # the store started here, it counts from zero.
        with_spend = self.budget is not None and self.environment_config is not None
        spend_key = run_key("ray", str(self.out.resolve())) if with_spend else None
        # With Ray Client the driver runs on the cluster, not in this process: no file here, no pid to watch.
        client = (rs.address or "").startswith("ray://")
        keeper_path = ":memory:" if client else str(ledger_path_for(self.out.resolve()))
        if keeper_path != ":memory:" and Path(keeper_path).exists():
            EpisodeLedger.open(keeper_path).close()  # refused now (not a ledger), before an actor starts
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        self.keeper = ray.remote(LedgerKeeper).options(
            num_cpus=0, max_restarts=-1, max_task_retries=-1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True),
        ).remote(keeper_path, None if client else (os.getpid(), here))  # fmt: skip
        self._stack.callback(self._close_keeper)  # before Ray stops (callbacks run last first)
        per_actor = max(1, -(-self.concurrency // rs.actors))
        actor_class = ray.remote(EpisodeActor).options(
            num_cpus=rs.actor_cpus, num_gpus=rs.actor_gpus, max_concurrency=per_actor,
            max_restarts=-1, max_task_retries=0,
        )  # fmt: skip
        # The settings go to the object store once, not once per actor (the price table is the bulk of them).
        shared = ray.put(
            (self.make_work, self.options, self.agent_config, self.environment_config, self.loop, self.prices)
        )
        self.actors = [
            actor_class.remote(shared, self.keeper, spend_key, self.left()) for _ in range(rs.actors)
        ]
        self.load = dict.fromkeys(range(len(self.actors)), 0)
        self._check_versions(ray)
        if spend_key is not None:  # what earlier runs spent: a spent budget starts no row
            self.spent = ray.get(self.actors[0].spent.remote())

    def _close_keeper(self) -> None:
        """The ledger file closed by its keeper (its -wal and -shm files gone), when the keeper still answers."""
        ray = import_ray()
        with contextlib.suppress(Exception):  # a keeper lost with its node has nothing open here to close
            ray.get(self.keeper.close.remote(), timeout=30)

    def _connect(self, ray) -> None:
        rs = self.ray_settings
        if rs.address is not None:
            reason = why_unreachable(rs.address)
            if reason is not None:
                raise ClusterUnreachable(unreachable_line(rs.address, reason))
        options: dict[str, Any] = dict(address=rs.address, log_to_driver=False, configure_logging=False)
        if rs.local:  # "local": a Ray of our own, never RAY_ADDRESS's or a cluster already running here
            options.update(
                address="local", include_dashboard=False,
                num_cpus=max(os.cpu_count() or 1, int(rs.actors * rs.actor_cpus)),
            )  # fmt: skip
        try:
            ray.init(**options)
        except ConnectionError as exc:
            raise ClusterUnreachable(
                f"cannot reach the Ray cluster at {rs.address} ({str(exc).splitlines()[0]})"
            ) from None
        except ValueError as exc:  # Ray refusing the options it was given (settings of a cluster it joined)
            raise ConfigError(f"Ray refused to start for --ray: {' '.join(str(exc).split())[:300]}") from None
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
        check_versions(ray.get(ready), versions())

    # ---- the run ----------------------------------------------------------------------------------------------
    def left(self) -> float | None:
        """The budget the rows may spend: what the searches before them left."""
        return None if self.budget is None else self.budget - self.before

    def stop_rule(self):
        """The driver's budget rule: stop starting rows once the run's spending reaches the budget: what was spent
        before the rows, plus the rows' spending in the store (as the actors last saw it, paid calls of rows not
        yet written included), or the driver's meter (the rows it was handed, and the searches: the only count
        when no environment is called, an agent-only eval whose served agent is paid)."""
        budget = self.budget
        if budget is None:
            return None

        def over_budget() -> str | None:
            spent = max(self.before + self.spent, self.meter.cost)
            return f"budget of ${budget:g} reached (${spent:.4f} spent)" if spent >= budget else None

        return over_budget

    async def work(self, item: Any) -> dict[str, Any]:
        """The item's row, made on the least busy live actor; again on another when its actor dies under it."""
        ray = import_ray()
        errors = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
        key = self.key(item)
        last: BaseException | None = None
        for _ in range(ACTOR_TRIES):
            index = min(self.load, key=lambda i: (i in self.lost, self.load[i]))
            self.load[index] += 1
            try:
                result = await self.actors[index].run.remote(key, item)
            except errors as exc:
                self.lost.add(index)  # Ray restarts it where there is room; others are preferred meanwhile
                self.retried += 1
                last = exc
                continue
            finally:
                self.load[index] -= 1
            self.lost.discard(index)
            self.replayed += int(result.get("replayed") or 0)
            self.spent = max(self.spent, float(result.get("spent") or 0.0))
            if result.get("budget"):
                raise asyncio.CancelledError  # no row: the pool counts it cancelled, the next run replays its calls
            row = result["row"]
            meter_row(self.meter, row, self.agent_model)
            sent = [call for call in row_calls(row) if not call.get("cached")]
            self.retries += sum(max(0, int(call.get("attempts") or 1) - 1) for call in sent)
            return row
        raise RuntimeError(f"every try of this row lost its Ray actor ({type(last).__name__})")

    async def after_write(self, item: Any, row: dict[str, Any]) -> None:
        """A finished row's calls leave the ledger (a rerun skips it); a failed row's stay, to be replayed."""
        if row["status"] not in FAILED_STATUSES:
            await self.keeper.forget.remote(self.key(item))


def check_versions(found: list[dict[str, str]], mine: dict[str, str]) -> None:
    """A `ConfigError` naming the first node whose Python or prompt-r1 differs from the driver's (`versions()` of
    each actor, and of the driver)."""
    for node in found:
        for what in ("python", "prompt-r1"):
            if node[what] != mine[what]:
                raise ConfigError(
                    f"Ray node {node['node']} runs {what} {node[what]}, this driver {mine[what]}: install "
                    "the same versions on every node"
                )


def check_store_for(rs: RaySettings) -> str:
    return (
        f"--ray {rs.address} spreads the run over machines: give --env-rate-store redis://HOST:PORT (a Redis every "
        "node reaches) so that the provider limit and the budget stay one"
    )


@contextlib.contextmanager
def ray_episodes(*args: Any, **kwargs: Any) -> Iterator[RayEpisodes]:
    with RayEpisodes(*args, **kwargs) as episodes:
        yield episodes
