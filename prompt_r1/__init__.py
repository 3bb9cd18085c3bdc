"""Prompt-R1: a small agent LLM thinks and writes prompts to a large LLM over several turns, then answers.

    from prompt_r1 import AgentConfig, EnvironmentClient, EnvironmentConfig, build_graph, load_agent

    graph = build_graph(load_agent(AgentConfig(model="Qwen/Qwen3-4B")),
                        EnvironmentClient(EnvironmentConfig(model="gpt-4o-mini")), max_turns=5)
    result = graph.invoke({"question": "Which magazine was started first, Arthur's Magazine or First for Women?"})

Names are imported on first use (the OpenAI and LangChain clients take seconds to import), so `import prompt_r1`
and `prompt-r1 --help` stay fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AgentBackend": "prompt_r1.agents",
    "AgentOutput": "prompt_r1.agents",
    "AgentRequest": "prompt_r1.agents",
    "load_agent": "prompt_r1.agents",
    "AgentConfig": "prompt_r1.core.config",
    "EnvironmentConfig": "prompt_r1.core.config",
    "LoopConfig": "prompt_r1.core.config",
    "PromptR1Chat": "prompt_r1.integrations.chat_model",
    "EnvironmentClient": "prompt_r1.clients.environment",
    "EnvironmentReply": "prompt_r1.clients.environment",
    "Episode": "prompt_r1.runs.episode",
    "EpisodeRunner": "prompt_r1.runs.episode",
    "PromptR1Error": "prompt_r1.core.errors",
    "EpisodeState": "prompt_r1.loop.graph",
    "build_graph": "prompt_r1.loop.graph",
    "AgentTurn": "prompt_r1.core.protocol",
    "parse_agent_output": "prompt_r1.core.protocol",
    "load_samples": "prompt_r1.data.datasets",
    "score_episode": "prompt_r1.scoring.rewards",
    "score_transcript": "prompt_r1.scoring.rewards",
    "trl_reward": "prompt_r1.scoring.rewards",
}
__all__ = [
    "AgentBackend",
    "AgentConfig",
    "AgentOutput",
    "AgentRequest",
    "AgentTurn",
    "EnvironmentClient",
    "EnvironmentConfig",
    "EnvironmentReply",
    "Episode",
    "EpisodeRunner",
    "EpisodeState",
    "LoopConfig",
    "PromptR1Chat",
    "PromptR1Error",
    "build_graph",
    "load_agent",
    "load_samples",
    "parse_agent_output",
    "score_episode",
    "score_transcript",
    "trl_reward",
]
assert sorted(__all__) == sorted(_EXPORTS)

if TYPE_CHECKING:
    from prompt_r1.agents import AgentBackend, AgentOutput, AgentRequest, load_agent
    from prompt_r1.clients.environment import EnvironmentClient, EnvironmentReply
    from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig
    from prompt_r1.core.errors import PromptR1Error
    from prompt_r1.core.protocol import AgentTurn, parse_agent_output
    from prompt_r1.data.datasets import load_samples
    from prompt_r1.integrations.chat_model import PromptR1Chat
    from prompt_r1.loop.graph import EpisodeState, build_graph
    from prompt_r1.runs.episode import Episode, EpisodeRunner
    from prompt_r1.scoring.rewards import score_episode, score_transcript, trl_reward


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'prompt_r1' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
