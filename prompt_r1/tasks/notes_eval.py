"""The notes task's comparison (`prompt_r1.tasks.notes`): every method on the same held-out questions, one table.

Methods, each scored by exact match and token F1 of its final answer against the gold name:
- `direct`: the environment asked the question (with its notes), as `prompt-r1 eval --method env-only` asks it
  (the question, then a request for the answer in <answer> tags; the tagged answer, else the whole reply);
- `instruction`: the same with a hand-written instruction (`INSTRUCTION`);
- `opro`, `gepa`: the same with the best instruction the project's optimisers find on training-pool questions,
  the built-in model as the optimiser too (`search_instruction`);
- agents (`agent_method`): the untrained (cold-started) and the trained agent through the loop, whose
  environment calls reach the question's sheet (`NotesEnvironment`).
Controls: `withheld=True` gives every call the empty sheet (no notes: an agent can then only guess), and
`at_once` in the figures is the share of episodes that answered without a call.

Questions run in chunks of `CHUNK` (one sheet each, all names distinct, put in play together), concurrently
within a chunk, so the environment server batches them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from prompt_r1.core.protocol import last_answer
from prompt_r1.scoring.metrics import exact_match, f1
from prompt_r1.tasks.notes import NotesEnvironment, NotesQuestion, NotesWorld, questions_for

__all__ = [
    "CHUNK",
    "INSTRUCTION",
    "agent_method",
    "env_method",
    "held_out",
    "search_instruction",
    "summary",
]

CHUNK = 50
INSTRUCTION = "Answer with only the name, nothing else."


def held_out(n: int, seed: int) -> list[NotesQuestion]:
    """`n` questions from the evaluation pool (half of them 2-call), drawn from `seed`, in chunks of `CHUNK`
    whose names are distinct."""
    rng = random.Random(seed)
    out: list[NotesQuestion] = []
    while len(out) < n:
        out += questions_for(min(CHUNK, n - len(out)), rng, "eval")
    return out


def _chunks(questions: Sequence[NotesQuestion]) -> list[Sequence[NotesQuestion]]:
    return [questions[i : i + CHUNK] for i in range(0, len(questions), CHUNK)]


def _row(asked: NotesQuestion, prediction: str, calls: int, tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "question": asked.question,
        "gold": asked.answer,
        "calls_needed": asked.calls,
        "prediction": prediction,
        "em": exact_match(prediction, [asked.answer]),
        "f1": f1(prediction, [asked.answer]),
        "calls": calls,
        "tokens": tokens,
        **extra,
    }


async def env_method(
    client: Any, questions: Sequence[NotesQuestion], instruction: str = "", *, withheld: bool = False
) -> list[dict[str, Any]]:
    """The environment asked each question once under `instruction` (none: `direct`), with its notes."""
    from prompt_r1.evaluation.optimizers.search import instruction_request

    world = NotesWorld()
    world.withheld = withheld
    environment = NotesEnvironment(client, world)
    rows: list[dict[str, Any]] = []
    for chunk in _chunks(questions):
        world.put(chunk)

        async def one(asked: NotesQuestion) -> dict[str, Any]:
            reply = await environment.respond(instruction_request(instruction, asked.question))
            tagged = last_answer(reply.text)
            prediction = tagged if tagged is not None else reply.text.strip()
            return _row(asked, prediction, 1, reply.input_tokens + reply.output_tokens, reply=reply.text)

        rows += await asyncio.gather(*(one(q) for q in chunk))
    return rows


async def agent_method(
    agent: Any,
    client: Any,
    questions: Sequence[NotesQuestion],
    loop: Any,
    *,
    withheld: bool = False,
) -> list[dict[str, Any]]:
    """The agent's episodes through the loop, its environment answering from each question's sheet."""
    from prompt_r1.runs.episode import EpisodeRunner
    from prompt_r1.tasks.notes_training import env_calls

    world = NotesWorld()
    world.withheld = withheld
    runner = EpisodeRunner(agent, NotesEnvironment(client, world), loop)
    rows: list[dict[str, Any]] = []
    for chunk in _chunks(questions):
        world.put(chunk)
        episodes = await asyncio.gather(*(runner.run(q.question) for q in chunk))
        for asked, episode in zip(chunk, episodes, strict=True):
            prompts = [t["prompt"] for t in episode.turns if t.get("prompt") is not None]
            rows.append(
                _row(asked, episode.answer or "", env_calls(episode), sum(episode.token_totals),
                     status=episode.status, prompts=prompts)
            )  # fmt: skip
    return rows


async def search_instruction(
    method: str, client: Any, *, budget: int, train_rows: int = 16, seed: int = 0
) -> dict[str, Any]:
    """OPRO's or GEPA's best instruction for the task (`method`: opro or gepa), searched on `train_rows`
    training-pool questions with `budget` metric calls, the environment's model as the optimiser; its record
    (`prompt_r1.evaluation.optimizers.search.find_instruction`)."""
    from prompt_r1.clients.costs import Price, PriceTable
    from prompt_r1.data.datasets import Sample
    from prompt_r1.evaluation.optimizers.opro import OproSettings
    from prompt_r1.evaluation.optimizers.search import SearchSettings, find_instruction

    asked = questions_for(train_rows, random.Random(seed), "train")
    world = NotesWorld()
    world.put(asked)
    samples = [Sample(f"notes-{i}", "notes", i, q.question, [q.answer]) for i, q in enumerate(asked)]
    settings = SearchSettings(budget=budget, train_rows=train_rows, opro=OproSettings(seed=seed))
    prices = PriceTable({client.model_name: Price(0.0, 0.0)})
    return await find_instruction(
        method, "notes", samples, NotesEnvironment(client, world), client, settings, prices
    )


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """EM and F1 (percent) overall and per calls needed, calls per question (overall and per calls needed),
    tokens per question, the share answered at once."""

    def mean(values: list[float]) -> float:
        return 100 * sum(values) / len(values) if values else float("nan")

    out = {"questions": len(rows), "em": mean([r["em"] for r in rows]), "f1": mean([r["f1"] for r in rows])}
    for k in (1, 2):
        part = [r for r in rows if r["calls_needed"] == k]
        out[f"em_{k}"] = mean([r["em"] for r in part])
        out[f"f1_{k}"] = mean([r["f1"] for r in part])
        out[f"calls_{k}"] = sum(r["calls"] for r in part) / len(part) if part else float("nan")
    out["calls"] = sum(r["calls"] for r in rows) / max(len(rows), 1)
    out["tokens"] = sum(r["tokens"] for r in rows) / max(len(rows), 1)
    out["at_once"] = mean([float(r["calls"] == 0) for r in rows])
    return out
