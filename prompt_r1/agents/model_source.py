"""Where an agent model is loaded from, checked in seconds before anything loads it: a built-in model
(agents/builtin.py), a local model folder, or a Hugging Face hub id that is cached or downloadable here.

    check_model_source("./my-trained-agent", "--agent-model")   # ConfigError: no such folder

A path that does not exist would otherwise reach the hub client as a repository id and end, after its retries,
in a traceback (`HFValidationError` for "./x", a connection error for "org/x" with no network).
"""

from __future__ import annotations

from pathlib import Path

from prompt_r1.agents.builtin import ModelNameError, check_builtin, is_builtin
from prompt_r1.core.config import hub_endpoint, unreachable_reason
from prompt_r1.core.errors import ConfigError

__all__ = ["EmptyModelFolder", "check_model_source"]


class EmptyModelFolder(ModelNameError):
    """A folder given as a model that holds none (no config.json): the user's to fix (exit 2), not a service
    that cannot be reached."""


def _hub_id_error(name: str) -> str | None:
    """Why `name` cannot be a hub repository id, or None when it can."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as exc:
        return str(exc)
    return None


def check_model_source(name: str, flag: str) -> None:
    """A `ConfigError` naming `flag` when `name` is neither a local model folder nor a hub id that can be
    loaded here (cached, or the hub reachable). A hub id that is reachable but wrong is left to the loader, whose
    error says so."""
    from prompt_r1.core.defaults import BUILTIN_MODEL_NAMES

    if is_builtin(name):
        check_builtin(name)
        return
    path = Path(name).expanduser()
    if path.is_dir():
        # An empty or half-copied folder would reach the tokenizer's loader, which ends in a traceback.
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise EmptyModelFolder(
                f"{flag} {name}: the folder holds no model (no config.json); give the folder a trained model "
                "was saved to, or a hub id such as Qwen/Qwen3-4B"
            )
        return
    if path.exists():
        raise ConfigError(f"{flag} {name}: is a file; a model is a folder (config.json, weights, tokenizer)")
    looks_local = name.startswith((".", "/", "~")) or _hub_id_error(name) is not None
    builtin = ", ".join(BUILTIN_MODEL_NAMES)
    if looks_local:
        raise ConfigError(
            f"{flag} {name}: no such model folder (and it cannot be a Hugging Face hub id); give the folder a "
            f"trained model was saved to, a hub id such as Qwen/Qwen3-4B, or a built-in model ({builtin})"
        )
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return  # cached: loads offline
    endpoint = hub_endpoint()
    reason = "downloads are off (HF_HUB_OFFLINE)" if endpoint is None else unreachable_reason(endpoint)
    if reason is not None:
        local = Path(name.split("/")[0]).is_dir()
        if "/" not in name:  # a bare name is far more often a built-in model mistyped than a legacy hub id
            raise ModelNameError(f"{flag} {name}: not a built-in model ({builtin}), a local folder, nor a cached "
                              f"Hugging Face model (the hub cannot be reached: {reason})")  # fmt: skip
        raise ConfigError(
            f"{flag} {name}: "
            + (f"no such model folder (there is no {name} under {Path.cwd()}); nor" if local else "not a local "
               "folder, nor")
            + f" is it in the Hugging Face cache, and the hub cannot be reached ({reason})"
        )  # fmt: skip
