"""The rows both trainers train on, from a dataset name or file: the agent's first message as the prompt and the
golden answers as the column the reward reads."""

from __future__ import annotations

from typing import Any

from prompt_r1.core.errors import ConfigError, DataError
from prompt_r1.core.prompts import question_message

__all__ = ["check_rows_per_step", "load_training_rows"]


def load_training_rows(source: str, *, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows for the trainer: the agent's first message as the prompt, the golden answers as a reward column."""
    from prompt_r1.data.datasets import load_samples

    samples = load_samples(source, limit=limit)
    if not samples:
        raise DataError(f"{source} has no training rows")
    return [
        {
            "prompt": [{"role": "user", "content": question_message(s.question)}],
            "golden_answers": list(s.golden_answers),
            "id": s.id,
            "data_source": s.dataset,
        }
        for s in samples
    ]


def check_rows_per_step(config: Any, rows: int) -> None:
    """Refuse, before a model loads, training rows fewer than one step of the synchronous trainer takes: its
    sampler deals each step `generation_batch_size / num_generations` distinct prompts across the processes and
    drops a short batch, so with fewer rows it would have no step to run. (The async worker cycles its rows.)"""
    needed = config.generation_batch_size // config.num_generations
    if rows < needed:
        processes = config.world_size
        raise ConfigError(
            f"the training data has {rows} row{'' if rows == 1 else 's'}, but one step takes {needed} "
            f"(per_device_train_batch_size {config.per_device_train_batch_size} x {processes} "
            f"process{'' if processes == 1 else 'es'} x {config.steps_per_generation} / num_generations "
            f"{config.num_generations}): add rows, or lower per_device_train_batch_size or the processes"
        )
