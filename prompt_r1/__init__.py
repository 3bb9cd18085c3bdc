"""Prompt-R1: a small agent LLM thinks and writes prompts to a large LLM over several turns, then answers.

from prompt_r1 import AgentConfig, EnvironmentClient, EnvironmentConfig, build_graph, load_agent

graph = build_graph(load_agent(AgentConfig(model="Qwen/Qwen3-4B")),
                    EnvironmentClient(EnvironmentConfig(model="gpt-4o-mini")), max_turns=5)
result = graph.invoke({"question": "Which magazine was started first, Arthur's Magazine or First for Women?"})
"""

from prompt_r1.agents import AgentBackend, AgentOutput, AgentRequest, load_agent
from prompt_r1.config import AgentConfig, EnvironmentConfig, LoopConfig
from prompt_r1.environment import EnvironmentClient, EnvironmentReply
from prompt_r1.errors import PromptR1Error
from prompt_r1.graph import EpisodeState, build_graph
from prompt_r1.protocol import AgentTurn, parse_agent_output

__all__ = [
    "AgentBackend",
    "AgentConfig",
    "AgentOutput",
    "AgentRequest",
    "AgentTurn",
    "EnvironmentClient",
    "EnvironmentConfig",
    "EnvironmentReply",
    "EpisodeState",
    "LoopConfig",
    "PromptR1Error",
    "build_graph",
    "load_agent",
    "parse_agent_output",
]
__version__ = "0.1.0"
