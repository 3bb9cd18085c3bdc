"""Shared argument handling for the examples: real endpoints from flags, or `--demo` for scripted local servers."""

from __future__ import annotations

import argparse
import contextlib

from prompt_r1 import AgentConfig, EnvironmentClient, EnvironmentConfig, LoopConfig, build_graph, load_agent
from prompt_r1.testing.servers import ScriptedServer, echo_environment, scripted_agent

DEMO_AGENT = [
    "<think>Compare founding years.</think><interaction_prompt>When were Arthur's Magazine and First for Women "
    "first published?</interaction_prompt>",
    "<think>1844 is earlier than 1989.</think><answer>Arthur's Magazine</answer>",
]


DEMO_NOTICE = "demo: the agent and the environment are scripted (canned replies served at {url}), not models"

DEFAULT_QUESTION = "Which magazine was started first, Arthur's Magazine or First for Women?"


def parser(description: str, *, question: bool = False) -> argparse.ArgumentParser:
    """Flags shared by the examples; `question=True` adds an optional positional question."""
    p = argparse.ArgumentParser(description=description)
    if question:
        p.add_argument("question", nargs="?", default=DEFAULT_QUESTION)
    p.add_argument("--demo", action="store_true", help="run against scripted servers on 127.0.0.1 (offline)")
    p.add_argument("--agent-model", default="Qwen/Qwen3-4B")
    p.add_argument("--agent-base-url")
    p.add_argument("--env-model", default="gpt-4o-mini")
    p.add_argument("--env-base-url")
    p.add_argument("--max-turns", type=int, default=5)
    return p


@contextlib.contextmanager
def parts_from_args(args: argparse.Namespace):
    """Yield the (agent, environment) pair for the flags (or for a scripted demo server)."""
    with contextlib.ExitStack() as stack:
        if args.demo:
            server = stack.enter_context(
                ScriptedServer({"env": echo_environment(), "agent": scripted_agent(DEMO_AGENT)})
            )
            args.agent_model, args.agent_base_url = "agent", server.base_url
            args.env_model, args.env_base_url = "env", server.base_url
            # Said first, so that nobody takes the canned replies below for a model's work.
            print(DEMO_NOTICE.format(url=server.base_url), flush=True)
        agent = load_agent(AgentConfig(model=args.agent_model, base_url=args.agent_base_url))
        environment = EnvironmentClient(EnvironmentConfig(model=args.env_model, base_url=args.env_base_url))
        yield agent, environment


@contextlib.contextmanager
def loop_from_args(args: argparse.Namespace):
    """Yield a compiled Prompt-R1 graph for the flags (or for a scripted demo server)."""
    with parts_from_args(args) as (agent, environment):
        yield build_graph(agent, environment, loop=LoopConfig(max_turns=args.max_turns))
