"""`python -m prompt_r1.testing.servers`: the scripted OpenAI-compatible server on its own, so that any client (the
`openai` library, `prompt-r1 run`, a LangChain app, curl) can be pointed at it with no key, no model and no network.

    python -m prompt_r1.testing.servers --port 8011
    prompt-r1 run --agent-base-url http://127.0.0.1:8011/v1 --agent-model agent \\
        --env-base-url http://127.0.0.1:8011/v1 --env-model env "Who wrote Hamlet?"

It serves two models, played by the responders of prompt_r1.testing.scripted: an environment that echoes each prompt
(`--env NAME`, default "env"; "Response n: <prompt>", n counting the conversation's prompts), and an agent
(`--agent NAME`, default "agent") that asks the environment `--agent-prompts` times about its question and then
answers with the environment's last reply, or that writes the `--agent-turn` texts in order. `--latency` delays each
reply; `--fault KIND=RATE` answers that share of requests with a fault (the kinds of `servers.Fault`: 429, 500,
timeout, drop, ...). The first line printed is the base URL; it serves until Ctrl-C or SIGTERM and then exits 0. A
port that cannot be listened on is one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

from prompt_r1.core import signals
from prompt_r1.core.checks import flag_number
from prompt_r1.testing.scripted import echo_environment, relay_agent, scripted_agent

__all__ = ["main", "parser"]

EXIT_OK, EXIT_USAGE = 0, 2  # as `prompt-r1` (prompt_r1.cli.flags), which this layer may not import


def _fault_rate(kinds: Collection[str]) -> Callable[[str], tuple[str, float]]:
    """An argparse `type=` for KIND=RATE, KIND one of `kinds`, RATE in [0, 1]."""

    def convert(text: str) -> tuple[str, float]:
        kind, sep, rate = text.partition("=")
        if not sep or kind not in kinds:
            raise argparse.ArgumentTypeError(
                f"expected KIND=RATE with KIND one of {', '.join(sorted(kinds))}, got {text!r}"
            )
        return kind, flag_number(minimum=0, maximum=1)(rate)

    return convert


def parser(fault_kinds: Collection[str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m prompt_r1.testing.servers",
        description="A scripted OpenAI-compatible server on 127.0.0.1: an echoing environment and a scripted agent, "
        "for pointing any OpenAI client at (offline, no key). Serves until Ctrl-C.",
    )
    p.add_argument("--port", type=flag_number(integer=True, minimum=0, maximum=65535), default=0,
                   help="port to listen on (default: 0, any free port; the first line printed names it)")  # fmt: skip
    p.add_argument(
        "--env", default="env", metavar="NAME", help="model name of the echoing environment (default: env)"
    )
    p.add_argument("--echo-prefix", default="Response", metavar="TEXT",
                   help="the environment answers 'TEXT n: <prompt>' (default: Response)")  # fmt: skip
    p.add_argument(
        "--agent", default="agent", metavar="NAME", help="model name of the scripted agent (default: agent)"
    )
    turns = p.add_mutually_exclusive_group()
    turns.add_argument("--agent-prompts", type=flag_number(integer=True, minimum=0), default=2, metavar="N",
                       help="the agent prompts the environment N times, then answers with its last reply "
                       "(default: 2)")  # fmt: skip
    turns.add_argument("--agent-turn", action="append", metavar="TEXT",
                       help="the agent writes these turns in order, one per flag (the last one again past the end), "
                       "e.g. '<think>…</think><answer>…</answer>'")  # fmt: skip
    p.add_argument("--latency", type=flag_number(minimum=0), default=0.0, metavar="SECONDS",
                   help="delay before each reply (default: 0)")  # fmt: skip
    p.add_argument("--fault", type=_fault_rate(fault_kinds), action="append", default=[], metavar="KIND=RATE",
                   help="answer this share of requests with a fault of KIND (e.g. 429=0.2); repeatable")  # fmt: skip
    p.add_argument(
        "--seed", type=flag_number(integer=True), default=0, help="seed of the faults' draws (default: 0)"
    )
    return p


def main(
    server_class: Callable[..., Any], fault_kinds: Collection[str], argv: Sequence[str] | None = None
) -> int:
    """Run the command; `server_class` and `fault_kinds` are ScriptedServer and FAULT_KINDS, handed over by
    prompt_r1.testing.servers, which runs this (importing them here would make the two modules import each other,
    and would load servers a second time beside the `__main__` that `python -m` runs)."""
    p = parser(fault_kinds)
    args = p.parse_args(argv)
    if args.env == args.agent:
        p.error(f"--env and --agent name the same model ({args.env!r}); give them different names")
    rates = dict(args.fault)
    if sum(rates.values()) > 1:
        p.error(f"the --fault rates add up to more than 1: {rates}")
    if args.agent_turn:
        agent, says = (
            scripted_agent(args.agent_turn),
            f"writes the {len(args.agent_turn)} given turn(s) in order",
        )
    else:
        agent = relay_agent(args.agent_prompts)
        says = f"prompts the environment {args.agent_prompts} time(s), then answers with its last reply"
    server = server_class(
        {args.env: echo_environment(args.echo_prefix), args.agent: agent},
        port=args.port,
        latency=args.latency,
        fault_rates=rates,
        seed=args.seed,
        record=False,  # a server left running keeps no request
    )
    with signals.sigterm_as_sigint():
        try:
            try:
                server.start()
            except OSError as exc:  # aiohttp's own text repeats the address: the system's words say it once
                reason = os.strerror(exc.errno) if exc.errno else str(exc)
                print(f"error: cannot listen on 127.0.0.1:{args.port}: {reason}", file=sys.stderr)
                return EXIT_USAGE
            print(server.base_url, flush=True)  # first, alone on its line: what a script reads
            print(f"scripted OpenAI-compatible server; models: {args.env!r}, an environment that answers "
                  f"'{args.echo_prefix} n: <prompt>'; {args.agent!r}, an agent that {says}. Ctrl-C stops it.",
                  flush=True)  # fmt: skip
            threading.Event().wait()  # a signal's KeyboardInterrupt ends the wait
        except KeyboardInterrupt:
            print(f"scripted server: {signals.received()}: stopped", file=sys.stderr, flush=True)
        finally:
            server.stop()
    return EXIT_OK
