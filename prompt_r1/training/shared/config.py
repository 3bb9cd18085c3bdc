"""The fields both trainers' configs share: the agent model, data, loop, environment, price and reward.

Each trainer has its own config, TRL's way: `PromptR1GRPOConfig` (prompt_r1.training.sync.config) extends TRL's
`GRPOConfig`, `PromptR1AsyncGRPOConfig` (prompt_r1.training.asynchronous.config) TRL's `AsyncGRPOConfig`, and both
add `PromptR1Fields`. Every field is a command-line flag of `prompt-r1 train` (`--env_model` or `--env-model`) and
a key of a recipe YAML (`training/configs/*.yaml`); flags override the recipe. A config is checked once, when it
is built (from a recipe, flags or Python alike): a value out of range, or a key its trainer does not have, is one
line naming it (`refuse_unknown_keys`).
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any

from prompt_r1.core.config import (
    DEFAULT_AGENT_MODEL,
    PAPER_TURN_TOKENS,
    PROTOCOLS,
    EnvironmentConfig,
    LoopConfig,
)
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.urls import is_shared_store
from prompt_r1.loop.protocols import protocol_for
from prompt_r1.scoring.rewards import PRESET_ALIASES, PRESETS

__all__ = [
    "DEFAULT_TRAIN_DATA",
    "PROJECT_ROOT",
    "ROLLOUT_LOOP",
    "PromptR1Fields",
    "field_help",
    "refuse_unknown_keys",
]

# The paper release's 2,048-row training sample, shipped with the project.
DEFAULT_TRAIN_DATA = "training/data/mixed_2048.parquet"
# The project folder this package runs from (prompt_r1/training/shared/config.py, three folders up): where a
# project-relative path such as DEFAULT_TRAIN_DATA, as the shipped recipes write it, is found from any folder.
PROJECT_ROOT = Path(__file__).resolve().parents[3]


# The loop settings training fixes rather than takes as fields (see `PromptR1Fields.loop_config`).
ROLLOUT_LOOP = {"force_final_answer": False}


def field_help(text: str, aliases: list[str] | None = None, switch: bool = False, **kw):
    """A field with its help text. `switch`: an unset-by-default bool that still takes `--name` alone for true, as
    the parser's plain bools do (its `--no_name` is added by `prompt-r1 train`)."""
    metadata = {"help": text, **({"aliases": aliases} if aliases else {})}
    if switch:
        metadata.update(nargs="?", const=True)
    return field(metadata=metadata, **kw)


# Fields whose value is the run's total: shared out evenly across processes by `environment_config` with the
# memory store, shared by every rank through the store otherwise.
_SHARE = " For the whole run: each process gets its share, or with a shared rate_store all ranks share it."
_PER_RUN = {"rate_limit": _SHARE, "tokens_per_minute": _SHARE, "token_limit": _SHARE}
_HELP_TAILS = {
    **_PER_RUN,
    "max_in_flight": " Per process (with a shared rate_store, the store holds the sum).",
}  # added to the environment fields' help


def _environment_fields() -> type:
    """`env_<name>` for every field of `EnvironmentConfig`, with its type, default and help: the same settings as
    `prompt-r1 run`'s --env-* flags, derived so that a new environment setting reaches training by itself."""
    hints = typing.get_type_hints(EnvironmentConfig)
    specs = [
        (
            f"env_{f.name}",
            hints[f.name],
            field(
                default=f.default,
                metadata={"help": f.metadata.get("help", "") + _HELP_TAILS.get(f.name, "")},
            ),
        )
        for f in fields(EnvironmentConfig)
    ]
    cls = make_dataclass("EnvironmentFields", specs)
    cls.__module__ = __name__
    return cls


EnvironmentFields = _environment_fields()


