"""The whole `prompt-r1 train` configuration checked before any model loads: every number finite and in range,
the folders and files it names usable, the environment's and the loop's settings valid.

    check_config(config)   # a ConfigError naming the field, e.g. "learning_rate must be a finite number > 0,
                           # got nan"; called by both configs' __post_init__, so once, whenever one is built

Without it a bad value surfaced minutes later, deep in TRL or torch, as a traceback ("Invalid learning rate:
nan" once the optimiser was built), or never (`max_steps: -5` trained for three epochs).
"""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import Any

from prompt_r1.core.checks import number
from prompt_r1.core.errors import ConfigError

__all__ = ["RANGES", "check_config", "check_number_field", "check_train_data"]

_COUNT = {"integer": True, "minimum": 1}
_FRACTION = {"minimum": 0, "below": 1}
# The range of each number field with one; every other float field of the config must still be finite.
RANGES: dict[str, dict[str, Any]] = {
    "learning_rate": {"above": 0},
    "num_train_epochs": {"above": 0},
    "per_device_train_batch_size": _COUNT,
    "gradient_accumulation_steps": _COUNT,
    "num_generations": {"integer": True, "minimum": 2},  # a group: GRPO's advantage compares its episodes
    "num_iterations": _COUNT,
    "warmup_steps": {"minimum": 0},
    "weight_decay": {"minimum": 0},
    "max_grad_norm": {"minimum": 0},
    "adam_beta1": _FRACTION,
    "adam_beta2": _FRACTION,
    "adam_epsilon": {"above": 0},
    "temperature": {"above": 0},
    "top_p": {"above": 0, "maximum": 1},
    "top_k": {"integer": True, "minimum": 0},
    "min_p": {"minimum": 0, "maximum": 1},
    "repetition_penalty": {"above": 0},
    "beta": {"minimum": 0},
    "epsilon": {"minimum": 0},
    "epsilon_high": {"minimum": 0},
    "lora_r": _COUNT,
    "lora_alpha": {"above": 0},
    "lora_dropout": _FRACTION,
    "max_train_samples": _COUNT,
    "logging_steps": {"above": 0},
    "save_steps": {"above": 0},
    "eval_steps": {"above": 0},
    "seed": {"integer": True, "minimum": 0},
    "vllm_gpu_memory_utilization": {"above": 0, "maximum": 1},
    # Policy versions a sample may lag: past a few hundred, nothing is ever dropped (a typo for "no limit").
    "max_staleness": {"integer": True, "minimum": 0, "maximum": 1000},
}


def check_number_field(name: str, value: Any) -> None:
    """One number field of the config, by its range in RANGES (or, without one, finite): for a recipe's value
    before TRL's and transformers' own checks see it (theirs fail on inf with an OverflowError traceback)."""
    _check_number(name, value, RANGES.get(name))


def _check_number(name: str, value: Any, bounds: dict[str, Any] | None) -> None:
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            pass
        else:  # YAML 1.1 reads 1e-4 (no dot) as text, a trap in recipes
            raise ConfigError(
                f"{name} must be a number, got the text {value!r} (YAML reads an exponent without a dot as text: "
                f"write {value.replace('e', '.0e', 1) if '.' not in value else value} unquoted)"
            )
    if bounds is not None:
        number(value, name, none_ok=True, **bounds)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value}")


def _check_output_dir(output_dir: str) -> None:
    path = Path(output_dir).expanduser()
    for folder in (path, *path.parents):
        if folder.exists() and not folder.is_dir():
            where = "it is" if folder == path else f"{folder} is"
            raise ConfigError(
                f"output_dir {output_dir}: {where} a file; output_dir must be a folder (it receives the "
                "checkpoints and the trained model): name another"
            )


def check_config(config: Any) -> None:
    """Refuse, with one line naming the field, a training config that cannot train (see the module docstring):
    every config calls it once, when it is built. Reads only the config and the file system: nothing is loaded
    or contacted; the training file is `check_train_data`'s."""
    for f in fields(config):
        if f.init:
            _check_number(f.name, getattr(config, f.name), RANGES.get(f.name))
    # -1 (the default) lets num_train_epochs decide; 0 or a negative count would too, silently.
    if config.max_steps != -1:
        number(config.max_steps, "max_steps (-1: num_train_epochs decides)", integer=True, minimum=1)
    if config.max_turn_tokens > config.max_total_tokens:
        raise ConfigError(
            f"need max_turn_tokens <= max_total_tokens, got {config.max_turn_tokens} and {config.max_total_tokens}"
        )
    _check_output_dir(config.output_dir)
    config.environment_config()  # the env_* fields, by EnvironmentConfig's own checks
    config.loop_config()  # the loop's, by LoopConfig's


def check_train_data(config: Any) -> None:
    """The config's training rows: a bundled set's name or a file that exists (before any model loads)."""
    from prompt_r1.data.datasets import resolve_source

    source, _ = resolve_source(config.resolved_train_data())  # an unknown set's name, or a folder, named
    if not source.exists():
        raise ConfigError(f"train_data {config.train_data}: no such file")
