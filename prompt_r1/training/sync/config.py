"""`PromptR1GRPOConfig`: the synchronous trainer's config, TRL's `GRPOConfig` with the Prompt-R1 fields both
trainers share (`prompt_r1.training.shared.config.PromptR1Fields`) and this trainer's own: the vLLM sync check,
reproducible rollouts, the call ledger and the spend cap.

    config = PromptR1GRPOConfig(output_dir="runs/x", model_name_or_path="path/to/agent", env_model="gpt-4o-mini")

Checked once, when built: a number out of range, or a key of the async trainer (`max_staleness`, ...), is one
`ConfigError` line naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from trl import GRPOConfig

from prompt_r1.core.config import COMPILE_DECODE
from prompt_r1.core.errors import ConfigError
from prompt_r1.training.shared.config import (
    PromptR1Fields,
    check_spend_caps,
    field_help,
    refuse_unknown_keys,
)

__all__ = ["PromptR1GRPOConfig"]


@dataclass
class PromptR1GRPOConfig(GRPOConfig, PromptR1Fields):
    """GRPO for the Prompt-R1 agent with TRL's `GRPOTrainer`: TRL's fields, the shared Prompt-R1 ones, then this
    trainer's own."""

    # The policy's decoding in the rollout without vLLM (prompt_r1.agents.compiled_decoding).
    agent_compile_decode: str = field_help(
        "The policy's decoding in the rollout (transformers generate, not vLLM): compiled with a static key/value "
        "cache and CUDA graphs (on), eager (off), or auto: compiled on CUDA unless ZeRO-3 partitions the weights, "
        "while its kept caches fit an eighth of the GPU's memory (an episode's first cache is made about "
        "max_total_tokens past its prompt where that room is there, so that later turns reuse it).",
        default="auto",
    )
    # vLLM rollouts (use_vllm, vllm_mode: TRL's own fields).
    vllm_sync_check: bool = field_help(
        "After every weight sync to vLLM (a colocated engine, or the server in server mode), compare the "
        "engine's log-probabilities of a fixed continuation with the trained model's; the largest gap is logged "
        "as vllm/sync_logprob_gap and appended to OUTPUT_DIR/vllm_sync.jsonl (one forward pass per sync).",
        default=False,
    )
    reproducible_rollouts: bool = field_help(
        "Seed each step's sampling from seed, step and process, and batch the episodes' turns in lockstep in "
        "episode order, so that the same seed gives the same trajectories whatever order the environment's replies "
        "arrive in (each turn waits for the step's slowest reply). Exact on CPU; see the training docs for GPU "
        "and vLLM.",
        default=True,
    )
    # Spending on the environment (prompt_r1/training/shared/ledger.py and spend.py; docs: the training ledger).
    call_ledger: bool = field_help(
        "Record every environment call in OUTPUT_DIR/call_ledger/ (SQLite, one file per process), and answer the "
        "calls a resumed run repeats from it instead of paying for them again.",
        default=True,
    )
    max_env_cost: float | None = field_help(
        "Stop, with a checkpoint, before the step that would take the environment's cost (dollars, all "
        "processes, all restarts) past this; the next step is estimated from the mean of the last ones.",
        default=None,
    )
    max_env_calls: int | None = field_help(
        "Stop, with a checkpoint, before the step that would take the environment calls past this.",
        default=None,
    )

    # Which trainer a config is for (`prompt_r1.training.run.train` picks the builder by it).
    async_grpo = False

    def __post_init__(self) -> None:
        if self.fsdp or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
            raise ConfigError(
                "the synchronous trainer does not run on FSDP: launch it with training/accelerate/"
                "deepspeed_zero2.yaml (or deepspeed_zero3.yaml), or train with --async, whose trainer shards with "
                "FSDP2 (training/accelerate/fsdp2.yaml)"
            )
        if self.agent_compile_decode not in COMPILE_DECODE:
            raise ConfigError(
                f"agent_compile_decode must be auto, on or off, got {self.agent_compile_decode!r}"
            )
        self.check_prompt_r1()
        check_spend_caps(self)
        super().__post_init__()


def _why_not(key: str) -> str:
    """What to do with a key the synchronous trainer does not have."""
    if key in ("async_grpo", "async"):
        return "build PromptR1AsyncGRPOConfig for the async trainer, or trainer_config(async_grpo=True, ...)"
    if key in _async_keys():
        return "a setting of the async trainer: add async: true (--async), or drop it"
    return "no such setting; prompt-r1 train --help lists them"


def _async_keys() -> set[str]:
    """The keys of TRL's async trainer, for the hint above (read only when a key is refused)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.async_grpo import AsyncGRPOConfig

    return {f.name for f in fields(AsyncGRPOConfig)}


refuse_unknown_keys(PromptR1GRPOConfig, "synchronous trainer", _why_not)
