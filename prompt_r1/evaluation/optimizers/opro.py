"""OPRO: "Large Language Models as Optimizers" (Yang et al., 2023), its meta-prompt loop for instruction search,
implemented here (no maintained package exists).

Each step shows the optimiser model the instructions found so far with their scores, sorted ascending (the best
`keep` of them, best last, where the model reads them most closely), and a few training problems with the
instruction's place marked `<INS>`; it asks for a new instruction, different from those and scoring higher. The
step samples `candidates` instructions at `temperature`, scores each on the training rows, and adds them to the
history. The search stops when the next step would exceed the budget of metric calls (one training row answered
under one instruction) or after `steps` steps; the best instruction found is the result.

Defaults are the paper's: 8 candidates per step at temperature 1.0, the 20 best instructions in the meta-prompt,
3 exemplar problems per step, and the empty instruction to start from.
"""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prompt_r1.core.checks import number

__all__ = ["OproSettings", "meta_prompt", "opro_search", "parse_instruction"]

# Scores an instruction on the training rows: (mean score 0-1, metric calls spent).
Evaluate = Callable[[str], Awaitable[tuple[float, int]]]
# Asks the optimiser model once: meta-prompt in, text out.
Propose = Callable[[str], Awaitable[str]]


@dataclass(frozen=True)
class OproSettings:
    candidates: int = 8  # instructions sampled per step
    steps: int = 200  # at most; the budget usually ends the search first
    keep: int = 20  # best instructions shown in the meta-prompt
    exemplars: int = 3  # training problems shown per step
    temperature: float = 1.0  # the optimiser model's sampling temperature
    seed: int = 0

    def __post_init__(self) -> None:
        # nan here would also make a folder's recorded settings unequal to themselves (nan != nan).
        for name in ("candidates", "steps", "keep", "exemplars"):
            number(getattr(self, name), f"OPRO {name}", integer=True, minimum=1)
        number(self.temperature, "OPRO temperature", minimum=0, maximum=2)
        number(self.seed, "OPRO seed", integer=True)


@dataclass
class SearchState:
    """The instructions scored so far, in the order they were tried, and the metric calls spent."""

    scored: list[tuple[str, float]] = field(default_factory=list)
    metric_calls: int = 0
    proposals: int = 0  # optimiser model calls

    def best(self) -> tuple[str, float]:
        # The highest score; among equals the earliest, so a tie never replaces what was found first.
        return max(reversed(self.scored), key=lambda item: item[1])


_INS = re.compile(r"<INS>(.*?)</INS>", re.DOTALL)


def parse_instruction(text: str) -> str | None:
    """The instruction in an optimiser reply: between <INS> and </INS>, else inside square brackets (the paper's
    other format), else the whole reply, as the paper's code takes it; None for an empty or overlong one."""
    found = _INS.search(text) or re.search(r"\[(.*?)\]", text, re.DOTALL)
    instruction = (found.group(1) if found else text).strip()
    return instruction if instruction and len(instruction) <= 2000 else None


def meta_prompt(
    scored: Sequence[tuple[str, float]], exemplars: Sequence[tuple[str, Sequence[str]]], keep: int
) -> str:
    """The paper's meta-prompt for instruction search (its Figure 3, for an instruction placed before the
    question): the best `keep` instructions with scores 0-100 in ascending order, then the exemplar problems."""
    best = sorted(_unique(scored), key=lambda item: item[1])[-keep:]
    lines = [
        "Your task is to generate the instruction <INS>. Below are some previous instructions with their scores. "
        "The score ranges from 0 to 100.",
        "",
    ]
    for instruction, score in best:
        lines += [f"text:\n{instruction or '(empty)'}", f"score:\n{round(100 * score)}", ""]
    lines += ["Below are some problems.", ""]
    for question, answers in exemplars:
        lines += [
            "input:",
            f"Q: <INS>\n{question}",
            "A:",
            "Ground truth answer:",
            answers[0] if answers else "",
            "",
        ]
    lines.append(
        "Generate an instruction that is different from all the instructions <INS> above, and has a higher score "
        "than all the instructions <INS> above. The instruction should begin with <INS> and end with </INS>. "
        "The instruction should be concise, effective, and generally applicable to all problems above."
    )
    return "\n".join(lines)


def _unique(scored: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    seen: dict[str, float] = {}
    for instruction, score in scored:
        seen.setdefault(instruction, score)
    return list(seen.items())


async def opro_search(
    evaluate: Evaluate,
    propose: Propose,
    rows: Sequence[tuple[str, Sequence[str]]],
    *,
    budget: int,
    settings: OproSettings = OproSettings(),
    start: Sequence[str] = ("",),
    on_step: Callable[[int, SearchState], Any] | None = None,
) -> SearchState:
    """Search for an instruction. `rows` are the training problems (question, golden answers) the exemplars are
    drawn from; `evaluate` scores an instruction on them and says what it spent; `budget` caps the metric calls.
    Returns the state, whose `best()` is the result."""
    import asyncio

    rng = random.Random(settings.seed)
    state = SearchState()
    per_instruction = max(1, len(rows))
    for instruction in start:
        if state.metric_calls + per_instruction > budget and state.scored:
            break
        score, calls = await evaluate(instruction)
        state.scored.append((instruction, score))
        state.metric_calls += calls
    barren = 0  # steps in a row that proposed nothing new: the optimiser has run dry
    for step in range(settings.steps):
        room = (budget - state.metric_calls) // per_instruction
        if room < 1 or barren >= 3:
            break
        shown = rng.sample(list(rows), min(settings.exemplars, len(rows)))
        prompt = meta_prompt(state.scored, shown, settings.keep)
        # No more candidates than the budget can still score.
        replies = await asyncio.gather(*(propose(prompt) for _ in range(min(settings.candidates, room))))
        state.proposals += len(replies)
        tried = {instruction for instruction, _ in state.scored}
        fresh = []
        for reply in replies:
            instruction = parse_instruction(reply)
            if instruction is not None and instruction not in tried:
                tried.add(instruction)
                fresh.append(instruction)
        fresh = fresh[:room]
        barren = 0 if fresh else barren + 1
        results = await asyncio.gather(*(evaluate(instruction) for instruction in fresh))
        for instruction, (score, calls) in zip(fresh, results, strict=True):
            state.scored.append((instruction, score))
            state.metric_calls += calls
        if on_step is not None:
            on_step(step, state)
    return state
