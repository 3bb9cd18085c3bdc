"""GEPA (the maintained `gepa` package) as a prompt-optimiser baseline: our adapter runs its candidate instruction
through the run's environment client, and its reflection model is a client of the same endpoint.

GEPA is synchronous; the search runs it in a worker thread while the event loop stays free, and every model call
it makes is sent back to that loop (prompt_r1.core.aio.in_worker_thread), so the calls share the run's rate
limiter, retries, key redaction and token counts with everything else. The component GEPA evolves is named
`instruction`; a row's score is its token F1, and the reflective dataset shows GEPA each question, the reply and
the golden answer.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from prompt_r1.core.aio import in_worker_thread
from prompt_r1.core.errors import BackendUnavailable

__all__ = ["SEED_INSTRUCTION", "gepa_search"]

SEED_INSTRUCTION = "Answer the question."

# (instruction, row) → (score 0-1, the reply's text); row is (question, golden answers).
Answer = Callable[[str, tuple[str, Sequence[str]]], Awaitable[tuple[float, str]]]


def _adapter(answer: Answer, call: Callable[[Any], Any]) -> Any:
    from gepa.core.adapter import EvaluationBatch

    class InstructionAdapter:
        """GEPA's view of the environment answering under an instruction (gepa.core.adapter.GEPAAdapter)."""

        propose_new_texts = None  # GEPA's own proposer writes the new instruction, through `reflection_lm`

        def evaluate(self, batch, candidate, capture_traces=False):
            async def all_rows():
                return await asyncio.gather(*(answer(candidate["instruction"], row) for row in batch))

            results = call(all_rows())
            scores = [score for score, _ in results]
            outputs = [text for _, text in results]
            traces = [{"row": row, "reply": text, "score": score} for row, (score, text) in zip(batch, results, strict=True)]  # fmt: skip
            return EvaluationBatch(
                outputs=outputs, scores=scores, trajectories=traces if capture_traces else None
            )

        def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
            records = [
                {
                    "Inputs": trace["row"][0],
                    "Generated Outputs": trace["reply"],
                    "Feedback": f"Token F1 {trace['score']:.2f}. The correct answer is: "
                    + " | ".join(trace["row"][1]),
                }
                for trace in eval_batch.trajectories or []
            ]
            return {name: records for name in components_to_update}

    return InstructionAdapter()


class _StderrLogger:
    def log(self, message: str) -> None:
        print(message, file=sys.stderr)


async def gepa_search(
    answer: Answer,
    propose: Callable[[str], Awaitable[str]],
    rows: Sequence[tuple[str, Sequence[str]]],
    *,
    budget: int,
    seed: int = 0,
) -> tuple[str, float, int, list[tuple[str, float]]]:
    """(best instruction, its mean score on `rows`, metric calls GEPA spent, every candidate with its score)."""
    try:
        import gepa
    except ImportError as exc:
        raise BackendUnavailable(
            "the gepa method needs the gepa package: pip install 'prompt-r1[eval]'"
        ) from exc

    def run(call: Callable[[Any], Any]) -> Any:
        def reflection_lm(prompt: str) -> str:
            return call(propose(prompt))

        return gepa.optimize(
            seed_candidate={"instruction": SEED_INSTRUCTION},
            trainset=list(rows),
            valset=list(rows),
            adapter=_adapter(answer, call),
            reflection_lm=reflection_lm,
            max_metric_calls=budget,
            seed=seed,
            display_progress_bar=False,
            raise_on_exception=True,
            logger=_StderrLogger(),  # GEPA's own log prints to stdout, where eval prints its tables
        )

    result = await in_worker_thread(run)
    scores = list(result.val_aggregate_scores)
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    history = [(c["instruction"], s) for c, s in zip(result.candidates, scores, strict=True)]
    return result.candidates[best]["instruction"], scores[best], result.total_metric_calls, history
