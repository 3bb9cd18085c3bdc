"""The real-agent benchmark's table rows kept under OUT/rows, so that a rerun (a run cut short, or seeds added
later) computes only the rows it lacks. A row is reused only where everything that decides it is the same: the
method, the model's weights, the held-out draw, the loop's caps, the search budget and the notes task's code. Rows
are greedy and so the same when computed again (the environment greedy, seeded by the draw). A change elsewhere
(the loop's or the agent's code) is not seen: delete OUT/rows after one."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def weights_digest(model: str) -> str:
    """What a model folder's weights are (a digest of its safetensors files), so that a row kept for a model is
    reused only for those weights; a built-in name is resolved to its folder first."""
    from prompt_r1.agents.builtin import resolve_model

    digest = hashlib.sha256()
    for file in sorted(Path(resolve_model(model)).glob("*.safetensors")):
        with file.open("rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def task_code_digest() -> str:
    """The notes task's code (its sheets, questions, environment, scoring and methods): a row kept by other code is
    not reused."""
    from prompt_r1.tasks import notes, notes_eval

    digest = hashlib.sha256()
    for module in (notes, notes_eval):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


class KeptRows:
    """Table rows under OUT/rows, one file each, named by a digest of what decides them (`key`)."""

    def __init__(
        self, out: Path, *, eval_seed: int, questions: int, turn_tokens: int, budget: int, loop: dict
    ) -> None:
        self.folder = out / "rows"
        self.base = {"eval_seed": eval_seed, "questions": questions, "loop": loop, "code": task_code_digest()}
        self.budget, self.turn_tokens = budget, turn_tokens

    def _file(self, key: dict) -> Path:
        name = hashlib.sha256(json.dumps({**self.base, **key}, sort_keys=True).encode()).hexdigest()[:20]
        return self.folder / f"{name}.json"

    def key(self, method: str, model: str | None = None, withheld: bool = False) -> dict:
        if model is None:  # the environment's methods; OPRO and GEPA also by their search budget
            return {"method": method, "budget": self.budget if method in ("opro", "gepa") else None}
        return {"method": "agent", "weights": weights_digest(model), "turn_tokens": self.turn_tokens,
                "withheld": withheld}  # fmt: skip

    def get(self, key: dict) -> dict | None:
        file = self._file(key)
        return json.loads(file.read_text()) if file.is_file() else None

    def put(self, key: dict, value: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        file = self._file(key)
        part = file.with_suffix(".part")
        part.write_text(json.dumps(value) + "\n")
        part.replace(file)  # whole or absent: a run cut short leaves no half-written row
