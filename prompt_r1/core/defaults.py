"""The offline default: what runs when no environment was named and the provider's key is not set.

The configs' own defaults are the paper's setting (a Qwen3-4B agent prompting gpt-4o-mini through OpenAI's API),
which needs a model hub and a paid key. Where the key is missing and the user named no environment, the built-in
model (`smollm2-135m`, made offline from a PyPI package) plays the environment, served on 127.0.0.1, and, unless
the user named an agent, the agent too: the loop runs for real with nothing to pay and nothing to download. A user
who named a model or an endpoint gets exactly that, and a missing key is then an error as before.

    agent, env, why = offline_default(AgentConfig(), EnvironmentConfig(), named=set(), environ={})
    env.model, agent.model     # ('smollm2-135m', 'smollm2-135m'); `why` is the one line a surface prints
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from prompt_r1.core.config import DEFAULT_AGENT_MODEL, DEFAULT_ENV_MODEL, AgentConfig, EnvironmentConfig

__all__ = [
    "BUILTIN_DEFAULT_MODEL",
    "BUILTIN_GUIDE_CALLS",
    "BUILTIN_MAX_NEW_TOKENS",
    "BUILTIN_MODEL_NAMES",
    "is_local_model_name",
    "local_endpoint",
    "offline_default",
]

BUILTIN_DEFAULT_MODEL = "smollm2-135m"
# The names agents/builtin.py makes into model folders (its registry is checked against these), known here so
# that the layers below the agents can tell a model that runs on this machine from a provider's.
BUILTIN_MODEL_NAMES = ("smollm2-135m", "smollm2-135m-notes")


def local_endpoint(model: str) -> str:
    """The endpoint a response cache keys a local model's replies under: its name, not its server's port."""
    return f"local:{model}"


def is_local_model_name(name: str | None) -> bool:
    """Whether `name` is a model this machine runs (a built-in model or a .gguf file), not a provider's."""
    return isinstance(name, str) and (name in BUILTIN_MODEL_NAMES or name.lower().endswith(".gguf"))


# A turn's tokens for the built-in agent when none were named: the paper's 1,024 is minutes of CPU for a
# model that, untrained, seldom closes its tags.
BUILTIN_MAX_NEW_TOKENS = 256

# Untrained, the built-in agent seldom writes the protocol's tags by itself: its turns are guided into them
# (agents/guide.py), one environment call and then the answer, so that the loop is seen whole.
BUILTIN_GUIDE_CALLS = 1

# Settings that name a player: any of these given (by flag, file or keyword) and that player is left alone.
AGENT_NAMES = ("agent.model", "agent.base_url", "agent.backend")
ENV_NAMES = ("environment.model", "environment.base_url")


def offline_default(
    agent: AgentConfig,
    environment: EnvironmentConfig,
    *,
    named: set[str],
    environ: Mapping[str, str] | None = None,
) -> tuple[AgentConfig, EnvironmentConfig, str | None]:
    """(agent, environment, the line saying why) with the built-in model in place of the paper's defaults where
    the environment's key is missing and nothing names the players; the configs unchanged and None otherwise.

    `named`: the settings the user gave, as "section.field" ("agent.model", "environment.base_url", ...)."""
    environ = os.environ if environ is None else environ
    key_variable = environment.api_key_env or "OPENAI_API_KEY"
    if environ.get(key_variable) or any(name in named for name in ENV_NAMES):
        return agent, environment, None
    if environment.model != DEFAULT_ENV_MODEL or environment.base_url is not None:
        return agent, environment, None  # a config built with another environment in code
    environment = dataclasses.replace(environment, model=BUILTIN_DEFAULT_MODEL)
    players = "the environment is"
    if (
        not any(name in named for name in AGENT_NAMES)
        and agent.model == DEFAULT_AGENT_MODEL
        and not agent.base_url
    ):
        changes = {"model": BUILTIN_DEFAULT_MODEL}
        if "agent.max_new_tokens" not in named:
            changes["max_new_tokens"] = BUILTIN_MAX_NEW_TOKENS
        if "agent.guide_calls" not in named:
            changes["guide_calls"] = BUILTIN_GUIDE_CALLS
        agent = dataclasses.replace(agent, **changes)
        players = "the agent and the environment are"
        if agent.guide_calls is not None:
            players_note = f"; untrained, the agent's turns are guided into the protocol's tags (--agent-guide-calls {agent.guide_calls})"
        else:
            players_note = "; untrained, the agent follows the protocol poorly"
    else:
        players_note = ""
    why = (
        f"no {key_variable}: {players} the built-in {BUILTIN_DEFAULT_MODEL} (SmolLM2-135M-Instruct, run on this "
        f"machine{players_note}); set {key_variable}, or name --env-model and --agent-model, for others"
    )
    return agent, environment, why
