"""Prompt-optimiser baselines for `eval` (the paper's Table 2 compares Prompt-R1 with them on one environment):
search the environment's instruction on training rows disjoint from the evaluated ones, then answer the evaluated
rows as `env-only` does, with the best instruction found placed before the question.

    record = await find_instruction("opro", "hotpot", train, environment, reflection, SearchSettings(), prices)
    record["instruction"], record["score"], record["calls"], record["cost_usd"]

- **Training rows.** By default the dataset's rows after the evaluated ones (the bundled sets have 128 rows: with
  `--limit 64`, rows 64 on), at most `train_rows` of them; or a file of the user's.
- **Every call through our client.** The task model is the run's environment client and the optimiser
  ("reflection") model a client of the same endpoint, so rate limits, retries, key redaction and token counts
  apply to the search as to every other call. A call that fails after its retries scores its row 0 and is
  counted.
- **Replayed, not paid.** With the run's response cache (`--env-cache`), a task call answered before is replayed
  from it: counted as a call (`calls.cached`), never as spending, in the record's dollars or against `--budget`.
- **Resumable.** The search's record (the best instruction, its score, every instruction tried, calls, tokens and
  dollars) is written to `OUT/optimized/<method>/<dataset>.json`; a rerun with the same settings reads it instead
  of paying for the search again. Nothing is written outside `OUT`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from prompt_r1.clients.costs import PriceTable, UsageMeter
from prompt_r1.core.checks import number
from prompt_r1.core.errors import ConfigError, ContextOverflow, EnvironmentCallError, PromptR1Error
from prompt_r1.core.files import write_whole
from prompt_r1.core.prompts import DIRECT_ANSWER_TEMPLATE
from prompt_r1.core.protocol import last_answer
from prompt_r1.data.datasets import Sample, load_samples
from prompt_r1.evaluation.optimizers.opro import OproSettings, opro_search
from prompt_r1.scoring.metrics import f1, normalize_answer

__all__ = [
    "OPTIMIZERS",
    "SearchSettings",
    "SearchStopped",
    "check_search_prices",
    "find_instruction",
    "instruction_request",
    "load_or_find",
    "score_reply",
    "search_instructions",
    "search_spend",
    "training_rows",
]

OPTIMIZERS = ("opro", "gepa", "textgrad")  # eval methods that search an instruction first
FOLDER = "optimized"


class SearchStopped(PromptR1Error):
    """The run's budget was reached during a search: no further call was sent, and the search, unfinished, is not
    recorded (the next run does it again)."""


@dataclass(frozen=True)
class SearchSettings:
    budget: int = 200  # metric calls: one training row answered under one instruction
    train_rows: int = 16
    reflection_model: str | None = None  # the optimiser model; None: the environment's model
    train_file: str | None = (
        None  # training rows from a file instead of the dataset's rows after the evaluated
    )
    opro: OproSettings = field(default_factory=OproSettings)

    def __post_init__(self) -> None:
        number(self.budget, "search budget", integer=True, minimum=1)
        number(self.train_rows, "search train_rows", integer=True, minimum=1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def score_reply(text: str, golden_answers: Sequence[str]) -> float:
    """A training row's score: the token F1 of the reply's answer (its last <answer>, else the whole reply)."""
    tagged = last_answer(text)
    return f1(tagged if tagged is not None else text.strip(), golden_answers)


def instruction_request(instruction: str, question: str) -> str:
    """The environment's request under an instruction: the instruction, then `env-only`'s request."""
    request = DIRECT_ANSWER_TEMPLATE.format(question=question)
    return f"{instruction}\n\n{request}" if instruction else request


def training_rows(
    name: str,
    evaluated: int,
    settings: SearchSettings,
    exclude: Collection[str] = (),
    *,
    log: TextIO | None = None,
) -> list[Sample]:
    """The rows a search learns from: `settings.train_file`'s first rows, else `name`'s rows after the first
    `evaluated` (the evaluated ones), at most `train_rows`; never a row whose question, normalised, is in
    `exclude` (the evaluated questions: a dataset may hold one question twice). A training file that holds
    evaluated questions (it may be the evaluated file itself) is warned about on `log`: they are left out, so
    the search learns from fewer or other rows than the file's first ones."""
    excluded = {normalize_answer(q) for q in exclude}
    source = load_samples(settings.train_file) if settings.train_file else load_samples(name)[evaluated:]
    kept = [s for s in source if normalize_answer(s.question) not in excluded]
    if settings.train_file and len(kept) < len(source):
        from prompt_r1.data.datasets import resolve_source

        same = resolve_source(settings.train_file)[0].resolve() == resolve_source(name)[0].resolve()
        print(
            f"prompt-r1: warning: --optimizer-train {settings.train_file} "
            + (f"is the evaluated file {name}" if same else f"shares questions with the evaluated {name}")
            + f": {len(source) - len(kept)} of its rows are evaluated questions and are left out of the search "
            f"(it learns from {min(len(kept), settings.train_rows)} other rows); give a file of other questions",
            file=log if log is not None else sys.stderr,
        )
    rows = kept[: settings.train_rows]
    if not rows:
        raise ConfigError(
            f"{settings.train_file or name} has no rows apart from the {evaluated} evaluated ones for the optimiser "
            "to learn from: evaluate fewer (--limit) or give other training rows (--optimizer-train FILE)"
        )
    return rows


