"""What `prompt-r1 eval --dry-run` prints: every method's rows and every prompt optimiser's search, estimated with the
episode model of prompt_r1.runs.estimate, from the rows still to run in the output folder. Nothing is sent.

A search's calls (prompt_r1.evaluation.optimizers.search) are its metric calls (a training row answered under a
candidate instruction: the search spends its `budget` of them, GEPA up to one evaluation of the training rows
more) and the optimiser model's calls, whose number each optimiser fixes its own way:
- OPRO: one proposal per instruction scored, expected `budget // train_rows - 1`; at most `candidates` per step for
  `min(steps, 4 × that)` steps (three barren steps in a row end it);
- GEPA: one reflection per iteration of two 3-row minibatches, expected `budget / 6`, at most `budget / 3`;
- TextGrad: per step, a gradient per minibatch row and one update, `2 × 3 + 1`, for `budget // (3 + train_rows)`
  steps.
A search done before with the same settings is read back, not paid again: it counts as nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.core.config import LoopConfig
from prompt_r1.data.datasets import Sample
from prompt_r1.evaluation.optimizers.opro import meta_prompt
from prompt_r1.evaluation.optimizers.search import (
    FOLDER,
    OPTIMIZERS,
    SearchSettings,
    instruction_request,
    training_rows,
)
from prompt_r1.evaluation.rows import baseline_request as run_request
from prompt_r1.loop.protocols import protocol_for
from prompt_r1.runs.estimate import (
    MESSAGE_TOKENS,
    EpisodeShape,
    Part,
    TokenCounter,
    episode_part,
    single_call_part,
)

__all__ = ["ASSUMED_INSTRUCTION", "baseline_request", "eval_parts", "search_part"]

# An optimiser's instruction as the dry run assumes it: a few sentences.
ASSUMED_INSTRUCTION = "Read the question carefully, reason about what it asks, and answer it concisely. " * 2
_TEMPLATE_CHARS = 1200  # the text GEPA and TextGrad put around a reflection's rows, about
_MINIBATCH = 3  # GEPA's reflection minibatch, TextGrad's (prompt_r1.evaluation.optimizers.textgrad_search)


def _searched(out_dir: Path, method: str, dataset: str, settings: SearchSettings) -> bool:
    """A search already recorded in the folder with these settings and no failed call: read back, not paid."""
    path = out_dir / FOLDER / method / f"{dataset}.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(record, dict)
        and record.get("settings") == json.loads(json.dumps(settings.to_dict()))
        and not (record.get("calls") or {}).get("failed")
    )


def _reflection_calls(method: str, settings: SearchSettings, rows: int) -> tuple[float, float, float]:
    budget = settings.budget
    if method == "opro":
        room = max(0, budget // rows - 1)
        most = min(settings.opro.steps, 4 * room) * settings.opro.candidates
        return (float(min(room, 1)), float(room), float(most))
    if method == "gepa":
        return (1.0, budget / (2 * _MINIBATCH), budget / _MINIBATCH)
    steps = max(0, (budget - rows) // (_MINIBATCH + rows))
    return (float(steps), float(steps * (2 * _MINIBATCH + 1)), float(steps * (2 * _MINIBATCH + 1)))


def search_part(
    method: str,
    dataset: str,
    train: Sequence[Sample],
    settings: SearchSettings,
    shape: EpisodeShape,
    *,
    prices: PriceTable,
    env_model: str,
    counter: TokenCounter,
    reply_max: float,
) -> list[Part]:
    """The search's metric calls (the environment answering training rows) and its optimiser model's calls."""
    rows = len(train)
    per_row = [
        counter.text(instruction_request(ASSUMED_INSTRUCTION, s.question)) + MESSAGE_TOKENS for s in train
    ]
    metric = settings.budget // rows * rows if method == "opro" else settings.budget
    most = settings.budget + (rows if method == "gepa" else 0)
    # Every training row answered about equally often: the calls per row, per scenario.
    task = single_call_part(
        f"{method} search on {dataset}: metric calls",
        per_row,
        shape,
        prices=prices,
        model=env_model,
        kind="search",
        calls_per_request=(metric / rows, metric / rows, most / rows),
        note=f"{settings.budget} metric calls",
    )
    reflection_model = settings.reflection_model or env_model
    instruction = counter.text(ASSUMED_INSTRUCTION)
    if method == "opro":
        shown = [(s.question, s.golden_answers) for s in train[: settings.opro.exemplars]]
        scored = [(ASSUMED_INSTRUCTION, 0.5)] * min(settings.opro.keep, max(1, settings.budget // rows))
        prompt = counter.text(meta_prompt(scored, shown, settings.opro.keep))
    else:  # the instruction, and a minibatch of rows with their replies and feedback, in the package's template
        prompt = (
            counter.text(" " * _TEMPLATE_CHARS)
            + instruction
            + _MINIBATCH * (sum(per_row) / rows + shape.reply[1])
        )
    calls = _reflection_calls(method, settings, rows)
    reflection = single_call_part(
        f"{method} search on {dataset}: optimiser model {reflection_model}",
        [prompt + MESSAGE_TOKENS],
        shape.__class__(
            calls=shape.calls,
            agent_turn=shape.agent_turn,
            prompt=shape.prompt,
            reply=(instruction, instruction, reply_max),
            chars_per_token=shape.chars_per_token,
        ),  # fmt: skip
        prices=prices,
        model=reflection_model,
        kind="search",
        calls_per_request=calls,
    )
    reflection.note = f"{calls[1]:.0f} optimiser calls expected"
    return [task, reflection]


def eval_parts(
    out_dir: Path,
    methods: Sequence[str],
    pending: dict[str, list[Sample]],
    sources: dict[str, str],
    samples: Sequence[Sample],
    shape: EpisodeShape,
    *,
    loop: LoopConfig,
    prices: PriceTable,
    env_model: str | None,
    agent_model: str | None,
    agent_paid: bool,
    agent_max_tokens: int,
    search: SearchSettings,
    counter: TokenCounter,
) -> list[Part]:
    """The parts of one folder's run: per method and dataset its pending rows (`pending[method]`), and each
    optimiser's search that is not recorded yet."""
    protocol = protocol_for(loop)
    parts: list[Part] = []
    for method in methods:
        by_dataset: dict[str, list[Sample]] = {}
        for sample in pending.get(method, []):
            by_dataset.setdefault(str(sample.dataset), []).append(sample)
        for dataset in dict.fromkeys(str(s.dataset) for s in samples):
            rows = by_dataset.get(dataset, [])
            label = f"{method} on {dataset}"
            if method in OPTIMIZERS and not _searched(out_dir, method, dataset, search):
                evaluated = [s.question for s in samples if str(s.dataset) == dataset]
                train = training_rows(
                    sources[dataset], len(evaluated), search, exclude=evaluated, log=_Quiet()
                )
                parts += search_part(
                    method, dataset, train, search, shape, prices=prices, env_model=str(env_model),
                    counter=counter, reply_max=shape.reply[2],
                )  # fmt: skip
            if not rows:
                continue
            if method == "prompt-r1":
                firsts = [counter.first_prompt(protocol, s.question) for s in rows]
                parts.append(
                    episode_part(
                        label,
                        firsts,
                        shape,
                        loop=loop,
                        prices=prices,
                        env_model=str(env_model),
                        agent_model=agent_model,
                        agent_paid=agent_paid,
                        counter=counter,
                        system_prompt=protocol.environment_system_prompt,
                    )  # fmt: skip
                )
                continue
            if method == "agent-only":
                requests = [
                    counter.messages([{"role": "user", "content": baseline_request(method, s)}]) for s in rows
                ]
                parts.append(
                    single_call_part(
                        label,
                        requests,
                        shape,
                        prices=prices,
                        model=str(agent_model),
                        role="agent",
                        paid=agent_paid,
                        max_out=float(agent_max_tokens),
                    )  # fmt: skip
                )
                continue
            requests = [
                counter.messages([{"role": "user", "content": baseline_request(method, s)}]) for s in rows
            ]
            parts.append(single_call_part(label, requests, shape, prices=prices, model=str(env_model)))
    return parts


def baseline_request(method: str, sample: Sample) -> str:
    """The environment's request of a single-call method's row, as the run sends it (an optimiser's under the
    assumed instruction)."""
    instruction = ASSUMED_INSTRUCTION if method in OPTIMIZERS else None
    return run_request(method, sample.question, instruction)


class _Quiet:
    """Where a dry run's training-row warnings go: the real run prints them."""

    def write(self, text: str) -> Any:
        return len(text)

    def flush(self) -> None:
        return None
