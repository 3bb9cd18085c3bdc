"""Which settings each GRPO trainer supports: one configuration (`PromptR1GRPOConfig`) serves the synchronous
trainer and the asynchronous one (`async_grpo`), and a setting the chosen one does not have is refused in one line.

    check_trainer_keys(config)   # ConfigError: "the async trainer does not support beta: 0.001 (... set beta: 0)"

Checked by `prompt-r1 train` before any model loads, and by both trainers' builders.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from prompt_r1.core.errors import ConfigError

__all__ = [
    "ASYNC_OFF",
    "ASYNC_SAMPLING",
    "ASYNC_UNSUPPORTED",
    "ASYNC_UNSUPPORTED_OWN",
    "DEFAULT_MAX_STALENESS",
    "check_trainer_keys",
]

DEFAULT_MAX_STALENESS = 4  # TRL's default

# GRPOTrainer settings the async trainer does not have, each with what to do instead (refused when not the default).
ASYNC_UNSUPPORTED: dict[str, str] = {
    "beta": "the async trainer has no reference model and no KL term: set beta: 0",
    "loss_type": "the async trainer's loss is dapo's (token-level, normalised over the step): drop loss_type",
    "num_iterations": "the async trainer takes one gradient step per batch: set num_iterations: 1",
    "scale_rewards": "the async trainer scales advantages by the group's std: drop scale_rewards",
    "use_vllm": "the async trainer always samples from a vLLM server (vllm_server_base_url): drop use_vllm",
    "vllm_mode": "the async trainer always samples from a vLLM server: drop vllm_mode",
    "mask_truncated_completions": "the async trainer trains on truncated episodes: drop mask_truncated_completions",
    "importance_sampling_level": "the async trainer's importance ratio is per token: drop importance_sampling_level",
    "vllm_importance_sampling_correction": "the async trainer always corrects with its clipped ratio",
    "top_entropy_quantile": "the async trainer has no entropy masking: drop top_entropy_quantile",
}
# Prompt-R1 settings the async trainer does not have.
ASYNC_UNSUPPORTED_OWN: dict[str, str] = {
    "vllm_sync_check": "the async trainer's sync is checked by its importance ratio (logged as `ratio`): drop it",
    # The spend cap counts by step, and the async worker's episodes run across policy versions, outside any step.
    "max_env_cost": "the async trainer has no spend cap yet: use the synchronous trainer, or the provider's limit",
    "max_env_calls": "the async trainer has no spend cap yet: use the synchronous trainer, or the provider's limit",
}
# Prompt-R1 settings on by default for the synchronous trainer, off under async, and refused there when set.
ASYNC_OFF: dict[str, str] = {
    "reproducible_rollouts": "the async worker's episodes finish in whatever order the servers answer, across "
    "policy versions: drop it",
    "call_ledger": "the ledger keys each call by its step and episode, and the async worker's episodes belong to "
    "no step: drop it",
}
# Sampling settings the served agent does not send (it samples with temperature and top_p).
ASYNC_SAMPLING = ("top_k", "min_p", "repetition_penalty")


def _default(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return dataclasses.MISSING


def check_trainer_keys(config: Any) -> None:
    """Refuse, in one line, a setting the chosen trainer (`async_grpo` or not) does not support."""
    from trl import GRPOConfig

    from prompt_r1.training.shared.config import PromptR1GRPOConfig

    if not config.async_grpo:
        if config.max_staleness is not None:
            raise ConfigError(
                "max_staleness is a setting of the async trainer: add async: true (--async), or drop it"
            )
        return
    refused = []
    for name, why in ASYNC_UNSUPPORTED.items():
        if getattr(config, name) != _default(GRPOConfig, name):
            refused.append(f"{name}: {getattr(config, name)!r} ({why})")
    for name, why in ASYNC_UNSUPPORTED_OWN.items():
        if getattr(config, name) != _default(PromptR1GRPOConfig, name):
            refused.append(f"{name}: {getattr(config, name)!r} ({why})")
    for name in ASYNC_SAMPLING:
        if getattr(config, name) != _default(GRPOConfig, name):
            refused.append(
                f"{name}: {getattr(config, name)!r} (the served agent samples with temperature and top_p)"
            )
    # On by default for the synchronous trainer only; asked for by name, they are refused here.
    for name, why in ASYNC_OFF.items():
        if name in getattr(config, "explicit_true", ()):
            refused.append(f"{name}: True ({why})")
    if config.deepspeed:
        refused.append("deepspeed (the async trainer runs on FSDP2 or one device, not DeepSpeed)")
    if config.max_staleness is not None and config.max_staleness < 0:
        refused.append(f"max_staleness: {config.max_staleness} (must be >= 0)")
    if refused:
        raise ConfigError("the async trainer does not support " + "; ".join(refused))
