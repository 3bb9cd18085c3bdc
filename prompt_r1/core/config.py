"""Settings for the agent, the environment and the loop, and the one place that reads environment variables.

Every config is a frozen dataclass whose fields carry their meaning in `metadata["help"]`; the CLI builds its
flags from the same fields, so the help text cannot drift from the code.
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from prompt_r1.core import redaction
from prompt_r1.core.checks import number
from prompt_r1.core.errors import ConfigError, MissingCredentials
from prompt_r1.core.redaction import NO_KEY
from prompt_r1.core.urls import MEMORY_STORE, RATE_STORE_PASSWORD_ENV, check_store_url, check_url, store_user

__all__ = [
    "COMPILE_DECODE",
    "DEFAULT_AGENT_MODEL",
    "DEFAULT_ENV_MODEL",
    "AgentConfig",
    "EnvironmentConfig",
    "LoopConfig",
    "PAPER_TURN_TOKENS",
    "PROTOCOLS",
    "PROTOCOL_RULES",
    "ProtocolRules",
    "RATE_STORE_PASSWORD_ENV",
    "TRAINED_TURN_TOKENS",
    "configs_from_env",
    "load_config_file",
    "rate_store_password",
    "hub_endpoint",
    "resolve_api_key",
    "unreachable_reason",
    "warn_loop_keywords",
]

# What a user with a model hub and an OpenAI key gets without flags: the paper's agent base model (Qwen3-4B,
# loaded locally with transformers) prompting the paper's closed-source environment (GPT-4o-mini).
DEFAULT_AGENT_MODEL = "Qwen/Qwen3-4B"
DEFAULT_ENV_MODEL = "gpt-4o-mini"
# The cap on an agent turn that the paper trains and measures with, and the one each built-in trained agent was
# trained and measured with (agents/trained.py reads it from here): under another cap a trained agent is not the
# agent its model card measured (a shorter one cuts its prompts, a longer one lets a turn that should have been
# cut run on), so naming one brings its cap with it unless a cap is named too.
PAPER_TURN_TOKENS = 1024
TRAINED_TURN_TOKENS = {"smollm2-135m-notes": 64}


@dataclass(frozen=True)
class ProtocolRules:
    """What a loop config must hold under one protocol, as data: the protocols themselves (prompt_r1.loop.protocols)
    sit a layer above, and a config is refused where it is built."""

    asks_final_answer: (
        bool  # force_final_answer's default; False: it may not be on (turns run out unanswered)
    )
    turns_counted: str  # what max_turns counts, for its error
    min_turns: int = 0


# The loop's protocols: the paper's text, or the reference release's rollout token for token
# (prompt_r1/loop/protocols/release.py).
PROTOCOL_RULES: dict[str, ProtocolRules] = {
    "paper": ProtocolRules(asks_final_answer=True, turns_counted="environment calls"),
    "release": ProtocolRules(asks_final_answer=False, turns_counted="agent turns", min_turns=1),
}
PROTOCOLS = tuple(PROTOCOL_RULES)


def _help(text: str, *, check: dict[str, Any] | None = None, **kw: Any) -> Any:
    """A field with its help text and, for a number, the range `prompt_r1.core.checks.number` holds it to (every
    number field has one: a value from a flag, a file or an environment variable is checked the same way)."""
    metadata = {"help": text} if check is None else {"help": text, "check": check}
    return field(metadata=metadata, **kw)


# A local agent's decoding (AgentConfig.compile_decode, and the synchronous trainer's agent_compile_decode).
COMPILE_DECODE = ("auto", "on", "off")

AT_LEAST_1 = {"integer": True, "minimum": 1}
AT_LEAST_0 = {"integer": True, "minimum": 0}
POSITIVE = {"above": 0}
NON_NEGATIVE = {"minimum": 0}


@dataclass(frozen=True)
class EnvironmentConfig:
    """The large LLM that answers the agent's prompts: any OpenAI-compatible chat endpoint."""

    model: str = _help("Environment model name as the endpoint knows it.", default=DEFAULT_ENV_MODEL)
    base_url: str | None = _help(
        "OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 for a local vLLM server; unset: OpenAI's API.",
        default=None,
    )
    api_key_env: str = _help(
        "Name of the environment variable that holds the API key (the key itself is never printed).",
        default="OPENAI_API_KEY",
    )
    rate_limit: int = _help(
        "Requests allowed per rate period, shared by every episode in the process.",
        default=500,
        check=AT_LEAST_1,
    )
    rate_period: float = _help("Length of the rate-limit window in seconds.", default=60.0, check=POSITIVE)
    max_in_flight: int = _help(
        "Requests allowed in flight at once to this endpoint.", default=32, check=AT_LEAST_1
    )
    tokens_per_minute: int | None = _help(
        "Tokens (prompt + response) allowed per minute, shared like rate_limit; unset: no token limit.",
        default=None,
        check=AT_LEAST_1,
    )
    token_limit: int | None = _help(
        "Tokens (prompt + response) allowed per rate period, shared like rate_limit; counted from the request "
        "before a call and corrected from the reported usage after it. Set this or tokens_per_minute.",
        default=None,
        check=AT_LEAST_1,
    )
    rate_store: str = _help(
        "Where the limits are kept: memory (this process only), or redis://host:port/db (rediss:// for TLS), "
        f"shared by every process and machine naming it; a password comes from {RATE_STORE_PASSWORD_ENV}.",
        default=MEMORY_STORE,
    )
    timeout: float = _help(
        "Seconds allowed for one call before it counts as a timeout.", default=60.0, check=POSITIVE
    )
    max_retries: int = _help(
        "Retries after a failed call (429, 5xx, timeout, dropped connection).", default=5, check=AT_LEAST_0
    )
    backoff_initial: float = _help(
        "First retry wait in seconds; doubles per retry, with full jitter.", default=1.0, check=NON_NEGATIVE
    )
    backoff_max: float = _help(
        "Longest backoff between retries in seconds (Retry-After is honoured up to max_retry_after).",
        default=30.0,
        check=NON_NEGATIVE,
    )
    max_retry_after: float = _help(
        "Longest wait honoured from a server's Retry-After, in seconds.", default=120.0, check=NON_NEGATIVE
    )
    temperature: float | None = _help(
        "Sampling temperature (0 to 2); unset: the endpoint's default.",
        default=None,
        check={"minimum": 0, "maximum": 2},
    )
    max_tokens: int | None = _help(
        "Most tokens per environment response; unset: the endpoint's default.", default=None, check=AT_LEAST_1
    )

    def __post_init__(self) -> None:
        _check_types(self)
        if self.base_url is not None:
            check_url(self.base_url, "--env-base-url")
        if self.token_limit is not None and self.tokens_per_minute is not None:
            raise ConfigError(
                "set one of env token_limit (per rate period) and env tokens_per_minute, not both"
            )
        check_store_url(self.rate_store)


