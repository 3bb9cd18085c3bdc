"""Trained agents the package ships: LoRA adapters on a built-in model, merged once into a model folder of their own.

    resolve_model("smollm2-135m-notes")   # '~/.cache/prompt-r1/models/smollm2-135m-notes-<digest>' (made once)

An agent is its base (a built-in model, `agents/builtin.py`) and a few MB of adapters in the package
(`prompt_r1/agents/shipped/NAME/`), applied in order: the notes agent's cold start, then what GRPO learned on top
of it (docs: the notes agent). Every loader wants an ordinary folder, so the adapters are merged into the base's
weights once, into the cache beside the base, under a name that carries a digest of the adapters' files (a new
release of the adapters is merged anew, never mixed with an old folder).
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from prompt_r1.core.config import TRAINED_TURN_TOKENS

__all__ = ["TRAINED_AGENTS", "TrainedAgent", "adapter_folders", "folder_name", "merge_into", "missing"]

SHIPPED = Path(__file__).resolve().parent / "shipped"


@dataclass(frozen=True)
class TrainedAgent:
    """`adapters`: folders under shipped/NAME, merged into `base` in this order; `turn_tokens`: the cap on an agent
    turn it was trained and measured with (its benchmark's `--turn-tokens`)."""

    name: str
    base: str
    adapters: tuple[str, ...]
    description: str
    turn_tokens: int


TRAINED_AGENTS: dict[str, TrainedAgent] = {
    "smollm2-135m-notes": TrainedAgent(
        name="smollm2-135m-notes",
        base="smollm2-135m",
        adapters=("cold", "grpo"),
        description="the built-in model trained with GRPO to prompt an environment that holds notes "
        "(docs/notes-agent.md)",
        turn_tokens=TRAINED_TURN_TOKENS["smollm2-135m-notes"],
    ),
}

assert set(TRAINED_AGENTS) == set(TRAINED_TURN_TOKENS), "core.config knows each trained agent's turn cap"


def adapter_folders(agent: TrainedAgent) -> list[Path]:
    return [SHIPPED / agent.name / part for part in agent.adapters]


def missing(agent: TrainedAgent) -> str | None:
    """What keeps `agent` from being made here (an adapter file absent, peft not installed), or None."""
    for folder in adapter_folders(agent):
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            if not (folder / file).is_file():
                return f"the package's adapter file {folder / file} is missing (reinstall prompt-r1)"
    if importlib.util.find_spec("peft") is None:
        return "merging its adapters needs the peft package: pip install peft"
    return None


def folder_name(agent: TrainedAgent) -> str:
    """The cache folder's name: the agent's, and a digest of its adapters' files."""
    digest = hashlib.sha256()
    for folder in adapter_folders(agent):
        for file in sorted(folder.iterdir()):
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return f"{agent.name}-{digest.hexdigest()[:12]}"


def merge_into(agent: TrainedAgent, base_folder: Path, out: Path) -> None:
    """Merge the adapters, in order, into the base's float32 weights, and save an ordinary folder to `out` (the
    base's tokenizer, chat template and generation config)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    for folder in adapter_folders(agent):
        # The adapters are saved in float16 (a few MB); merged into float32 weights as float32.
        model = PeftModel.from_pretrained(model, folder, torch_dtype=torch.float32).merge_and_unload()
    model.generation_config = GenerationConfig.from_pretrained(base_folder)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_folder).save_pretrained(out)
