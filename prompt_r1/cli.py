"""The `prompt-r1` command.

    prompt-r1 run "QUESTION" [--agent-model M] [--agent-base-url URL] [--env-model M] [--env-base-url URL] ...
    prompt-r1 run "QUESTION" --config run.yaml --json

Flags come from the config dataclasses (prompt_r1/config.py): every AgentConfig field is `--agent-<name>`, every
EnvironmentConfig field `--env-<name>`, every LoopConfig field `--<name>`. Precedence: defaults < --config file <
flags. Problems the user can fix (bad flags, missing keys, unreachable endpoints, models that cannot load) end
with one line on stderr and a non-zero exit, never a traceback.

Exit codes: 0 the episode ran (whatever its status except environment_error), 1 environment_error or an agent
failure, 2 bad usage or settings, 3 an endpoint or model that cannot be reached, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import textwrap
from dataclasses import MISSING, fields
from typing import Any

from prompt_r1.config import AgentConfig, EnvironmentConfig, LoopConfig, load_config_file, unreachable_reason
from prompt_r1.errors import AgentError, ConfigError, PromptR1Error

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
_SECTIONS = (
    ("agent", AgentConfig, "agent-"),
    ("environment", EnvironmentConfig, "env-"),
    ("loop", LoopConfig, ""),
)


class _Failure(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _flag_type(type_name: str):
    if "bool" in type_name:
        return None
    if "int" in type_name:
        return int
    if "float" in type_name:
        return float
    return str


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The agent, environment and loop flags shared by every command that runs episodes."""
    parser.add_argument(
        "--config", help="YAML/JSON file with agent/environment/loop sections (flags override it)."
    )
    for section, cls, prefix in _SECTIONS:
        group = parser.add_argument_group(f"{section} settings")
        for f in fields(cls):
            default = f.default if f.default is not MISSING else None
            flag = "--" + prefix + f.name.replace("_", "-")
            help_text = f"{f.metadata.get('help', '')} (default: {default})"
            dest = f"{section}__{f.name}"
            kind = _flag_type(str(f.type))
            metavar = {
                int: "N",
                float: "X",
                str: "URL" if f.name == "base_url" else f.name.split("_")[-1].upper(),
            }.get(kind)
            if kind is None:
                group.add_argument(
                    flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text
                )
            else:
                group.add_argument(flag, dest=dest, type=kind, default=None, metavar=metavar, help=help_text)


def configs_from_args(args: argparse.Namespace) -> tuple[AgentConfig, EnvironmentConfig, LoopConfig]:
    values: dict[str, dict[str, Any]] = load_config_file(args.config) if args.config else {}
    built = []
    for section, cls, _ in _SECTIONS:
        merged = dict(values.get(section, {}))
        for f in fields(cls):
            flag_value = getattr(args, f"{section}__{f.name}", None)
            if flag_value is not None:
                merged[f.name] = flag_value
        try:
            built.append(cls(**merged))
        except TypeError as exc:
            raise ConfigError(f"bad {section} settings: {exc}") from exc
    return built[0], built[1], built[2]


def check_reachable(url: str, what: str, flag: str, timeout: float = 5.0) -> None:
    """Fail fast, with one line, when nothing listens at `url` (before loading models or paying for calls)."""
    reason = unreachable_reason(url, timeout)
    if reason is not None:
        raise _Failure(
            f"cannot reach the {what} at {url} ({reason}); start it or point {flag} at an OpenAI-compatible server",
            EXIT_UNREACHABLE,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prompt-r1",
        description="Prompt-R1: a small agent LLM prompts a large LLM over several turns, then answers.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="answer one question with the agent ⇄ environment loop")
    run.add_argument("question", help="the question to answer")
    run.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the readable turns"
    )
    add_run_flags(run)
    return parser


