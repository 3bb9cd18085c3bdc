"""The Prompt-R1 loop as a deployable LangGraph app: `langgraph.json` beside this file names `make_graph`.

    cd graphs && PROMPT_R1_AGENT_BASE_URL=http://127.0.0.1:8001/v1 PROMPT_R1_AGENT_MODEL=my-agent \
        langgraph dev --no-browser          # or `langgraph up` for the Docker deployment

Settings come from PROMPT_R1_* environment variables (prompt_r1.core.config.configs_from_env): PROMPT_R1_AGENT_MODEL,
PROMPT_R1_AGENT_BASE_URL, PROMPT_R1_ENV_MODEL, PROMPT_R1_ENV_BASE_URL, PROMPT_R1_MAX_TURNS, ... The agent and the
environment client are built once per server process, on the first run, and shared by every run after it.
"""

from __future__ import annotations

import functools

from prompt_r1 import EnvironmentClient, build_graph, load_agent
from prompt_r1.core.config import configs_from_env


@functools.cache
def _graph():
    agent_config, env_config, loop_config = configs_from_env()
    return build_graph(load_agent(agent_config), EnvironmentClient(env_config), loop=loop_config)


def make_graph():
    """The compiled loop; input `{"question": ...}`, output state with answer, status, turns and usage."""
    return _graph()
