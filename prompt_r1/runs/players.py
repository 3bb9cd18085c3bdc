"""The agent and the environment from what a caller gave: objects as they are, model names built, nothing at all
the offline default (core/defaults.py).

    agent, environment, why = players("smollm2-135m", "smollm2-135m")   # built in: loaded, and served on 127.0.0.1
    agent, environment, why = players(None, None)    # no OPENAI_API_KEY: the built-in model for both, and `why` says so

A name is a model name as the command line takes it: a built-in model, a folder or hub id for the agent, and for
the environment a model of OpenAI's API (its key needed) or a built-in model served by this process.
"""

from __future__ import annotations

from typing import Any

from prompt_r1.core.config import AgentConfig, EnvironmentConfig

__all__ = ["players"]


def players(agent: Any = None, environment: Any = None) -> tuple[Any, Any, str | None]:
    """(agent backend, environment, the line saying why the offline default was taken or None)."""
    from prompt_r1.core.defaults import offline_default

    agent_cfg = AgentConfig(model=agent) if isinstance(agent, str) else AgentConfig()
    env_cfg = EnvironmentConfig(model=environment) if isinstance(environment, str) else EnvironmentConfig()
    why = None
    if agent is None or environment is None:
        named = {"agent.model"} if agent is not None else set()
        named |= {"environment.model"} if environment is not None else set()
        agent_cfg, env_cfg, why = offline_default(agent_cfg, env_cfg, named=named)
    if agent is None or isinstance(agent, str):
        from prompt_r1.agents import load_agent

        agent = load_agent(agent_cfg)
    if environment is None or isinstance(environment, str):
        from prompt_r1.agents.model_server import local_environment
        from prompt_r1.clients.environment import EnvironmentClient

        environment = EnvironmentClient(local_environment(env_cfg))
    return agent, environment, why
