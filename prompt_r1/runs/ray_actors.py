"""What runs inside Ray for a `--ray` run (prompt_r1.runs.ray_batch starts them): the episode actors and the run's
one ledger keeper.

An `EpisodeActor` loads one agent and one environment client once, then builds the surface's own row maker from
them with `make_work(agent, environment, loop, prices, **options)`: batch's (prompt_r1.runs.batch_rows.episode_work)
or eval's (prompt_r1.evaluation.rows.eval_work), the same one a local run uses, so a row is the same wherever it
ran. Its environment is the client wrapped twice: the shared budget (prompt_r1.runs.shared_budget) checked before
each paid call, and the call ledger (prompt_r1.runs.call_ledger) answering a call its episode paid for before.
"""

from __future__ import annotations

import contextvars
import importlib.metadata
import platform
import socket
from dataclasses import dataclass
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.clients.environment import EnvironmentReply
from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig, rate_store_password
from prompt_r1.runs.call_ledger import EpisodeLedger, request_key
from prompt_r1.runs.shared_budget import BudgetReached, SpendingEnvironment, add_agent_cost

__all__ = ["EpisodeActor", "LedgerKeeper", "LedgeredEnvironment", "versions"]


@dataclass
class _Episode:
    key: str
    replayed: int = 0


_EPISODE: contextvars.ContextVar[_Episode] = contextvars.ContextVar("prompt_r1_ray_episode")


def versions() -> dict[str, str]:
    """What must match between the driver and every node: Python and prompt-r1 (and the node, to name it)."""
    try:
        ours = importlib.metadata.version("prompt-r1")
    except importlib.metadata.PackageNotFoundError:
        ours = "unknown"
    return {"python": platform.python_version(), "prompt-r1": ours, "node": socket.gethostname()}


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
    (by `inner`, which keeps the budget), recorded, then handed on."""

    def __init__(self, inner: Any, keeper: Any) -> None:
        self.inner, self.keeper = inner, keeper

    async def respond(self, prompt: str, history=(), *, run_config=None, **options: Any) -> EnvironmentReply:
        episode = _EPISODE.get()
        model = str(getattr(self.inner, "model_name", "") or "")
        turn, key = len(history), request_key(model, prompt, history)
        recorded = await self.keeper.lookup.remote(episode.key, turn, key)
        if recorded is not None:
            episode.replayed += 1
            # `cached`: not sent and not paid for now (the try that sent it paid, and the store counted it then).
            return EnvironmentReply(**{**recorded, "cached": True})
        reply = await self.inner.respond(prompt, history, run_config=run_config, **options)
        await self.keeper.record.remote(episode.key, turn, key, reply.to_dict())  # on disk before it is seen
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class EpisodeActor:
    """One agent and one environment client, loaded once; rows are made on them as the driver sends items."""

    def __init__(self, settings: tuple, keeper: Any, spend_key: str | None, budget: float | None) -> None:
        """settings: (make_work, its options, the agent's, the environment's and the loop's configs, the prices),
        one object in Ray's store for every actor."""
        make_work, options, agent_config, environment_config, loop, prices = settings
        agent_config: AgentConfig | None
        environment_config: EnvironmentConfig | None
        loop: LoopConfig
        prices: PriceTable
        from prompt_r1.agents import load_agent
        from prompt_r1.clients.environment import EnvironmentClient
        from prompt_r1.clients.shared_spend import SharedSpend

        self.prices = prices
        self.agent_model = str(getattr(agent_config, "model", None) or "agent")
        self.agent_paid = getattr(agent_config, "resolved_backend", None) == "served"
        self.spend = None
        environment = None
        if environment_config is not None:
            url = environment_config.rate_store
            if spend_key is not None:
                self.spend = SharedSpend.connect(url, spend_key, rate_store_password(url))
            client = EnvironmentClient(environment_config)
            if self.spend is not None:
                client = SpendingEnvironment(client, prices, self.spend, budget)
            environment = LedgeredEnvironment(client, keeper)
        agent = load_agent(agent_config) if agent_config is not None else None
        self.work = make_work(agent, environment, loop, prices, **options)

    def ready(self) -> dict[str, str]:
        return versions()

    async def spent(self) -> float:
        """The run's spending in the store so far."""
        return await self.spend.total() if self.spend is not None else 0.0

    async def run(self, key: str, item: Any) -> dict[str, Any]:
        """The item's row, or {"budget": True} when the budget stopped it; with the run's spending so far and the
        calls answered from the ledger."""
        episode = _Episode(key)
        token = _EPISODE.set(episode)
        try:
            row = await self.work(item)
        except BudgetReached:
            return {"budget": True, "spent": self.spend.last, "replayed": episode.replayed}
        finally:
            _EPISODE.reset(token)
        if self.spend is not None and self.agent_paid:
            await add_agent_cost(self.spend, self.prices, self.agent_model, row)
        return {"row": row, "spent": self.spend.last if self.spend else 0.0, "replayed": episode.replayed}
