"""Spending (prompt_r1.costs' meter and prompt_r1.metering's stop rule), in process."""

from __future__ import annotations

import pytest

from prompt_r1.costs import PriceTable, UsageMeter
from prompt_r1.metering import budget_rule


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
