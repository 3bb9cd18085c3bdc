"""The rows both trainers train on, from a dataset name or file: the agent's first message as the prompt and the
golden answers as the column the reward reads."""

from __future__ import annotations

from typing import Any

from prompt_r1.core.errors import DataError
from prompt_r1.core.prompts import question_message

__all__ = ["load_training_rows"]


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
