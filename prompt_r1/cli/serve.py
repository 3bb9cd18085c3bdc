"""`prompt-r1 serve`: the command around `prompt_r1.integrations.server` (flags, key, start-up checks, stopping);
`prompt-r1 serve-model`: one local model as an OpenAI-compatible chat endpoint (prompt_r1.agents.model_server)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from prompt_r1.cli.flags import EXIT_OK, add_deprecated_alias, build_players, configs_from_args
from prompt_r1.core import signals
from prompt_r1.core.checks import flag_number, number
from prompt_r1.core.errors import ConfigError

__all__ = ["add_serve_model_parser", "add_serve_parser", "cmd_serve", "cmd_serve_model"]


def _add_listen_flags(parser: argparse.ArgumentParser, port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=flag_number(integer=True, minimum=0, maximum=65535),
        default=port,
        help=f"port to listen on (default: {port}; 0: any free port)",
    )


def add_serve_parser(sub: argparse._SubParsersAction, add_run_flags) -> None:
    sv = sub.add_parser(
        "serve",
        help="serve the loop as an OpenAI-compatible model: /v1/chat/completions (streamed or not), /v1/models",
        description="Each chat completion runs one episode on the last user message. The agent and the "
        "environment client (with its rate limit) are shared by every request. Ctrl-C or SIGTERM stops taking "
        "requests and lets those in flight finish (exit 0); a second signal ends them at once, each with an "
        "error response (exit 143 for SIGTERM, 130 for SIGINT).",
    )
    _add_listen_flags(sv, 8000)
    sv.add_argument("--served-model-name", default="prompt-r1", metavar="NAME", help="model name clients use")
    sv.add_argument(
        "--concurrency",
        type=flag_number(integer=True, minimum=1),
        default=32,
        metavar="N",
        help="episodes running at once (default: 32)",
    )
    # Its name until it took batch's and eval's name for the same cap.
    add_deprecated_alias(sv, "--max-concurrency", "--concurrency")
    sv.add_argument(
        "--max-queue",
        type=flag_number(integer=True, minimum=0),
        default=256,
        metavar="N",
        help="requests waiting for a slot before the server answers 429 (default: 256)",
    )
    sv.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="require `Authorization: Bearer <key>` with the key held in environment variable VAR",
    )
    sv.add_argument(
        "--keepalive",
        type=flag_number(minimum=0),
        default=15.0,
        metavar="SECONDS",
        help="in a streamed response, send an SSE comment line after this long without an event, so proxies do "
        "not cut the idle connection (default: 15; 0: never)",
    )
    add_run_flags(sv)


def cmd_serve(args: argparse.Namespace) -> int:
    from prompt_r1.integrations.server import SHUTDOWN_TIMEOUT, build_app, serve

    # Parsed by prompt_r1.core.checks already; checked again for callers that build the namespace themselves.
    number(args.concurrency, "--concurrency", integer=True, minimum=1)
    number(args.max_queue, "--max-queue", integer=True, minimum=0)
    number(args.port, "--port", integer=True, minimum=0, maximum=65535)
    number(args.keepalive, "--keepalive", minimum=0)
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ConfigError(
                f"--api-key-env {args.api_key_env}: that environment variable is empty or unset"
            )
    agent_cfg, env_cfg, loop_cfg = configs_from_args(args)
    agent, environment = build_players(agent_cfg, env_cfg)
    app = build_app(
        agent,
        environment,
        loop=loop_cfg,
        model_name=args.served_model_name,
        max_concurrency=args.concurrency,
        max_queue=args.max_queue,
        api_key=api_key,
        keepalive=args.keepalive,
    )

    def ready(url: str) -> None:
        print(f"prompt-r1: serving {args.served_model_name} on {url}", flush=True)

    def stopping(name: str, in_flight: int) -> None:
        print(f"prompt-r1: {name}: no new requests; finishing the {in_flight} in flight (up to "
              f"{SHUTDOWN_TIMEOUT:.0f} s; {name} again to stop at once)", file=sys.stderr, flush=True)  # fmt: skip

    aborted: list[str] = []

    def aborting(name: str, ended: int) -> None:
        aborted.append(name)
        print(f"prompt-r1: {name} again: stopping at once; the {ended} request(s) in flight get an error response",
              file=sys.stderr, flush=True)  # fmt: skip

    try:
        name = asyncio.run(
            serve(app, args.host, args.port, ready=ready, stopping=stopping, aborting=aborting)
        )
    except OSError as exc:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    print(f"prompt-r1: {name}: stopped", file=sys.stderr)
    # Drained: a clean stop (0). Stopped at once: requests were cut short, so the signal's own code (143/130).
    return signals.exit_code(aborted[-1]) if aborted else EXIT_OK


def add_serve_model_parser(sub: argparse._SubParsersAction) -> None:
    sm = sub.add_parser(
        "serve-model",
        help="serve one local model (a built-in one, e.g. smollm2-135m, or a model folder) as an OpenAI-compatible "
        "chat endpoint, e.g. as the environment of other runs",
        description="Requests that arrive together are answered by one batched generate call. Ctrl-C or SIGTERM "
        "stops it. Point runs at it with --env-base-url URL --env-model NAME.",
    )
    sm.add_argument(
        "model", help="a built-in model (smollm2-135m), a .gguf file, or a model folder or hub id"
    )
    _add_listen_flags(sm, 8001)
    sm.add_argument("--served-model-name", metavar="NAME", help="model name clients use (default: MODEL)")
    sm.add_argument(
        "--temperature",
        type=flag_number(minimum=0, maximum=2),
        default=0.7,
        metavar="X",
        help="sampling temperature of requests that name none (default: 0.7)",
    )
    sm.add_argument("--seed", type=flag_number(integer=True, minimum=0), metavar="N", help="sampling seed")
    sm.add_argument("--device", help="cpu or cuda (default: cpu)")
    sm.add_argument(
        "--generate-memory-mb",
        type=flag_number(integer=True, minimum=1),
        metavar="MIB",
        help="most memory (MiB) one batched generate call may hold for its cache and scores, as estimated; a "
        "larger batch runs as consecutive calls (default: 1024 on CPU, no bound on cuda)",
    )


def _check_port_free(host: str, port: int) -> None:
    """Refuse, in milliseconds and before the model loads, a port another process holds."""
    import socket

    if port == 0:
        return
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(
                socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
            )  # as the server binds: TIME_WAIT is free
            probe.bind((host, port))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def cmd_serve_model(args: argparse.Namespace) -> int:
    from prompt_r1.agents.model_server import build_model_app, load_served_model
    from prompt_r1.cli.flags import check_model
    from prompt_r1.integrations.server import serve

    _check_port_free(args.host, args.port)
    check_model(args.model, "model")
    server = load_served_model(args.model, name=args.served_model_name, temperature=args.temperature,
                               seed=args.seed, device=args.device,
                               generate_memory_mb=args.generate_memory_mb)  # fmt: skip

    def ready(url: str) -> None:
        print(f"prompt-r1: serving {server.name} on {url}", flush=True)

    try:
        name = asyncio.run(serve(build_model_app(server), args.host, args.port, ready=ready))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    print(f"prompt-r1: {name}: stopped", file=sys.stderr)
    return EXIT_OK
