"""One `--budget` for a run whose episodes run in many processes (Ray actors, `--shard` processes): the spending
is counted in the shared store (prompt_r1.clients.shared_spend), checked before every call that would be paid,
and added after it, so that the run stops within the calls in flight of the cap, wherever they run.

    environment = SpendingEnvironment(client, prices, spend, budget)   # BudgetReached before a call past the cap
    await add_agent_cost(spend, prices, agent_model, row)              # a served agent's tokens, once per row
    stop = shared_budget_rule(spend, budget)                           # the worker pool's stop rule

`shard_spend_key` names the spending of `--shard` runs: every shard of one input and one results file (their
resolved paths) derives the same key, so N shards with `--budget 5` spend $5 together.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.clients.environment import EnvironmentReply
from prompt_r1.clients.shared_spend import run_key

__all__ = ["BudgetReached", "SpendingEnvironment", "add_agent_cost", "shard_spend_key", "shared_budget_rule"]


class BudgetReached(BaseException):
    """Raised before a call the budget cannot pay: a BaseException, so that the episode is stopped (no row; the
    next run does it), not recorded as its failure by the episode runner."""


class SpendingEnvironment:
    """The environment, with the run's shared spending checked before each call and added after it."""

    def __init__(self, inner: Any, prices: PriceTable, spend: Any, budget: float | None) -> None:
        self.inner, self.prices, self.spend, self.budget = inner, prices, spend, budget

    async def respond(self, prompt: str, history=(), *, run_config=None, **options: Any) -> EnvironmentReply:
        if self.budget is not None and await self.spend.total() >= self.budget:
            raise BudgetReached
        reply = await self.inner.respond(prompt, history, run_config=run_config, **options)
        model = reply.model or str(getattr(self.inner, "model_name", "") or "")
        await self.spend.add(self.prices.cost(model, reply.input_tokens, reply.output_tokens) or 0.0)
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def add_agent_cost(spend: Any, prices: PriceTable, agent_model: str, row: dict[str, Any]) -> None:
    """Count a served agent's tokens of one finished row (its environment calls were counted as they returned)."""
    usage = row.get("usage") or {}
    cost = prices.cost(
        agent_model, usage.get("agent_prompt_tokens", 0), usage.get("agent_completion_tokens", 0)
    )
    if cost:
        await spend.add(cost)


def shared_budget_rule(spend: Any, budget: float) -> Callable[[], str | None]:
    """The pool's stop rule on the shared total, as this process last read or added it."""

    def over_budget() -> str | None:
        if spend.last >= budget:
            return f"budget of ${budget:g} reached (${spend.last:.4f} spent by the whole run)"
        return None

    return over_budget


def shard_spend_key(source: str | Path, out: str | Path, count: int) -> str:
    """The store key of a sharded run's spending: from the input's and the results file's resolved paths (the
    results file without the shard's `.shard-I-of-N`) and N. Every shard of the run derives it wherever it runs,
    given the same path layout on every machine (the input and --out at the same absolute paths: a shared
    folder, or the same working folder); two runs with another input or --out, in another folder too, do not mix.

    >>> shard_spend_key("/a/q.jsonl", "/r/r.shard-1-of-4.jsonl", 4) == shard_spend_key("/a/q.jsonl", "/r/r.shard-3-of-4.jsonl", 4)
    True
    >>> shard_spend_key("/a/q.jsonl", "/r/r.shard-1-of-4.jsonl", 4) == shard_spend_key("/a/q.jsonl", "/s/r.shard-1-of-4.jsonl", 4)
    False
    """
    out = Path(out).resolve()
    stem = out.stem[: out.stem.rfind(".shard-")] if ".shard-" in out.stem else out.stem
    return run_key(
        "shards", str(Path(str(source)).resolve()), str(out.with_name(stem + out.suffix)), str(count)
    )