async def find_instruction(
    method: str,
    dataset: str,
    train: Sequence[Sample],
    environment: Any,
    reflection: Any,
    settings: SearchSettings,
    prices: PriceTable,
    *,
    log: TextIO | None = None,
    log_dir: str | Path | None = None,
    spend: UsageMeter | None = None,
    stop: Callable[[], str | None] | None = None,
) -> dict[str, Any]:
    """Search an instruction for `dataset` with `method` and return its record (see the module docstring).
    `log_dir`: where a package that keeps its own log files (TextGrad) writes them. `spend`: the run's meter, which
    every call of the search is added to as well; `stop`: the run's budget rule, asked before each call, whose
    reason ends the search with `SearchStopped` (as a row is not started once the budget is reached)."""
    if method not in OPTIMIZERS:
        raise ConfigError(f"unknown optimiser {method!r}; choose from {', '.join(OPTIMIZERS)}")
    log = log if log is not None else sys.stderr
    # `meter`: every call and its tokens; `paid`: the calls sent, what the search cost. A reply replayed from the
    # response cache (`--env-cache`) was not paid for: it counts as a call, never as spending (nor in `spend`).
    meter, paid, failed, replayed = UsageMeter(prices), UsageMeter(prices), [0], [0]

    async def ask(client: Any, role: str, prompt: str) -> str:
        """One call of the search, metered under `role`; "" when it failed after its retries."""
        reason = stop() if stop is not None else None
        if reason is not None:
            raise SearchStopped(f"{reason} during the {method} search for {dataset}")
        try:
            reply = await client.respond(prompt)
        except (EnvironmentCallError, ContextOverflow):
            failed[0] += 1
            return ""
        cached = bool(getattr(reply, "cached", False))
        replayed[0] += cached
        for each in (meter,) if cached else (meter, paid, spend):
            if each is not None:
                each.add(role, reply.model or "", reply.input_tokens, reply.output_tokens)
        return reply.text

    async def task_reply(instruction: str, question: str) -> str:
        """The environment's reply to the question under the instruction."""
        return await ask(environment, "task", instruction_request(instruction, question))

    async def answer(instruction: str, row: tuple[str, Sequence[str]]) -> tuple[float, str]:
        """One metric call: the row's question under the instruction; its score and the reply."""
        text = await task_reply(instruction, row[0])
        return score_reply(text, row[1]), text

    async def evaluate(instruction: str) -> tuple[float, int]:
        results = await asyncio.gather(*(answer(instruction, row) for row in rows))
        return sum(score for score, _ in results) / len(results), len(results)

    async def propose(prompt: str) -> str:
        return await ask(reflection, "reflection", prompt)

    def on_step(step: int, state: Any) -> None:
        best = state.best()
        print(
            f"{method} {dataset}: step {step + 1}, best {best[1]:.3f} of {len(state.scored)} instructions, "
            f"{state.metric_calls}/{settings.budget} metric calls",
            file=log,
        )

    rows = [(s.question, s.golden_answers) for s in train]
    if method == "textgrad":
        from prompt_r1.evaluation.optimizers.textgrad_search import textgrad_search

        instruction, score, metric_calls, history = await textgrad_search(
            task_reply, score_reply, propose, rows, budget=settings.budget, seed=settings.opro.seed,
            log_dir=log_dir,
        )  # fmt: skip
    elif method == "gepa":
        from prompt_r1.evaluation.optimizers.gepa_search import gepa_search

        instruction, score, metric_calls, history = await gepa_search(
            answer, propose, rows, budget=settings.budget, seed=settings.opro.seed
        )
    else:
        state = await opro_search(
            evaluate, propose, rows, budget=settings.budget, settings=settings.opro, on_step=on_step
        )
        (instruction, score), metric_calls, history = state.best(), state.metric_calls, state.scored
    print(f"{method} {dataset}: best instruction scores {score:.3f} on {len(rows)} training rows", file=log)
    if failed[0]:
        print(
            f"prompt-r1: warning: {failed[0]} calls of the {method} search for {dataset} failed after "
            "their retries (their rows scored 0); the search is kept for this run and done again by the next",
            file=log,
        )
    calls = {"task": 0, "reflection": 0}
    for (role, _), usage in meter.by_model.items():
        calls[role] += usage.calls
    return {
        "method": method,
        "dataset": dataset,
        "instruction": instruction,
        "score": score,
        "train_ids": [s.id for s in train],
        "metric_calls": metric_calls,
        "calls": {
            "task": calls["task"],
            "reflection": calls["reflection"],
            "failed": failed[0],
            "cached": replayed[0],  # of those, replayed from the response cache: not sent, not paid
        },
        "tokens": {
            "input": sum(u.input_tokens for u in meter.by_model.values()),
            "output": sum(u.output_tokens for u in meter.by_model.values()),
        },
        "cost_usd": None if paid.unpriced else paid.cost,  # the calls sent only
        "history": [{"instruction": i, "score": s} for i, s in history],
        "settings": settings.to_dict(),
    }