@dataclass
class PromptR1Fields(EnvironmentFields):
    """The Prompt-R1 fields of both trainers' configs: the environment's (`env_*`, derived from EnvironmentConfig),
    then the agent, data, loop, price and reward. Each config calls `check_prompt_r1()` first in its
    `__post_init__`, before TRL's own checks see a value."""

    # The agent.
    model_name_or_path: str = field_help(
        "Agent model to train: a local folder or hub id.", default=DEFAULT_AGENT_MODEL
    )
    agent_dtype: str = field_help(
        "Weights dtype for loading the agent: auto, bfloat16, float16 or float32.", default="auto"
    )
    use_peft: bool = field_help("Train a LoRA adapter instead of all weights.", default=False)
    lora_r: int = field_help("LoRA rank.", default=16)
    lora_alpha: int = field_help("LoRA alpha.", default=32)
    lora_dropout: float = field_help("LoRA dropout.", default=0.05)
    lora_target_modules: list[str] = field_help(
        "Modules LoRA adapts ('all-linear' for every linear layer but the output head).",
        default_factory=lambda: ["all-linear"],
    )
    # Data.
    train_data: str = field_help(
        "Training rows: a bundled dataset name, or a parquet/JSONL/JSON file in the release or flat schema.",
        default=DEFAULT_TRAIN_DATA,
    )
    max_train_samples: int | None = field_help("Use only the first N training rows.", default=None)
    # The loop.
    max_turns: int = field_help(
        "Most environment calls per episode (paper: 5); under protocol release, most agent turns.", default=5
    )
    max_turn_tokens: int | None = field_help(
        "Most tokens the agent writes in one turn; unset: 1,024 (the paper's), or, for a built-in trained agent "
        "as the policy (named, or the folder made from it), the cap it was trained with.",
        default=None,
    )
    max_total_tokens: int = field_help(
        "Token budget of a whole trajectory after the first prompt (paper: 8,192); under protocol release, the "
        "limit on prompt + trajectory checked before each agent turn.",
        default=8192,
    )
    protocol: str = field_help(
        "paper, or release: the reference release's rollout token for token and its reward on the decoded "
        "stream (training/configs/release.yaml; prompt_r1/loop/protocols/release.py).",
        default="paper",
    )
    # The environment's price (env/cost).
    prices: str | None = field_help(
        "A price table (YAML, MODEL: {input: $, output: $} per 1M tokens) over the bundled one, for env/cost "
        "and max_env_cost.",
        default=None,
    )
    # The reward.
    reward_preset: str | None = field_help(
        "Reward coefficients: paper or release (reference, its former name); unset: the protocol's.",
        default=None,
    )
    reward_alpha: float | None = field_help("Override α (per complete intermediate turn).", default=None)
    reward_beta: float | None = field_help("Override β (answer tag present).", default=None)
    reward_gamma: float | None = field_help("Override γ (answer non-empty).", default=None)
    reward_delta: float | None = field_help("Override δ (final turn complete).", default=None)
    reward_epsilon: float | None = field_help("Override ε (format cap and gate).", default=None)
    # Ablations (evals/bench/learning.py): what the paper's design choices do to learning.
    reward_format_gate: bool = field_help(
        "Ablation when false: the answer reward counts even when the format reward falls short of ε.",
        default=True,
    )
    train_on_environment_tokens: bool = field_help(
        "Ablation when true: the environment's tokens are trained on as if the agent wrote them (env_mask 1).",
        default=False,
    )

    def check_prompt_r1(self) -> None:
        """The checks of every field, one line naming the field (see `prompt_r1.training.shared.checks`), and the
        derived values: the reward preset the protocol implies, TRL's `max_completion_length` (one trajectory)."""
        from prompt_r1.training.shared.checks import check_config

        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        protocol = protocol_for(self.protocol)
        preset = PRESET_ALIASES.get(self.reward_preset, self.reward_preset)
        self.reward_preset = preset or protocol.reward_preset
        if self.reward_preset not in PRESETS:
            raise ConfigError(
                f"reward_preset must be one of {', '.join(PRESETS)}, got {self.reward_preset!r}"
            )
        if protocol.fixed_reward_preset and self.reward_preset != protocol.reward_preset:
            raise ConfigError(
                f"protocol {protocol.name} scores its trajectories with its own reward preset: reward_preset must "
                f"be {protocol.reward_preset} (or unset), got {self.reward_preset!r}"
            )
        if self.max_turns < 0:
            raise ConfigError(f"max_turns must be >= 0, got {self.max_turns}")
        if self.max_turn_tokens is None:
            from prompt_r1.agents.builtin import trained_turn_tokens

            self.max_turn_tokens = trained_turn_tokens(self.model_name_or_path) or PAPER_TURN_TOKENS
        if self.max_turn_tokens < 1 or self.max_total_tokens < self.max_turn_tokens:
            raise ConfigError(
                f"need 1 <= max_turn_tokens <= max_total_tokens, got {self.max_turn_tokens} and {self.max_total_tokens}"
            )
        if self.agent_dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ConfigError(
                f"agent_dtype must be auto, bfloat16, float16 or float32, got {self.agent_dtype!r}"
            )
        if isinstance(self.lora_target_modules, str):
            self.lora_target_modules = [self.lora_target_modules]
        check_config(
            self
        )  # every number in range, the output folder, the environment's and the loop's settings
        # TRL sizes generations and its truncation logging by max_completion_length: one trajectory.
        self.max_completion_length = self.max_total_tokens

    def reward_coefficients(self) -> dict[str, float]:
        names = ("alpha", "beta", "gamma", "delta", "epsilon")
        chosen = {n: getattr(self, f"reward_{n}") for n in names if getattr(self, f"reward_{n}") is not None}
        return chosen if self.reward_format_gate else {**chosen, "gate": False}

    def environment_config(self, num_processes: int = 1) -> EnvironmentConfig:
        """The environment client's settings (every `env_*` field). The run's request and token limits are split
        evenly across processes (the static split), unless `env_rate_store` names a shared store: then every
        rank, on every node, takes from the one limit as it needs."""
        values = {f.name: getattr(self, f"env_{f.name}") for f in fields(EnvironmentConfig)}
        if is_shared_store(values["rate_store"]):
            # The store's in-flight cap holds for every process together; env_max_in_flight is per process.
            values["max_in_flight"] = values["max_in_flight"] * max(1, num_processes)
            return EnvironmentConfig(**values)
        for name in _PER_RUN:
            if values[name]:
                values[name] = max(1, values[name] // max(1, num_processes))
        return EnvironmentConfig(**values)

    def environment_client(self) -> Any:
        """The environment client of a run given none: this process's share of `environment_config`, a built-in
        environment model with no base URL served on 127.0.0.1 by this process."""
        from prompt_r1.agents.model_server import local_environment
        from prompt_r1.clients.environment import EnvironmentClient

        return EnvironmentClient(local_environment(self.environment_config(num_processes=self.world_size)))

    def loop_config(self) -> LoopConfig:
        """The loop's settings for rollouts: every `LoopConfig` field is a field of this config of the same name,
        but those training fixes (`ROLLOUT_LOOP`: running out of turns is the agent's outcome to learn from, so
        it is not asked once more for an answer)."""
        values = {f.name: getattr(self, f.name) for f in fields(LoopConfig) if f.name not in ROLLOUT_LOOP}
        return LoopConfig(**values, **ROLLOUT_LOOP)

    def resolved_train_data(self) -> str:
        """`train_data` as given (a bundled set's name, an absolute path, a path found from the working folder),
        else, for a relative path, the project's copy (`PROJECT_ROOT / path`), so that the shipped recipes'
        `training/data/...` is found from any folder. A recipe's own relative path was made relative to the
        recipe's folder when `prompt-r1 train --config` read it (cli/train.py)."""
        path = Path(self.train_data)
        if path.is_absolute() or path.exists() or path.suffix == "":
            return self.train_data
        project = PROJECT_ROOT / path
        return str(project) if project.exists() else self.train_data


def check_spend_caps(config: Any) -> None:
    """`max_env_cost` and `max_env_calls`, of either trainer: unset, or a positive finite number."""
    for name in ("max_env_cost", "max_env_calls"):
        value = getattr(config, name)
        if value is not None and not (isinstance(value, int | float) and 0 < value < float("inf")):
            raise ConfigError(f"{name} must be a positive number (or unset for no cap), got {value!r}")


def refuse_unknown_keys(cls: type, trainer: str, reasons: Callable[[str], str]) -> type:
    """Wrap the dataclass `cls`'s constructor so that a key it does not have is one `ConfigError` line naming the
    key and, from `reasons(key)`, what to do instead, rather than Python's TypeError. `trainer` names the trainer
    in the message ("the synchronous trainer")."""
    init = cls.__init__
    names = {f.name for f in fields(cls) if f.init}

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **values: Any) -> None:
        unknown = [key for key in values if key not in names]
        if unknown:
            raise ConfigError(unknown_keys_message(trainer, unknown, values, reasons))
        init(self, *args, **values)

    cls.__init__ = checked_init
    cls.trainer_name = trainer  # for `prompt-r1 train`'s recipe and flags, refused in the same words
    cls.why_not = staticmethod(reasons)
    return cls


def unknown_keys_message(
    trainer: str, keys: list[str], values: dict[str, Any], reasons: Callable[[str], str]
) -> str:
    """One line: each key `trainer` does not have, its value when known (short, and never one that could be a
    secret: a misplaced `api_key: sk-…` must not be printed), and what to do instead."""
    parts = [
        f"{key}: {_shown(values[key])} ({reasons(key)})" if key in values else f"{key} ({reasons(key)})"
        for key in keys
    ]
    return f"the {trainer} does not support " + "; ".join(parts)


def _shown(value: Any) -> str:
    """A value for an error line: numbers and booleans as they are, anything else by its type and length only."""
    if isinstance(value, bool | int | float) or value is None:
        return repr(value)
    return (
        f"<{type(value).__name__} of length {len(value)}>"
        if hasattr(value, "__len__")
        else f"<{type(value).__name__}>"
    )
