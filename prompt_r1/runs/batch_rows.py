"""What one batch row is: an input sample's episode as the results file keeps it. One place, so that a row is the
same whether its episode ran in this process (prompt_r1.runs.batch) or in a Ray actor (prompt_r1.runs.ray_batch).
"""

from __future__ import annotations

import time
from typing import Any

from prompt_r1.data.datasets import Sample
from prompt_r1.runs.episode import Episode, EpisodeRunner, describe_exception
from prompt_r1.runs.metering import episode_cost

__all__ = ["episode_row", "episode_work", "failure_row", "row_of"]


def row_of(sample: Sample, episode: Episode) -> dict[str, Any]:
    row = {"id": sample.id, "dataset": sample.dataset, "index": sample.index, **episode.to_row()}
    row["finished_at"] = round(time.time(), 3)  # Unix time, for throughput over any part of a run
    return row


def failure_row(sample: Sample, exc: BaseException) -> dict[str, Any]:
    """The row of a sample whose work raised: `internal_error`, retried by the next run."""
    failed = Episode.failure(
        "internal_error", describe_exception(exc), id=sample.id, question=sample.question
    )
    return row_of(sample, failed)


async def episode_row(runner: EpisodeRunner, sample: Sample) -> tuple[dict[str, Any], bool]:
    """Run the sample's episode: its row (scored where the sample has golden answers) and whether it resumed
    from a checkpoint."""
    episode = await runner.run(
        sample.question,
        id=sample.id,
        golden_answers=sample.golden_answers,
        metadata={"dataset": sample.dataset},
    )
    row = row_of(sample, episode)
    if sample.golden_answers and episode.answer is not None:
        from prompt_r1.scoring.scorers import row_metrics

        row["metrics"] = row_metrics(episode.answer, sample.golden_answers)
    return row, bool(episode.resumed)


def episode_work(agent: Any, environment: Any, loop: Any, prices: Any, *, agent_model: str, tags=("batch",)):
    """Batch's row maker on these players (a Ray actor builds it once, on its own agent and environment): a
    sample's row, as a local run writes it."""
    runner = EpisodeRunner(
        agent,
        environment,
        loop,
        price=lambda state: episode_cost(state, prices, agent_model),
        tags=list(tags),
    )

    async def work(sample: Sample) -> dict[str, Any]:
        return (await episode_row(runner, sample))[0]

    return work
