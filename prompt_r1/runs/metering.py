"""Spending, as a run goes: the agent and environment wrapped so that every call is added to a `UsageMeter` as it
returns (what a `--budget` stops on), an episode's priced cost, and the check that a budget can be kept.

Shared by `batch` and `eval`; the wrappers also cut API keys out of the errors they pass on, before the graph keeps
them (in the episode's state, and so in checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prompt_r1.agents.base import AgentBackend, AgentOutput, AgentRequest
from prompt_r1.clients.costs import PriceTable, UsageMeter
from prompt_r1.clients.environment import EnvironmentReply
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.redaction import Redactor

__all__ = [
    "MeteredAgent",
    "MeteredEnvironment",
    "budget_rule",
    "check_budget_prices",
    "episode_cost",
    "priced_models",
]


class MeteredEnvironment:
    """The environment, with every successful call added to the meter as it returns (for --budget), and the API
    keys cut out of its errors before the graph keeps them (in the episode's state, and so in checkpoints)."""

    def __init__(self, inner: Any, meter: UsageMeter, redact: Redactor) -> None:
        self.inner, self.meter, self.redact = inner, meter, redact

    async def respond(self, prompt: str, history=(), *, run_config=None, **options: Any) -> EnvironmentReply:
        try:
            reply = await self.inner.respond(prompt, history, run_config=run_config, **options)
        except Exception as exc:
            self.redact.exception(exc)
            raise
        if (
            not reply.cached
        ):  # a reply replayed from the response cache was not paid for (clients.response_cache)
            self.meter.add(
                "environment", reply.model or "environment", reply.input_tokens, reply.output_tokens
            )
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class MeteredAgent:
    """The agent, metered, with the API keys cut out of its errors (LangGraph writes a failed node's error to
    the checkpoint)."""

    def __init__(self, inner: AgentBackend, meter: UsageMeter, model: str, redact: Redactor) -> None:
        self.inner, self.meter, self.model, self.redact = inner, meter, model, redact

    async def generate(self, request: AgentRequest) -> AgentOutput:
        try:
            output = await self.inner.generate(request)
        except Exception as exc:
            self.redact.exception(exc)
            raise
        self.meter.add("agent", self.model, output.prompt_tokens, output.completion_tokens)
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def environment_cost(state: dict[str, Any], prices: PriceTable) -> float | None:
    """What an episode's environment calls cost, each priced by the model that answered; None when one is
    unpriced. Training pays only these: its agent is the model being trained. A call replayed from the response
    cache costs nothing."""
    total = 0.0
    for turn in state.get("turns", []):
        call = turn.get("environment_call")
        if call and not call.get("cached"):
            cost = prices.cost(call.get("model") or "", call["input_tokens"], call["output_tokens"])
            if cost is None:
                return None
            total += cost
    return total


def episode_cost(state: dict[str, Any], prices: PriceTable, agent_model: str) -> float | None:
    """The priced cost of a whole episode (turns paid by earlier runs included); None when a model is unpriced."""
    total = environment_cost(state, prices)
    if total is None:
        return None
    usage = state.get("usage", {})
    agent = prices.cost(
        agent_model, usage.get("agent_prompt_tokens", 0), usage.get("agent_completion_tokens", 0)
    )
    if agent is None:
        return None
    return total + agent


def row_cost(row: dict[str, Any], prices: PriceTable, agent_model: str, *, agent_paid: bool) -> float | None:
    """The estimated dollars of one evaluation row: every environment call it made (an episode's turns, a
    baseline's `environment_calls`, each priced by the model that answered) plus the agent's tokens. An unpriced
    paid model makes the row unpriced (None); an agent that is not `agent_paid` (a local model) costs 0 unless
    the table prices it."""
    calls = [t["environment_call"] for t in row.get("turns") or () if t.get("environment_call")]
    calls += list(row.get("environment_calls") or ())
    total = 0.0
    for call in calls:
        if call.get("cached"):  # replayed from the response cache: not paid for by this run
            continue
        cost = prices.cost(call.get("model") or "", call["input_tokens"], call["output_tokens"])
        if cost is None:
            return None
        total += cost
    usage = row.get("usage") or {}
    read, written = usage.get("agent_prompt_tokens", 0), usage.get("agent_completion_tokens", 0)
    if read or written:
        agent = prices.cost(agent_model, read, written)
        if agent is None and agent_paid:
            return None
        total += agent or 0.0
    return total


def priced_models(environment: Any, agent: Any) -> dict[str, str]:
    """What a budget is spent on: label → model name, for every environment model (each pool member's) and for a
    served agent (an in-process agent makes no paid calls). The clients, or their configs (a dry run's, which
    builds no client)."""
    members = [] if environment is None else getattr(environment, "members", None) or [environment]
    models = {}
    for member in members:
        model = str(getattr(member, "model_name", None) or getattr(member, "model", None) or "environment")
        name = getattr(member, "name", None)
        label = f"environment model {model!r}" + (f" (pool member {name})" if len(members) > 1 else "")
        models[label] = model
    config = getattr(agent, "config", agent)  # a backend, or an agent config
    if getattr(config, "resolved_backend", None) == "served":
        models[f"agent model {config.model!r}"] = str(config.model)
    return models


def budget_rule(meter: UsageMeter, budget: float | None) -> Callable[[], str | None] | None:
    """A worker pool's stop rule for `budget` dollars (prompt_r1.runs.pool): the reason to stop once the meter's
    estimated cost reaches it; None without a budget."""
    if budget is None:
        return None

    def over_budget() -> str | None:
        return f"budget of ${budget:g} reached (${meter.cost:.4f} spent)" if meter.cost >= budget else None

    return over_budget


def check_budget_prices(prices: PriceTable, environment: Any, agent: Any) -> None:
    """A `ConfigError` unless every model a budget pays for has a price: an unpriced model's spending would count
    as nothing, and the budget would never stop the run."""
    missing = prices.unpriced(priced_models(environment, agent))
    if missing:
        raise ConfigError(
            f"a budget needs a price for every model it pays for; there is none for {', '.join(missing)}: "
            f"{prices.edit_hint()}, as MODEL: {{input: $, output: $}} per 1M tokens"
        )