def _prepare(agent_cfg: AgentConfig, env_cfg: EnvironmentConfig):
    """Build the environment client and the agent, cheapest checks first (keys, sockets, then model loading)."""
    from prompt_r1.agents import load_agent
    from prompt_r1.environment import OPENAI_BASE_URL, EnvironmentClient

    environment = EnvironmentClient(env_cfg)  # raises MissingCredentials before anything expensive
    check_reachable(env_cfg.base_url or OPENAI_BASE_URL, "environment", "--env-base-url")
    if agent_cfg.resolved_backend == "served":
        check_reachable(agent_cfg.base_url, "served agent", "--agent-base-url")
    try:
        agent = load_agent(agent_cfg)
    except ConfigError as exc:
        raise _Failure(str(exc), EXIT_UNREACHABLE) from exc
    return agent, environment


def _show(text: str | None, label: str, out) -> None:
    if text is None:
        return
    body = textwrap.indent(text.strip(), " " * 12)[12:]
    print(f"  {label:<9} {body}", file=out)


def _print_turn(turn: dict, out) -> None:
    print(f"turn {turn['index'] + 1}", file=out)
    _show(turn.get("think"), "think:", out)
    _show(turn.get("prompt"), "prompt:", out)
    if turn.get("kind") == "malformed":
        _show("; ".join(turn.get("defects", [])), "defects:", out)
    _show(turn.get("response"), "response:", out)
    _show(turn.get("error"), "error:", out)
    out.flush()


async def _run_episode(graph, question: str, live: bool, out) -> dict:
    """Run one episode, printing each turn as soon as it is complete (its response arrived, or the episode ended)."""
    state: dict[str, Any] = {}
    printed = 0
    async for state in graph.astream({"question": question}, stream_mode="values"):
        if not live:
            continue
        turns = state.get("turns", [])
        done = len(turns) if state.get("status") else sum(1 for t in turns if t.get("response") is not None)
        for turn in turns[printed:done]:
            _print_turn(turn, out)
        printed = max(printed, done)
    return state


def _summary(result: dict) -> str:
    usage = result.get("usage", {})
    return (
        f"[{result.get('status')} · {usage.get('env_calls', 0)} environment calls · agent tokens "
        f"{usage.get('agent_prompt_tokens', 0)} in / {usage.get('agent_completion_tokens', 0)} out · environment tokens "
        f"{usage.get('env_input_tokens', 0)} in / {usage.get('env_output_tokens', 0)} out · "
        f"{usage.get('env_retries', 0)} retries]"
    )


def cmd_run(args: argparse.Namespace) -> int:
    from prompt_r1.graph import build_graph

    if not args.question.strip():
        raise ConfigError("the question is empty")
    agent_cfg, env_cfg, loop_cfg = configs_from_args(args)
    agent, environment = _prepare(agent_cfg, env_cfg)
    graph = build_graph(
        agent,
        environment,
        max_turns=loop_cfg.max_turns,
        force_final_answer=loop_cfg.force_final_answer,
        max_total_tokens=loop_cfg.max_total_tokens,
    )
    try:
        result = asyncio.run(_run_episode(graph, args.question, live=not args.json, out=sys.stdout))
    except AgentError as exc:
        raise _Failure(f"agent failed: {exc}", EXIT_FAILED) from exc
    if args.json:
        payload = {k: result.get(k) for k in ("question", "answer", "status", "turns", "usage", "error")}
        print(json.dumps(payload, ensure_ascii=False))
    else:
        if result.get("answer") is not None:
            print(f"answer: {result['answer']}")
        print(_summary(result))
    if result.get("status") == "environment_error":
        print(f"prompt-r1: error: {result.get('error')}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse itself exits 2 with a usage line on bad flags
    try:
        return {"run": cmd_run}[args.command](args)
    except _Failure as exc:
        print(f"prompt-r1: error: {exc}", file=sys.stderr)
        return exc.code
    except ConfigError as exc:
        print(f"prompt-r1: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PromptR1Error as exc:
        print(f"prompt-r1: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("prompt-r1: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