@dataclass(frozen=True)
class AgentConfig:
    """The small LLM that thinks and writes prompts: a served endpoint or a local model."""

    model: str = _help(
        "Agent model: a local path or hub id (loaded with transformers), or the served model's name with --agent-base-url.",
        default=DEFAULT_AGENT_MODEL,
    )
    base_url: str | None = _help(
        "OpenAI-compatible base URL of a served agent (e.g. `vllm serve` of a trained checkpoint).",
        default=None,
    )
    api_key_env: str = _help(
        "Environment variable holding the served agent's API key, if it needs one.",
        default="PROMPT_R1_AGENT_API_KEY",
    )
    backend: str = _help(
        "auto (served if base_url is set, else transformers), served, transformers or vllm.", default="auto"
    )
    temperature: float = _help("Agent sampling temperature (0: greedy).", default=0.7, check=NON_NEGATIVE)
    top_p: float = _help(
        "Agent nucleus sampling threshold (above 0, at most 1).",
        default=1.0,
        check={"above": 0, "maximum": 1},
    )
    max_new_tokens: int | None = _help(
        "Most tokens the agent may write in one turn; unset: 1,024 (the paper's), or the cap a built-in trained "
        f"agent was trained with ({', '.join(f'{name}: {cap}' for name, cap in TRAINED_TURN_TOKENS.items())}).",
        default=None,
        check=AT_LEAST_1,
    )
    device: str | None = _help(
        "Device for a local agent (cuda, cpu); unset: cuda when available.", default=None
    )
    dtype: str = _help("Weights dtype for a local agent: auto, bfloat16, float16 or float32.", default="auto")
    seed: int | None = _help(
        "Seed for the agent's sampling, for reproducible runs.", default=None, check=AT_LEAST_0
    )
    tokenizer: str | None = _help(
        "Tokenizer of a served agent (local path or hub id), for token-exact turns and the drift check; unset: the "
        "model name when it is a local folder.",
        default=None,
    )
    generate_memory_mb: int | None = _help(
        "Most memory (MiB) one generate call of the transformers backend may hold for its key/value cache and "
        "token scores, as estimated from the model's shape; a larger batch runs as consecutive calls. Unset: 1024 "
        "on CPU, no bound on an accelerator (where a split costs a whole decoding pass).",
        default=None,
        check=AT_LEAST_1,
    )
    guide_calls: int | None = _help(
        "Guide an untrained local agent into the protocol's tags (constrained decoding: the tags are written for "
        "it, the words inside are its own): it prompts the environment N times, then answers. Unset: unguided.",
        default=None,
        check=AT_LEAST_0,
    )
    token_exact: str = _help(
        "A served agent's turns as token ids through vLLM's completions API, as in training: auto (when the server "
        "is vLLM and a tokenizer is found), on (required), off (chat messages).",
        default="auto",
    )
    compile_decode: str = _help(
        "Decode a local agent with a static key/value cache and a compiled step (torch.compile, CUDA graphs): on, "
        "off, or auto (on for a CUDA model whose weights DeepSpeed ZeRO-3 does not partition, while its kept caches "
        "fit an eighth of the GPU's memory). The first calls compile (tens of seconds), which pays off over many "
        "batches (training: its default is auto).",
        default="off",
    )

    def __post_init__(self) -> None:
        if self.max_new_tokens is None:  # frozen, so set through object
            trained = TRAINED_TURN_TOKENS.get(self.model) if isinstance(self.model, str) else None
            object.__setattr__(self, "max_new_tokens", trained or PAPER_TURN_TOKENS)
        _check_types(self)
        if self.token_exact not in {"auto", "on", "off"}:
            raise ConfigError(f"agent token_exact must be auto, on or off, got {self.token_exact!r}")
        if self.compile_decode not in COMPILE_DECODE:
            raise ConfigError(f"agent compile_decode must be auto, on or off, got {self.compile_decode!r}")
        if self.backend not in {"auto", "served", "transformers", "vllm"}:
            raise ConfigError(
                f"agent backend must be auto, served, transformers or vllm, got {self.backend!r}"
            )
        if self.backend == "served" and not self.base_url:
            raise ConfigError("the served agent backend needs --agent-base-url")
        if self.base_url is not None:
            check_url(self.base_url, "--agent-base-url")

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "served" if self.base_url else "transformers"


