"""The real-agent benchmark's table rows kept under OUT/rows, so that a rerun (a run cut short, or seeds added
later) computes only the rows it lacks. A row is reused only where what decides it is the same: the method, the
agent's model folder (weights, tokenizer, chat template: every file), the environment's, the held-out draw, the
loop's caps, the search budget, and the code that plays and scores an episode (`CODE`). Rows are greedy and so the
same when computed again (the environment greedy, seeded by the draw). Code outside `CODE` (transformers, torch,
the server) is not seen: delete OUT/rows after changing it. A row with a failed episode, and a search with a failed
call, are not kept: the next run computes them again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

# The code that plays and scores a row: the task, its methods and searches, the episode loop, the agent and the
# environment's client and server.
CODE = (
    "prompt_r1.tasks.notes", "prompt_r1.tasks.notes_eval", "prompt_r1.tasks.notes_training",
    "prompt_r1.runs.episode", "prompt_r1.agents.local", "prompt_r1.agents.model_server",
    "prompt_r1.clients.environment", "prompt_r1.evaluation.optimizers.search",
)  # fmt: skip


def model_digest(model: str) -> str:
    """What a model folder holds (a digest of every file in it, by name and content), so that a row kept for a model
    is reused only for that model; a built-in name is resolved to its folder first."""
    from prompt_r1.agents.builtin import resolve_model

    folder = Path(resolve_model(model))
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    if not any(path.suffix == ".safetensors" for path in files):
        raise FileNotFoundError(f"no model weights (*.safetensors) in {folder}")
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(folder)).encode())
        with file.open("rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def code_digest(modules: tuple[str, ...] = CODE) -> str:
    """The code of `modules` (`CODE`): a row kept by other code is not reused."""
    import importlib

    digest = hashlib.sha256()
    for name in modules:
        digest.update(Path(importlib.import_module(name).__file__).read_bytes())
    return digest.hexdigest()[:16]


class KeptRows:
    """Table rows under OUT/rows, one file each, named by a digest of what decides them (`key`)."""

    def __init__(
        self,
        out: Path,
        *,
        eval_seed: int,
        questions: int,
        turn_tokens: int,
        budget: int,
        loop: dict,
        environment: str,
    ) -> None:
        self.folder = out / "rows"
        self.base = {"eval_seed": eval_seed, "questions": questions, "loop": loop, "code": code_digest(),
                     "environment": model_digest(environment)}  # fmt: skip
        self.budget, self.turn_tokens = budget, turn_tokens

    def _file(self, key: dict) -> Path:
        name = hashlib.sha256(json.dumps({**self.base, **key}, sort_keys=True).encode()).hexdigest()[:20]
        return self.folder / f"{name}.json"

    def key(self, method: str, model: str | None = None, withheld: bool = False, at_once: bool = False,
            weights: str | None = None) -> dict:  # fmt: skip
        """What decides a row: an environment's method by its name (OPRO and GEPA by their search budget too), an
        agent's by its weights (`weights`: their digest, already taken), the notes withheld or not, and the
        control that answers at once by the guide that writes its tags too (code outside `CODE`)."""
        if model is None:
            return {"method": method, "budget": self.budget if method in ("opro", "gepa") else None}
        key = {"method": "agent", "weights": weights or model_digest(model), "turn_tokens": self.turn_tokens,
               "withheld": withheld}  # fmt: skip
        return key | {"at_once": True, "guide": code_digest(("prompt_r1.agents.guide",))} if at_once else key

    def get(self, key: dict) -> dict | None:
        file = self._file(key)
        return json.loads(file.read_text()) if file.is_file() else None

    def put(self, key: dict, value: dict) -> bool:
        """Keep VALUE ({"rows": [...], "search": {...}?}) under KEY, unless an episode or a search call in it
        failed; whether it was kept."""
        from prompt_r1.runs.episode import FAILED_STATUSES

        failed = any(row.get("status") in FAILED_STATUSES for row in value["rows"])
        if failed or value.get("search", {}).get("calls", {}).get("failed"):
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        file = self._file(key)
        part = file.with_suffix(".part")
        part.write_text(json.dumps(value) + "\n")
        part.replace(file)  # whole or absent: a run cut short leaves no half-written row
        return True