def search_spend(record: dict[str, Any]) -> dict[str, Any]:
    """A search's calls (metric and optimiser model, replayed ones included, as a row's `env_calls`), tokens and
    dollars (the calls sent only, as a row's `cost_usd`), as a summary row's spend columns."""
    return {
        "search_calls": record["metric_calls"] + record["calls"]["reflection"],
        "search_input_tokens": record["tokens"]["input"],
        "search_output_tokens": record["tokens"]["output"],
        "search_usd": record["cost_usd"],
    }


def check_search_prices(
    prices: PriceTable, methods: Sequence[str], settings: SearchSettings, environment_config: Any
) -> None:
    """A `ConfigError` unless the optimiser model a budgeted search pays for has a price (its task calls are the
    environment's, checked with the rows): unpriced, its calls would count as nothing against the budget."""
    if not any(m in OPTIMIZERS for m in methods) or environment_config is None:
        return
    model = settings.reflection_model or environment_config.model
    missing = prices.unpriced({f"optimiser model {model!r} (--reflection-model)": model})
    if missing:
        raise ConfigError(
            f"a budget needs a price for every model it pays for; there is none for {missing[0]}: "
            f"{prices.edit_hint()}, as MODEL: {{input: $, output: $}} per 1M tokens"
        )


async def load_or_find(
    out_dir: str | Path, method: str, dataset: str, find, settings: SearchSettings, train: Sequence[Sample]
) -> dict:
    """The search's record from `OUT/optimized/<method>/<dataset>.json` when it was made with these settings on
    these training rows and none of its calls failed, else `await find()`, written there (whole or not at all)
    before it is returned."""
    path = Path(out_dir) / FOLDER / method / f"{dataset}.json"
    if path.exists():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = None
        same = isinstance(record, dict) and record.get("settings") == json.loads(
            json.dumps(settings.to_dict())
        )
        # Only a search on the same training rows whose every call succeeded is taken as done.
        if same and record.get("train_ids") == [s.id for s in train] and not record["calls"].get("failed"):
            return record
    record = await find()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return record


async def search_instructions(
    out_dir: str | Path,
    methods: Sequence[str],
    sources: dict[str, str],
    samples: Sequence[Sample],
    environment: Any,
    environment_config: Any,
    settings: SearchSettings,
    prices: PriceTable,
    *,
    log: TextIO | None = None,
    spend: UsageMeter | None = None,
    budget: float | None = None,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Every optimiser method's record for every dataset (`sources`: dataset label → name or file), searched or
    read back (`load_or_find`). The optimiser model is a client of the environment's endpoint with the
    reflection model and OPRO's sampling temperature. `spend` and `budget`: the run's meter and dollar cap, shared
    with its rows: each search call is added to it, and a search that reaches the cap raises `SearchStopped`."""
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.runs.metering import budget_rule

    records: dict[tuple[str, str], dict[str, Any]] = {}
    chosen = [m for m in methods if m in OPTIMIZERS]
    if not chosen:
        return records
    reflection = EnvironmentClient(
        dataclasses.replace(
            environment_config,
            model=settings.reflection_model or environment_config.model,
            temperature=settings.opro.temperature,
        )
    )
    for method in chosen:
        for label, name in sources.items():
            mine = [s.question for s in samples if s.dataset == label]
            train = training_rows(name, len(mine), settings, exclude=mine, log=log)

            async def find(method=method, label=label, train=train) -> dict[str, Any]:
                return await find_instruction(
                    method, label, train, environment, reflection, settings, prices, log=log,
                    log_dir=Path(out_dir) / FOLDER / method / "logs", spend=spend,
                    stop=budget_rule(spend, budget) if spend is not None else None,
                )  # fmt: skip

            records[(method, label)] = await load_or_find(out_dir, method, label, find, settings, train)
    return records