@dataclass(frozen=True)
class LoopConfig:
    """How one episode runs: the one source of the loop's settings for `build_graph`, `EpisodeRunner`,
    `PromptR1Chat`, `serve` and GRPO rollouts (`PromptR1GRPOConfig.loop_config()`)."""

    max_turns: int = _help(
        "Most environment calls per episode (paper: 5); under --protocol release, most agent turns.",
        default=5,
        check=AT_LEAST_0,
    )
    force_final_answer: bool | None = _help(
        "When the agent prompts again after its last allowed call, ask it once for a final answer; unset: on "
        "under the paper protocol, off under release (which ends unanswered).",
        default=None,
    )
    max_turn_tokens: int | None = _help(
        "Most tokens the agent writes in one turn; unset: the agent's own max_new_tokens (paper: 1,024).",
        default=None,
        check=AT_LEAST_1,
    )
    max_total_tokens: int = _help(
        "Token budget of one agent trajectory (paper: 8,192); token-exact backends only. Under --protocol release, "
        "the limit on prompt + trajectory checked before each agent turn, as the release does.",
        default=8192,
        check=AT_LEAST_1,
    )
    protocol: str = _help(
        "paper (the paper's loop) or release (the reference release's training rollout token for token: its "
        "tools prompt, JSON calls and replies, error observations, turn counting; see "
        "prompt_r1/loop/protocols/release.py).",
        default="paper",
    )

    def __post_init__(self) -> None:
        _check_types(self)
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        rules = PROTOCOL_RULES[self.protocol]
        if self.force_final_answer is None:  # the protocol's own: frozen, so set through object
            object.__setattr__(self, "force_final_answer", rules.asks_final_answer)
        if self.max_turns < rules.min_turns:
            raise ConfigError(
                f"the {self.protocol} protocol counts {rules.turns_counted}: max_turns must be >= {rules.min_turns}"
            )
        if self.force_final_answer and not rules.asks_final_answer:
            raise ConfigError(
                f"the {self.protocol} protocol ends an episode unanswered when its turns run out: "
                "force_final_answer must be off under it"
            )


