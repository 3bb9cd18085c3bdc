"""LoRA for both trainers: the adapter a config asks for (`use_peft`), and a trained adapter merged into its base
model (`prompt-r1 merge`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prompt_r1.core.errors import ConfigError

__all__ = ["merge_adapter", "peft_config"]


def peft_config(config: Any):
    """The `peft.LoraConfig` of `config`'s lora_* fields, or None without `use_peft`."""
    if not config.use_peft:
        return None
    from peft import LoraConfig

    targets = config.lora_target_modules
    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        task_type="CAUSAL_LM",
    )


def merge_adapter(
    adapter: str | Path, out: str | Path, *, base: str | None = None, dtype: str = "auto"
) -> Path:
    """Merge a LoRA adapter into its base model and save a plain model folder (what `vllm serve` and the agent
    backends load), with the tokenizer."""
    import torch
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise ConfigError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
    base = base or PeftConfig.from_pretrained(adapter).base_model_name_or_path
    if not base:
        raise ConfigError(f"{adapter} does not name its base model; pass --base")
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    out = Path(out)
    merged.save_pretrained(out)
    tokenizer_source = adapter if (adapter / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(out)
    return out
