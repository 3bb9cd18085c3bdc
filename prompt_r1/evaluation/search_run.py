"""One folder's evaluation with its prompt optimisers: their searches first, then the rows (`prompt-r1 eval`).

    records, outcome = await search_then_run(out, methods, sources, samples, environment, env_cfg, search,
                                             prices, agent=agent, loop=loop, budget=5.0, ...)

The searches (prompt_r1.evaluation.optimizers.search) find, or read back, each optimiser's instruction per
dataset; the rows then run through `run_evaluation` (prompt_r1.evaluation.harness) with those instructions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prompt_r1.clients.costs import PriceTable, UsageMeter
from prompt_r1.data.datasets import Sample
from prompt_r1.evaluation.harness import RunOutcome, run_evaluation
from prompt_r1.evaluation.optimizers.search import SearchSettings, SearchStopped, search_instructions

__all__ = ["search_then_run"]


async def search_then_run(
    out: str | Path,
    methods: Sequence[str],
    sources: dict[str, str],
    samples: Sequence[Sample],
    environment: Any,
    env_cfg: Any,
    search: SearchSettings,
    prices: PriceTable,
    **options: Any,
) -> tuple[dict[tuple[str, str], dict[str, Any]], RunOutcome]:
    """The optimisers' searches (read back when done before), then the rows: one event loop for both, so the
    environment's client serves them on the loop it was first used on. One meter for both, so that `budget`
    covers the searches' calls as it covers the rows': a search that reaches it stops, and no row starts.
    `options`: the rest of `run_evaluation`'s keywords. Returns each search's record by (method, dataset), and
    the rows' outcome."""
    meter = UsageMeter(prices)
    try:
        records = await search_instructions(
            out, methods, sources, samples, environment, env_cfg, search, prices, spend=meter,
            budget=options.get("budget"),
        )  # fmt: skip
    except SearchStopped as exc:
        # The search is not recorded; the next run, with a higher budget, does it again.
        return {}, RunOutcome(stopped=str(exc), usage=meter.to_dict())
    instructions = {key: record["instruction"] for key, record in records.items()}
    outcome = await run_evaluation(
        out, methods, samples, environment=environment, environment_config=env_cfg, prices=prices,
        instructions=instructions, search=search.to_dict(), meter=meter, **options,
    )  # fmt: skip
    return records, outcome