def warn_loop_keywords(
    owner: str, given: Iterable[str], renamed: Mapping[str, str] | None = None, *, stacklevel: int = 3
) -> None:
    """Warn (DeprecationWarning) that `owner` was given loop settings as keywords (`given`) instead of in
    `loop=LoopConfig(...)`, the one source of loop settings; `renamed`: a keyword → its LoopConfig field where
    the names differ. The keyword forms are kept for one release; `stacklevel` 3 points at the caller of a
    function that calls this."""
    names = list(given)
    if names:
        fields_given = ", ".join(f"{(renamed or {}).get(name, name)}=..." for name in names)
        warnings.warn(
            f"{owner}({', '.join(f'{name}=...' for name in names)}) is deprecated; pass "
            f"loop=LoopConfig({fields_given}) instead",
            DeprecationWarning,
            stacklevel=stacklevel,
        )


_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


# How a config's fields are named in its errors: as the flags that set them.
_FLAG_PREFIX = {"EnvironmentConfig": "env ", "AgentConfig": "agent ", "LoopConfig": ""}


def _check_types(config: Any) -> None:
    """Values from YAML or Python must have the field's type (a config file can hold `base_url: 123`), and a number
    its field's range (`check` in the field's metadata: finite, and e.g. ≥ 1)."""
    for f in fields(config):
        value = getattr(config, f.name)
        parts = [p.strip() for p in str(f.type).split("|")]
        if value is None and "None" in parts:
            continue
        allowed = tuple(t for p in parts for t in _TYPES.get(p, ()))
        if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            expected = " or ".join(parts)
            raise ConfigError(f"{type(config).__name__}.{f.name} must be {expected}, got {value!r}")
        check = f.metadata.get("check")
        if check is not None:
            name = _FLAG_PREFIX.get(type(config).__name__, "") + f.name
            object.__setattr__(config, f.name, number(value, name, none_ok="None" in parts, **check))


def rate_store_password(url: str | None = None) -> str | None:
    """The Redis password from its environment variable, registered for redaction, or None. With the store's
    `url`: a URL naming a user with no password set is refused in one line (the redis client would log in as
    that user with an empty password, which the store refuses as if no password had been asked for)."""
    password = os.environ.get(RATE_STORE_PASSWORD_ENV) or None
    if password:
        redaction.register(password)
    elif url is not None and store_user(url):
        raise ConfigError(
            f"--env-rate-store names a user but {RATE_STORE_PASSWORD_ENV} is not set: set it to that user's "
            "password, or take the user out of the URL"
        )
    return password


