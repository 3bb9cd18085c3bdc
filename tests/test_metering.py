"""Spending (prompt_r1.clients.costs' meter and prompt_r1.runs.metering's stop rule), in process."""

from __future__ import annotations

import pytest

from prompt_r1.clients.costs import PriceTable, UsageMeter
from prompt_r1.runs.metering import budget_rule


def test_the_meter_prices_known_models_and_names_the_unpriced():
    meter = UsageMeter(PriceTable.load())
    meter.add("environment", "gpt-4o-mini", 1_000_000, 0)
    meter.add("agent", "my-agent", 10, 10)
    assert meter.cost == pytest.approx(0.15) and meter.unpriced == ["my-agent"]


def test_the_budget_rule_gives_a_reason_once_the_cost_reaches_the_budget():
    meter = UsageMeter(PriceTable.load())
    assert budget_rule(meter, None) is None
    rule = budget_rule(meter, 0.1)
    assert rule() is None
    meter.add("environment", "gpt-4o-mini", 1_000_000, 0)  # $0.15 at the bundled price
    assert rule() == "budget of $0.1 reached ($0.1500 spent)"


def test_a_rows_cost_prices_each_environment_call_and_a_local_agent_is_free_unless_priced():
    from prompt_r1.runs.metering import row_cost

    prices = PriceTable.load()
    call = {"model": "gpt-4o-mini", "input_tokens": 1_000_000, "output_tokens": 0}
    row = {"turns": [{"environment_call": call}, {}], "usage": {"agent_prompt_tokens": 10}}
    assert row_cost(row, prices, "my-local-agent", agent_paid=False) == pytest.approx(0.15)
    assert row_cost(row, prices, "my-served-agent", agent_paid=True) is None  # a paid model with no price
    baseline = {"environment_calls": [call, {**call, "model": "nobody-prices-this"}]}
    assert row_cost(baseline, prices, "agent", agent_paid=True) is None
