"""What runs inside Ray for a `--ray` run (prompt_r1.runs.ray_batch starts them): the episode actors and the run's
one ledger keeper.

An `EpisodeActor` loads one agent and one environment client once, then builds the surface's own row maker from
them with `make_work(agent, environment, loop, prices, **options)`: batch's (prompt_r1.runs.batch_rows.episode_work)
or eval's (prompt_r1.evaluation.rows.eval_work), the same one a local run uses, so a row is the same wherever it
ran. Its environment is the client wrapped twice: the shared budget (prompt_r1.runs.shared_budget) checked before
each paid call, and the call ledger (prompt_r1.runs.call_ledger) answering a call its episode paid for before.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig, rate_store_password
from prompt_r1.core.errors import PromptR1Error
from prompt_r1.runs.call_ledger import EpisodeLedger, LedgeredEnvironment, ledger_episode
from prompt_r1.runs.shared_budget import BudgetReached, SpendingEnvironment, add_agent_cost

__all__ = ["DriverGone", "EpisodeActor", "LedgerKeeper", "process_gone", "versions"]


class DriverGone(PromptR1Error):
    """The run's driver has died: no call is sent for it any more (its rerun replays the ledger)."""


def process_gone(pid: int) -> bool:
    """Whether process `pid` of this machine has ended (a killed one its parent has not yet reaped included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except (OSError, IndexError):  # no /proc (not Linux): os.kill's answer stands
        return False


def versions() -> dict[str, str]:
    """What must match between the driver and every node: Python and prompt-r1 (and the node, to name it)."""
    try:
        ours = importlib.metadata.version("prompt-r1")
    except importlib.metadata.PackageNotFoundError:
        ours = "unknown"
    return {"python": platform.python_version(), "prompt-r1": ours, "node": socket.gethostname()}


class LedgerKeeper:
    """The run's one ledger writer (a Ray actor on the driver's node; see prompt_r1.runs.call_ledger), and the
    actors' stop signal: every paid call asks it first (`lookup`), and once the driver's process has ended it
    answers `DriverGone` instead, so no call is sent for a dead driver in the moment before Ray ends its actors.

    driver: the driver's (pid, Ray node id); its process is watched only where the keeper runs on that node (not
    with Ray Client, whose driver is elsewhere)."""

    def __init__(self, path: str, driver: tuple[int, str] | None = None) -> None:
        self.path, self._ledger, self.driver_pid = path, None, None
        if driver is not None:
            import ray

            pid, node = driver
            if ray.get_runtime_context().get_node_id() == node:
                self.driver_pid = pid

    @property
    def ledger(self) -> EpisodeLedger:
        # Opened at the first call, so that a run refused while starting (the actors' versions) leaves no file.
        if self._ledger is None:
            self._ledger = EpisodeLedger.open(self.path)
        return self._ledger

    def lookup(self, episode: str, turn: int, request: str) -> dict[str, Any] | None:
        if self.driver_pid is not None and process_gone(self.driver_pid):
            raise DriverGone("the driver of this run has ended: not sending its calls")
        return self.ledger.lookup(episode, turn, request)

    def record(self, episode: str, turn: int, request: str, reply: dict[str, Any]) -> None:
        self.ledger.record(episode, turn, request, reply)

    def forget(self, episode: str) -> None:
        self.ledger.forget(episode)

    def close(self) -> None:
        """Close the file at the end of the run: SQLite folds its write-ahead log back in and removes it and the
        -shm file, so a clean run leaves only NAME.calls.sqlite."""
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None


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
            environment = LedgeredEnvironment(client, keeper.lookup.remote, keeper.record.remote)
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
        with ledger_episode(key) as episode:
            try:
                row = await self.work(item)
            except BudgetReached:
                return {"budget": True, "spent": self.spend.last, "replayed": episode.replayed}
        if self.spend is not None and self.agent_paid:
            await add_agent_cost(self.spend, self.prices, self.agent_model, row)
        return {"row": row, "spent": self.spend.last if self.spend else 0.0, "replayed": episode.replayed}
