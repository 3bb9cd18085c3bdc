"""A training run's manifest (`OUTPUT_DIR/manifest.json`, prompt_r1.runs.manifest), and `--resume`'s check of it.

    train_manifest(config, resume=True, allow_changed=False)   # refuses, naming each setting that differs
    train_manifest(config, resume=False, task={"name": "door-codes", ...})   # prompt-r1 train --task

`measured`: the settings that decide what is learned (the model, data, reward, loop, environment model and
sampling, optimiser and GRPO settings, seeds). The rest (output folders, logging, saving, endpoints, limits, the
step count and the spend caps, which a resumed run raises on purpose) is recorded as operational and may change.
Only the first process writes the file; every process checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.runs.manifest import (
    build_manifest,
    check_manifest,
    manifest_path,
    read_manifest,
    write_manifest,
)

__all__ = ["MEASURED", "train_manifest"]

ALLOW_FLAG = "--allow_changed_settings"

MEASURED = (
    # the agent, its data and its adapter
    "model_name_or_path", "agent_dtype", "train_data", "max_train_samples", "use_peft", "lora_r", "lora_alpha",
    "lora_dropout", "lora_target_modules",
    # the loop, the reward and the environment that answers
    "protocol", "max_turns", "max_turn_tokens", "max_total_tokens", "train_on_environment_tokens", "reward_preset",
    "reward_alpha", "reward_beta", "reward_gamma", "reward_delta", "reward_epsilon", "reward_format_gate",
    "reward_weights", "env_model", "env_temperature", "env_max_tokens",
    # GRPO and the optimiser
    "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "weight_decay", "optim",
    "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "per_device_train_batch_size",
    "gradient_accumulation_steps", "num_generations", "generation_batch_size", "steps_per_generation",
    "num_iterations", "beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards", "importance_sampling_level",
    "mask_truncated_completions", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "max_completion_length", "bf16", "fp16", "seed", "data_seed",
)  # fmt: skip


def train_manifest(
    config: Any, *, resume: bool, allow_changed: bool = False, task: Mapping[str, Any] | None = None
) -> None:
    """Check, when resuming, that `config` measures what the output's manifest says (`ManifestError` naming each
    setting that differs, unless `allow_changed`); then (first process only) write this run's manifest. `task`: a
    built-in task's own settings (`prompt-r1 train --task`), whose rows and environment stand in for train_data."""
    values = config.to_dict()
    measured = {name: values[name] for name in MEASURED if name in values}
    if task is not None:  # the task makes its rows: the config's train_data was never read
        measured.pop("train_data", None)
        measured.pop("max_train_samples", None)
        measured["task"] = dict(task)
    path = manifest_path(folder=config.output_dir)
    if resume:
        earlier, changes = check_manifest(
            path, measured, allow_changed=allow_changed, flag=ALLOW_FLAG, what="output_dir"
        )
    else:  # a new run into a folder made before: its settings replace the old, its runs stay in the history
        earlier, changes = read_manifest(path), []
    if getattr(config, "process_index", 0) != 0:
        return
    operational = {name: value for name, value in values.items() if name not in measured}
    seeds = {"seed": values.get("seed"), "data_seed": values.get("data_seed")}
    prices = PriceTable.load(getattr(config, "prices", None))
    if task is not None:
        operational = {k: v for k, v in operational.items() if k not in ("train_data", "max_train_samples")}
    manifest = build_manifest("train", measured, operational, seeds=seeds, prices=prices)
    write_manifest(path, manifest, earlier, changes)