def unreachable_reason(url: str, timeout: float = 5.0) -> str | None:
    """None when something accepts a TCP connection at the URL's host and port, else why not (one phrase)."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def hub_endpoint() -> str | None:
    """The Hugging Face hub URL models would download from, or None when HF_HUB_OFFLINE forbids downloads."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes"}:
        return None
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def resolve_api_key(api_key_env: str, base_url: str | None, *, what: str = "environment") -> str:
    """Read the API key from the named variable.

    OpenAI's own API (no base_url) needs a key: its absence raises `MissingCredentials` naming the variable.
    A custom endpoint may need none (a local vLLM server), so there the placeholder "EMPTY" is used and the
    server itself answers 401 if it did want a key.
    """
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    if key:
        redaction.register(key)  # from here on, every surface cuts it out of what it writes
        return key
    if base_url is None:
        hint = "--env-api-key-env" if what == "environment" else "--agent-api-key-env"
        raise MissingCredentials(
            f"the {what} API key is missing: set {api_key_env or 'OPENAI_API_KEY'}, name another variable with "
            f"{hint}, or point --{'env' if what == 'environment' else 'agent'}-base-url at a local "
            "OpenAI-compatible server"
        )
    return NO_KEY


def read_yaml_file(path: str | Path, what: str) -> Any:
    """The YAML/JSON document in `path`, or a one-line `ConfigError` naming `what` and the file: missing, a
    folder, unreadable, not UTF-8, or not valid YAML (with the line and column of the problem)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"cannot read {what} {path}: " + ("it is a folder" if path.is_dir() else "no such file")
        )
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"{what} {path} is not valid YAML/JSON: {problem}{where}") from None
    except RecursionError:
        raise ConfigError(f"{what} {path} is nested too deeply") from None


def load_config_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a YAML/JSON config with optional `agent`, `environment` and `loop` sections.

    Unknown sections or keys are errors that list the valid names, so a typo never passes silently.
    """
    path = Path(path)
    data = read_yaml_file(path, "config file") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping with agent/environment/loop sections")
    sections = {"agent": AgentConfig, "environment": EnvironmentConfig, "loop": LoopConfig}
    out: dict[str, dict[str, Any]] = {}
    for name, values in data.items():
        if name not in sections:
            raise ConfigError(
                f"config file {path}: unknown section {name!r}; expected one of {sorted(sections)}"
            )
        if not isinstance(values, dict):
            raise ConfigError(f"config file {path}: section {name!r} must be a mapping")
        valid = {f.name for f in fields(sections[name])}
        unknown = sorted(set(values) - valid)
        if unknown:
            raise ConfigError(
                f"config file {path}: unknown {name} keys {unknown}; valid keys: {sorted(valid)}"
            )
        out[name] = dict(values)
    return out


def _from_text(text: str, type_name: str, variable: str) -> Any:
    parts = [p.strip() for p in type_name.split("|")]
    if "None" in parts and text.strip().lower() in ("", "none", "null"):
        return None
    try:
        if "bool" in parts:
            lowered = text.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(text)
            return lowered in ("1", "true", "yes", "on")
        if "int" in parts:
            return int(text)
        if "float" in parts:
            return float(text)
    except ValueError:
        raise ConfigError(f"{variable}={text!r}: expected {' or '.join(parts)}") from None
    return text


def configs_from_env(
    environ: dict[str, str] | None = None, prefix: str = "PROMPT_R1_"
) -> tuple[AgentConfig, EnvironmentConfig, LoopConfig]:
    """Configs from environment variables, for deployments without a command line (`langgraph dev`/`up`):
    every AgentConfig field is `PROMPT_R1_AGENT_<NAME>`, every EnvironmentConfig field `PROMPT_R1_ENV_<NAME>`,
    every LoopConfig field `PROMPT_R1_<NAME>` (e.g. PROMPT_R1_AGENT_BASE_URL, PROMPT_R1_ENV_MODEL,
    PROMPT_R1_MAX_TURNS). Unset variables keep the defaults; a value of the wrong type names its variable.

    >>> agent, env, loop = configs_from_env({"PROMPT_R1_ENV_MODEL": "m", "PROMPT_R1_MAX_TURNS": "3"})
    >>> env.model, loop.max_turns
    ('m', 3)
    """
    environ = os.environ if environ is None else environ
    built = []
    for cls, section in ((AgentConfig, "AGENT_"), (EnvironmentConfig, "ENV_"), (LoopConfig, "")):
        values = {}
        for f in fields(cls):
            variable = f"{prefix}{section}{f.name.upper()}"
            if variable in environ:
                values[f.name] = _from_text(environ[variable], str(f.type), variable)
        built.append(cls(**values))
    return built[0], built[1], built[2]
