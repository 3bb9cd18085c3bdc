"""`PromptR1GRPOConfig`: TRL's `GRPOConfig` extended with the agent model, data, loop, environment and reward.

Every field is a command-line flag of `prompt-r1 train` (`--env_model` or `--env-model`) and a key of a recipe
YAML (`training/configs/*.yaml`); flags override the recipe.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

from trl import GRPOConfig

from prompt_r1.core.config import DEFAULT_AGENT_MODEL, PROTOCOLS, EnvironmentConfig, LoopConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.loop.protocols import protocol_for
from prompt_r1.scoring.rewards import PRESET_ALIASES, PRESETS

__all__ = ["DEFAULT_TRAIN_DATA", "PromptR1GRPOConfig"]

# The paper release's 2,048-row training sample, shipped with the project.
DEFAULT_TRAIN_DATA = "training/data/mixed_2048.parquet"


# The loop settings training fixes rather than takes as fields (see `PromptR1GRPOConfig.loop_config`).
ROLLOUT_LOOP = {"force_final_answer": False}


def _help(text: str, aliases: list[str] | None = None, switch: bool = False, **kw):
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
class PromptR1GRPOConfig(GRPOConfig, EnvironmentFields):
    """GRPO for the Prompt-R1 agent: TRL's fields, the environment's (`env_*`, derived from EnvironmentConfig and
    so placed first), then the agent, data, loop and reward."""

    # The agent.
    model_name_or_path: str = _help(
        "Agent model to train: a local folder or hub id.", default=DEFAULT_AGENT_MODEL
    )
    agent_dtype: str = _help(
        "Weights dtype for loading the agent: auto, bfloat16, float16 or float32.", default="auto"
    )
    use_peft: bool = _help("Train a LoRA adapter instead of all weights.", default=False)
    lora_r: int = _help("LoRA rank.", default=16)
    lora_alpha: int = _help("LoRA alpha.", default=32)
    lora_dropout: float = _help("LoRA dropout.", default=0.05)
    lora_target_modules: list[str] = _help(
        "Modules LoRA adapts ('all-linear' for every linear layer but the output head).",
        default_factory=lambda: ["all-linear"],
    )
    # Data.
    train_data: str = _help(
        "Training rows: a bundled dataset name, or a parquet/JSONL/JSON file in the release or flat schema.",
        default=DEFAULT_TRAIN_DATA,
    )
    max_train_samples: int | None = _help("Use only the first N training rows.", default=None)
    # The loop.
    max_turns: int = _help(
        "Most environment calls per episode (paper: 5); under protocol release, most agent turns.", default=5
    )
    max_turn_tokens: int = _help("Most tokens the agent writes in one turn (paper: 1,024).", default=1024)
    max_total_tokens: int = _help(
        "Token budget of a whole trajectory after the first prompt (paper: 8,192); under protocol release, the "
        "limit on prompt + trajectory checked before each agent turn.",
        default=8192,
    )
    protocol: str = _help(
        "paper, or release: the reference release's rollout token for token and its reward on the decoded "
        "stream (training/configs/release.yaml; prompt_r1/loop/protocols/release.py).",
        default="paper",
    )
    # vLLM rollouts (use_vllm, vllm_mode: TRL's own fields).
    vllm_sync_check: bool = _help(
        "After every weight sync to vLLM (a colocated engine, or the server in server mode), compare the "
        "engine's log-probabilities of a fixed continuation with the trained model's; the largest gap is logged "
        "as vllm/sync_logprob_gap and appended to OUTPUT_DIR/vllm_sync.jsonl (one forward pass per sync).",
        default=False,
    )
    reproducible_rollouts: bool | None = _help(
        "Seed each step's sampling from seed, step and process, and batch the episodes' turns in lockstep in "
        "episode order, so that the same seed gives the same trajectories whatever order the environment's replies "
        "arrive in (each turn waits for the step's slowest reply). Exact on CPU; see the training docs for GPU "
        "and vLLM. Unset: on (the synchronous trainer only; the async one has no steps to seed).",
        default=None,
        switch=True,
    )
    # Spending on the environment (prompt_r1/training/shared/ledger.py and spend.py; docs: the training ledger).
    call_ledger: bool | None = _help(
        "Record every environment call in OUTPUT_DIR/call_ledger/ (SQLite, one file per process), and answer the "
        "calls a resumed run repeats from it instead of paying for them again. Unset: on (the synchronous trainer "
        "only; the async one's episodes belong to no step).",
        default=None,
        switch=True,
    )
    prices: str | None = _help(
        "A price table (YAML, MODEL: {input: $, output: $} per 1M tokens) over the bundled one, for env/cost "
        "and max_env_cost.",
        default=None,
    )
    max_env_cost: float | None = _help(
        "Stop, with a checkpoint, before the step that would take the environment's cost (dollars, all "
        "processes, all restarts) past this; the next step is estimated from the mean of the last ones.",
        default=None,
    )
    max_env_calls: int | None = _help(
        "Stop, with a checkpoint, before the step that would take the environment calls past this.",
        default=None,
    )
    # Asynchronous GRPO (prompt_r1/training/asynchronous/trainer.py; docs/async-grpo.md).
    async_grpo: bool = _help(
        "Train with TRL's AsyncGRPOTrainer: episodes keep flowing from a vLLM server (vllm_server_base_url) while "
        "the trainer trains. Also --async, or async: true in a recipe.",
        default=False,
        aliases=["--async"],
    )
    max_staleness: int | None = _help(
        "Async only: the most policy versions a sample may lag behind the trained model; older samples are "
        "dropped (unset: 4).",
        default=None,
    )
    # The reward.
    reward_preset: str | None = _help(
        "Reward coefficients: paper or release (reference, its former name); unset: the protocol's.",
        default=None,
    )
    reward_alpha: float | None = _help("Override α (per complete intermediate turn).", default=None)
    reward_beta: float | None = _help("Override β (answer tag present).", default=None)
    reward_gamma: float | None = _help("Override γ (answer non-empty).", default=None)
    reward_delta: float | None = _help("Override δ (final turn complete).", default=None)
    reward_epsilon: float | None = _help("Override ε (format cap and gate).", default=None)
    # Ablations (evals/bench/learning.py): what the paper's design choices do to learning.
    reward_format_gate: bool = _help(
        "Ablation when false: the answer reward counts even when the format reward falls short of ε.",
        default=True,
    )
    train_on_environment_tokens: bool = _help(
        "Ablation when true: the environment's tokens are trained on as if the agent wrote them (env_mask 1).",
        default=False,
    )

    def __post_init__(self) -> None:
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
        if self.max_turn_tokens < 1 or self.max_total_tokens < self.max_turn_tokens:
            raise ConfigError(
                f"need 1 <= max_turn_tokens <= max_total_tokens, got {self.max_turn_tokens} and {self.max_total_tokens}"
            )
        if self.agent_dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ConfigError(
                f"agent_dtype must be auto, bfloat16, float16 or float32, got {self.agent_dtype!r}"
            )
        for name, value in (("max_env_cost", self.max_env_cost), ("max_env_calls", self.max_env_calls)):
            if value is not None and not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise ConfigError(f"{name} must be a positive number (or unset for no cap), got {value!r}")
        # On by default where they work: the synchronous trainer. An explicit `true` under async is refused by
        # check_trainer_keys, which needs to know it was asked for, hence the unset default.
        self.explicit_true = {
            name for name in ("reproducible_rollouts", "call_ledger") if getattr(self, name) is True
        }
        for name in ("reproducible_rollouts", "call_ledger"):
            if getattr(self, name) is None:
                setattr(self, name, not self.async_grpo)
        if isinstance(self.lora_target_modules, str):
            self.lora_target_modules = [self.lora_target_modules]
        # TRL sizes vLLM's generations and its truncation logging by max_completion_length: one trajectory.
        self.max_completion_length = self.max_total_tokens
        super().__post_init__()

    def reward_coefficients(self) -> dict[str, float]:
        names = ("alpha", "beta", "gamma", "delta", "epsilon")
        chosen = {n: getattr(self, f"reward_{n}") for n in names if getattr(self, f"reward_{n}") is not None}
        return chosen if self.reward_format_gate else {**chosen, "gate": False}

    def environment_config(self, num_processes: int = 1) -> EnvironmentConfig:
        """The environment client's settings (every `env_*` field). The run's request and token limits are split
        evenly across processes (the static split), unless `env_rate_store` names a shared store: then every
        rank, on every node, takes from the one limit as it needs."""
        values = {f.name: getattr(self, f"env_{f.name}") for f in fields(EnvironmentConfig)}
        if values["rate_store"] != "memory":
            # The store's in-flight cap holds for every process together; env_max_in_flight is per process.
            values["max_in_flight"] = values["max_in_flight"] * max(1, num_processes)
            return EnvironmentConfig(**values)
        for name in _PER_RUN:
            if values[name]:
                values[name] = max(1, values[name] // max(1, num_processes))
        return EnvironmentConfig(**values)

    def loop_config(self) -> LoopConfig:
        """The loop's settings for rollouts: every `LoopConfig` field is a field of this config of the same name,
        but those training fixes (`ROLLOUT_LOOP`: running out of turns is the agent's outcome to learn from, so
        it is not asked once more for an answer)."""
        values = {f.name: getattr(self, f.name) for f in fields(LoopConfig) if f.name not in ROLLOUT_LOOP}
        return LoopConfig(**values, **ROLLOUT_LOOP)

    def resolved_train_data(self) -> str:
        """`train_data` as given, or, for a relative path missing from the working folder, the project's copy."""
        path = Path(self.train_data)
        if path.is_absolute() or path.exists() or path.suffix == "":
            return self.train_data
        project = Path(__file__).resolve().parents[2] / path
        return str(project) if project.exists() else self.train_data
