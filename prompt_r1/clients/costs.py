"""Token usage and its price: a per-model price table and a meter that adds up calls as they return.

    prices = PriceTable.load()                       # the bundled prompt_r1/clients/prices.yaml
    prices = PriceTable.load("my-prices.yaml")       # yours: the bundled entries, replaced and extended by it
    prices.cost("gpt-4o-mini", input_tokens=1200, output_tokens=300)   # dollars, or None when unpriced

The table's unit is US dollars per 1,000,000 tokens, as providers publish them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from prompt_r1.core.checks import number
from prompt_r1.core.errors import ConfigError

__all__ = ["ModelUsage", "PriceTable", "UsageMeter"]


@dataclass(frozen=True)
class Price:
    input: float  # dollars per million prompt tokens
    output: float  # dollars per million completion tokens


class PriceTable:
    def __init__(self, prices: Mapping[str, Price], path: str | Path | None = None) -> None:
        self.prices = dict(prices)
        self.path = None if path is None else Path(path)  # the user's file (--prices), when one was loaded

    def edit_hint(self) -> str:
        """Where a missing price goes, for error messages."""
        if self.path is not None:
            return f"add it to {self.path} (--prices)"
        return "add it to a YAML file and pass it with --prices FILE (its entries add to the bundled prices.yaml)"

    def unpriced(self, models: Mapping[str, str]) -> list[str]:
        """The labels of `models` (label → model name) whose model has no price."""
        return [label for label, model in models.items() if self.price(model) is None]

    @classmethod
    def parse(cls, data: Any, source: str) -> PriceTable:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{source}: a price table maps model names to {{input: $, output: $}} per 1M tokens"
            )
        prices = {}
        for model, entry in data.items():
            if not isinstance(entry, Mapping) or set(entry) - {"input", "output"} or "input" not in entry:
                raise ConfigError(
                    f"{source}: {model}: expected {{input: X, output: Y}} in $ per 1M tokens, got {entry!r}"
                )
            # A nan or inf price would make every estimate, and so every --budget test, meaningless.
            price = Price(
                *(
                    number(entry.get(side, entry["input"]), f"{source}: {model}: the {side} price ($ per 1M "
                           "tokens)", minimum=0)
                    for side in ("input", "output")
                )
            )  # fmt: skip
            prices[str(model)] = price
        return cls(prices)

    @classmethod
    def load(cls, path: str | Path | None = None) -> PriceTable:
        """The bundled table, updated by the file at `path` (YAML or JSON) when given."""
        import yaml

        bundled = resources.files("prompt_r1.clients").joinpath("prices.yaml").read_text(encoding="utf-8")
        table = cls.parse(yaml.safe_load(bundled), "prompt_r1/clients/prices.yaml")
        if path is not None:
            from prompt_r1.core.config import read_yaml_file

            path = Path(path)
            data = read_yaml_file(path, "price table")
            table.prices.update(cls.parse(data, str(path)).prices)
            table.path = path
        return table

    def price(self, model: str) -> Price | None:
        if model in self.prices:
            return self.prices[model]
        best = None
        for name in self.prices:
            if model.startswith(name + "-") and (best is None or len(name) > len(best)):
                best = name
        return self.prices[best] if best is not None else None

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float | None:
        price = self.price(model)
        if price is None:
            return None
        return (input_tokens * price.input + output_tokens * price.output) / 1e6


@dataclass
class ModelUsage:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = 0.0  # None: the model has no price

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": None if self.cost is None else round(self.cost, 6),
        }


@dataclass
class UsageMeter:
    """Usage per (role, model), priced as it accumulates. `cost` sums the priced models only."""

    prices: PriceTable
    by_model: dict[tuple[str, str], ModelUsage] = field(default_factory=dict)

    def add(
        self, role: str, model: str, input_tokens: int, output_tokens: int, calls: int = 1
    ) -> float | None:
        usage = self.by_model.setdefault((role, model), ModelUsage())
        usage.calls += calls
        usage.input_tokens += input_tokens
        usage.output_tokens += output_tokens
        cost = self.prices.cost(model, input_tokens, output_tokens)
        if cost is None:
            usage.cost = None
        elif usage.cost is not None:
            usage.cost += cost
        return cost

    @property
    def cost(self) -> float:
        return sum(u.cost for u in self.by_model.values() if u.cost is not None)

    @property
    def unpriced(self) -> list[str]:
        return sorted({model for (_, model), u in self.by_model.items() if u.cost is None})

    def totals(self, role: str) -> tuple[int, int]:
        ins = sum(u.input_tokens for (r, _), u in self.by_model.items() if r == role)
        outs = sum(u.output_tokens for (r, _), u in self.by_model.items() if r == role)
        return ins, outs

    def to_dict(self) -> dict[str, Any]:
        return {
            "cost_usd": round(self.cost, 6),
            "unpriced_models": self.unpriced,
            "models": [
                {"role": role, "model": model, **u.to_dict()}
                for (role, model), u in sorted(self.by_model.items())
            ],
        }
