"""`PromptR1AsyncGRPOConfig`: the asynchronous trainer's config, TRL's `AsyncGRPOConfig` with the Prompt-R1 fields
both trainers share (`prompt_r1.training.shared.config.PromptR1Fields`).

    config = PromptR1AsyncGRPOConfig(output_dir="runs/x", model_name_or_path="path/to/agent", max_staleness=2,
                                     vllm_server_base_url="http://127.0.0.1:8000", env_model="gpt-4o-mini")

It has only the keys this trainer honours. A key of the synchronous trainer it does not have (`loss_type`,
`num_iterations`, `use_vllm`, reproducible rollouts, ...) is refused when the config is built, in one line naming it and what to do instead;
so is a key TRL's async config has but the Prompt-R1 rollout worker does not use (`top_k`, ...), when set.
`agent_dtype` is the model's dtype (TRL's `dtype` follows it), and `max_total_tokens` the trajectory's length.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from prompt_r1.core.errors import ConfigError
from prompt_r1.training.shared.config import (
    PromptR1Fields,
    check_spend_caps,
    field_help,
    refuse_unknown_keys,
)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # the documented way in; no banner
from trl.experimental.async_grpo import AsyncGRPOConfig  # noqa: E402

__all__ = ["ASYNC_UNSUPPORTED", "UNUSED_BY_THE_WORKER", "PromptR1AsyncGRPOConfig"]

# Keys of the synchronous trainer this one does not have, each with what to do instead.
ASYNC_UNSUPPORTED: dict[str, str] = {
    "loss_type": "its loss is dapo's (token-level, normalised over the step): drop loss_type",
    "num_iterations": "it takes one gradient step per batch: drop num_iterations",
    "scale_rewards": "it scales advantages by the group's std: drop scale_rewards",
    "use_vllm": "it always samples from a vLLM server (vllm_server_base_url): drop use_vllm",
    "vllm_mode": "it always samples from a vLLM server: drop vllm_mode",
    "mask_truncated_completions": "it trains on truncated episodes: drop mask_truncated_completions",
    "importance_sampling_level": "its importance ratio is per token: drop importance_sampling_level",
    "vllm_importance_sampling_correction": "it always corrects with its clipped ratio: drop it",
    "top_entropy_quantile": "it has no entropy masking: drop top_entropy_quantile",
    "vllm_sync_check": "its sync is checked by its importance ratio (logged as `ratio`): drop it",
    "reproducible_rollouts": "the worker's episodes finish in whatever order the servers answer, across policy "
    "versions: drop it",
}
# Keys of TRL's async config that the Prompt-R1 rollout worker does not read (TRL's own worker does): refused
# when set, with why.
UNUSED_BY_THE_WORKER: dict[str, str] = {
    "top_k": "the served agent samples with temperature and top_p",
    "min_p": "the served agent samples with temperature and top_p",
    "repetition_penalty": "the served agent samples with temperature and top_p",
    "chat_template_kwargs": "the loop renders its own chat template (its protocol's)",
    "max_tool_calling_iterations": "the loop's turns are max_turns",
    "fork_threshold_tokens": "the loop's trajectories are token-exact: nothing is re-tokenised or forked",
    "dtype": "the model's dtype is agent_dtype here",
}


def _default(name: str) -> Any:
    f = next(f for f in fields(AsyncGRPOConfig) if f.name == name)
    return f.default


@dataclass
class PromptR1AsyncGRPOConfig(AsyncGRPOConfig, PromptR1Fields):
    """Asynchronous GRPO for the Prompt-R1 agent with TRL's `AsyncGRPOTrainer`: TRL's fields, then the shared
    Prompt-R1 ones."""

    token_budget: int | None = field_help(
        "Most tokens in one row of a micro-batch; 0 (the default here): a fixed number of episodes per step "
        "(per_device_train_batch_size x processes x accumulation), as the synchronous trainer takes, rather than "
        "TRL's default of as many as fit the vLLM server's context.",
        default=0,
    )

    beta: float = field_help(
        "KL coefficient: beta times the per-token KL (TRL's k3 estimator) from the trained policy to the starting "
        "one, as the synchronous trainer's beta. 0: no reference model and no term.",
        default=0.0,
    )

    # Spending on the environment (prompt_r1/training/asynchronous/spend.py; docs: asynchronous GRPO).
    call_ledger: bool = field_help(
        "Record every environment call the rollout worker pays for in OUTPUT_DIR/call_ledger/ (SQLite, one file "
        "per process), keyed by group, episode and turn: the spend total survives a crash exactly, and a resumed "
        "run says what the groups it plays again had cost. Its sampling is not reproducible, so a replayed "
        "group's calls are mostly paid again.",
        default=True,
    )
    max_env_cost: float | None = field_help(
        "Stop, with a checkpoint, before the environment's cost (dollars, every call the rollout worker paid for, "
        "trained or dropped as stale, all processes, all restarts) passes this; the worker starts no group that "
        "could pass it at the dearest call seen so far.",
        default=None,
    )
    max_env_calls: int | None = field_help(
        "Stop, with a checkpoint, before the environment calls pass this: the worker starts no group whose "
        "episodes could take the calls past it (num_generations x max_turns calls each).",
        default=None,
    )

    # Which trainer a config is for (`prompt_r1.training.run.train` picks the builder by it).
    async_grpo = True

    def __post_init__(self) -> None:
        refused = [
            f"{name}: {getattr(self, name)!r} ({why})"
            for name, why in UNUSED_BY_THE_WORKER.items()
            if getattr(self, name) != _default(name)
            and not (name == "dtype" and self.dtype == self.agent_dtype)
        ]
        if self.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
            refused.append(
                "deepspeed (it runs on FSDP2 or one device, not DeepSpeed: accelerate launch --config_file "
                "training/accelerate/fsdp2.yaml)"
            )
        if refused:
            raise ConfigError("the async trainer does not support " + "; ".join(refused))
        if self.max_inflight_tasks == 0 or self.max_inflight_tasks < -1:  # 0 would never start a rollout
            raise ConfigError(
                f"max_inflight_tasks must be a positive number of rollouts, or -1 to size it from max_staleness; "
                f"got {self.max_inflight_tasks}"
            )
        self.check_prompt_r1()
        check_spend_caps(self)
        self.dtype = self.agent_dtype
        if isinstance(self.model_init_kwargs, dict):  # the dtype is agent_dtype's
            self.model_init_kwargs = {k: v for k, v in self.model_init_kwargs.items() if k != "dtype"} or None
        super().__post_init__()


def _why_not(key: str) -> str:
    """What to do with a key the asynchronous trainer does not have."""
    if key in ASYNC_UNSUPPORTED:
        return ASYNC_UNSUPPORTED[key]
    if key in ("async_grpo", "async"):
        return "this config is the async trainer's; PromptR1GRPOConfig is the synchronous one's"
    return "no such setting; prompt-r1 train --async --help lists them"


refuse_unknown_keys(PromptR1AsyncGRPOConfig, "async trainer", _why_not)
