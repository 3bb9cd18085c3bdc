"""The report `--dry-run` prints: an estimate (prompt_r1.runs.estimate) as aligned lines of what the run would do.

    print(render_estimate(estimate))

One line a figure: the run's parts (where there are several), calls, tokens and dollars expected and at most, who
is paid what where an agent is paid or a price is missing, the searches' share, the time the environment's limits
alone impose, where a cap stops the run, and the estimate's notes.
"""

from __future__ import annotations

import math

from prompt_r1.runs.estimate import Estimate

__all__ = ["format_usd", "render_estimate"]


def render_estimate(estimate: Estimate) -> str:
    """The report `--dry-run` prints."""
    totals = estimate.total()
    lines: list[tuple[str, str]] = [(estimate.title, "nothing sent, no model loaded"), *estimate.header]
    if estimate.shape is not None:
        lines.append(("model", estimate.shape.source))
    for part in estimate.parts if len(estimate.parts) > 1 else ():
        s = part.spend
        lines.append(
            (
                part.label,
                f"{part.episodes:,} {'episodes' if part.kind != 'search' else 'requests'} · "
                f"{_n(s['expected'].env_calls)} environment calls expected, at most {_n(s['high'].env_calls)} · "
                f"{format_usd(s['expected'].usd)}" + (f" ({part.note})" if part.note else ""),
            )
        )
    exp, high, low = totals["expected"], totals["high"], totals["low"]
    lines += [
        ("environment calls", f"{_n(exp.env_calls)} expected · at most {_n(high.env_calls)}"),
        ("agent calls", f"{_n(exp.agent_calls)} expected · at most {_n(high.agent_calls)}"),
        (
            "environment tokens",
            f"{_n(exp.env_in)} in / {_n(exp.env_out)} out expected · up to {_n(high.env_in)} / {_n(high.env_out)}",
        ),
        (
            "agent tokens",
            f"{_n(exp.agent_in)} in / {_n(exp.agent_out)} out expected · up to {_n(high.agent_in)} / "
            f"{_n(high.agent_out)}",
        ),
        (
            "dollars",
            f"low {format_usd(low.usd)} · expected {format_usd(exp.usd)} · high {format_usd(high.usd)}",
        ),
    ]
    if (
        exp.agent_usd != 0 or exp.usd is None
    ):  # who is paid what, where an agent is paid or a price is missing
        lines.append(
            (
                "of which",
                f"environment {format_usd(low.env_usd)} · {format_usd(exp.env_usd)} · {format_usd(high.env_usd)}; "
                f"agent {format_usd(low.agent_usd)} · {format_usd(exp.agent_usd)} · {format_usd(high.agent_usd)}",
            )
        )
    searches = estimate.total("search")
    if any(p.kind == "search" for p in estimate.parts):
        share = (
            f"{searches['expected'].usd / exp.usd:.0%}"
            if exp.usd and searches["expected"].usd is not None
            else "-"
        )
        lines.append(
            (
                "searches' share",
                f"{format_usd(searches['expected'].usd)} of {format_usd(exp.usd)} expected ({share}) · high "
                f"{format_usd(searches['high'].usd)}",
            )
        )
    if estimate.environment is not None:
        env = estimate.environment
        limit = f"{env.rate_limit:,} requests per {env.rate_period:g} s"
        if env.tokens_per_minute:
            limit += f", {env.tokens_per_minute:,} tokens per minute"
        if env.token_limit:
            limit += f", {env.token_limit:,} tokens per {env.rate_period:g} s"
        lines.append(
            (
                "time (limits alone)",
                f"expected {_hours(estimate.limit_seconds(exp))} · high {_hours(estimate.limit_seconds(high))} "
                f"at {limit}",
            )
        )
    stops = estimate.stops()
    for line in stops:
        lines.append(("cap", line))
    for note in [*estimate.notes, *(estimate.shape.notes if estimate.shape else ())]:
        lines.append(("note", note))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def _n(value: float) -> str:
    return f"{value:,.0f}" if math.isfinite(value) else "beyond measure"


def format_usd(value: float | None) -> str:
    if value is None:
        return "unpriced"
    if not math.isfinite(value):
        return "beyond measure"
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def _hours(seconds: float) -> str:
    if not math.isfinite(seconds):  # a rate period of 1e308 s: no figure to give (JSON: null)
        return "beyond measure"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
