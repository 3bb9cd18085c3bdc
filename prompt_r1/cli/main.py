"""The `prompt-r1` command.

    prompt-r1 run "QUESTION" [--agent-model M] [--agent-base-url URL] [--env-model M] [--env-base-url URL] ...
    prompt-r1 run "QUESTION" --config run.yaml --json
    prompt-r1 batch questions.jsonl --out results.jsonl [--concurrency N] [--checkpoint results.sqlite] [run flags]
    prompt-r1 serve --host 127.0.0.1 --port 8000 [--served-model-name N] [--concurrency N] [run flags]
    prompt-r1 serve-model smollm2-135m --port 8001      (one local model as an OpenAI-compatible chat endpoint)
    prompt-r1 eval --suite paper-main --method prompt-r1 --method env-only [--limit N] [--out DIR] [run flags]
    prompt-r1 score predictions.jsonl [--metric em --metric f1] [--out DIR]

Flags come from the config dataclasses (prompt_r1/core/config.py): every AgentConfig field is `--agent-<name>`, every
EnvironmentConfig field `--env-<name>`, every LoopConfig field `--<name>`. Precedence: defaults < --config file <
flags. Problems the user can fix (bad flags, missing keys, unreachable endpoints, models that cannot load) end
with one line on stderr and a non-zero exit, never a traceback.

Exit codes: 0 the episode ran (whatever its status except environment_error), or every evaluation or batch row
finished, or serve stopped after draining its requests, 1 environment_error, an agent failure, or rows that failed
or were not run (a rerun retries them), 2 bad usage, settings or data, 3 an endpoint or model that cannot be
reached, 4 training stopped at its spend cap (with a checkpoint), 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM. Every command takes SIGTERM as it takes Ctrl-C
(prompt_r1/core/signals.py): it stops cleanly and says which signal stopped it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from prompt_r1.cli.flags import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandFailure,
    add_run_flags,
    build_players,
    configs_from_args,
)
from prompt_r1.core import redaction, signals
from prompt_r1.core.errors import AgentError, ConfigError, PromptR1Error

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """Bad usage is one line on stderr, as every other problem a user can fix: the flag and what it takes (a bad
    number is refused by prompt_r1.core.checks as it is parsed), then where to read the usage, which in full would
    bury the line that matters. Subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="prompt-r1",
        description="Prompt-R1: a small agent LLM prompts a large LLM over several turns, then answers.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="answer one question with the agent ⇄ environment loop")
    run.add_argument("question", help="the question to answer")
    run.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the readable turns"
    )
    run.add_argument(
        "--trajectory",
        action="store_true",
        help="with --json, add the token ids the agent read and wrote with the environment mask and log-probabilities",
    )
    add_run_flags(run)

    from prompt_r1.cli.batch import add_batch_parser
    from prompt_r1.cli.eval import add_eval_parsers
    from prompt_r1.cli.serve import add_serve_model_parser, add_serve_parser
    from prompt_r1.cli.train import add_train_parsers

    add_serve_parser(sub, add_run_flags)
    add_serve_model_parser(sub)
    add_eval_parsers(sub, add_run_flags)
    add_batch_parser(sub, add_run_flags)
    add_train_parsers(sub)
    return parser


async def _run_episode(runner, question: str, live: bool, out) -> dict:
    """Run one episode, printing each event (think, prompt, response, answer, end) as it happens; the episode as
    a row (question, answer, status, turns, usage, error, trajectory)."""
    import uuid

    from prompt_r1.core.events import format_event
    from prompt_r1.runs.episode import Episode

    async for item in runner.stream(question, id=f"run-{uuid.uuid4().hex}"):
        if isinstance(item, Episode):
            return item.to_row()
        if live:
            print(format_event(item), file=out, flush=True)
    raise AssertionError("an episode stream ends with its Episode")


def _summary(result: dict) -> str:
    usage = result.get("usage", {})
    return (
        f"[{result.get('status')} · {usage.get('env_calls', 0)} environment calls · agent tokens "
        f"{usage.get('agent_prompt_tokens', 0)} in / {usage.get('agent_completion_tokens', 0)} out · environment tokens "
        f"{usage.get('env_input_tokens', 0)} in / {usage.get('env_output_tokens', 0)} out · "
        f"{usage.get('env_retries', 0)} retries]"
    )


def _trajectory(agent: Any, result: dict) -> dict[str, Any]:
    """`--trajectory`: the token ids the agent read and wrote, with the environment mask, or why there are none."""
    trajectory = result.get("trajectory")
    if trajectory is None:
        reason = getattr(agent, "token_exact", None) or "the agent backend has no tokenizer"
        return {"trajectory": None, "trajectory_reason": reason}
    return {"trajectory": trajectory}


def _drift(agent: Any, result: dict, protocol: str = "paper") -> dict[str, Any]:
    """Whether re-rendering the episode with the agent's chat template changes its tokens (agents/vllm_server.py)."""
    from prompt_r1.loop.protocols import protocol_for

    # The check re-renders the episode with the agent's own chat template; a protocol with its own stream has none.
    if protocol_for(protocol).chat_template() is not None:
        return {
            "checked": False,
            "reason": f"the drift check renders the agent's own chat template, which protocol {protocol} does not use",
        }
    tokenizer = getattr(agent, "drift_tokenizer", None) or getattr(agent, "tokenizer", None)
    if tokenizer is None:
        return {"checked": False, "reason": "no tokenizer for the agent (--agent-tokenizer)"}
    if not result.get("turns"):
        return {"checked": False, "reason": "the episode has no turns"}
    from prompt_r1.agents.vllm_server import rendering_drift

    try:
        return {"checked": True, **rendering_drift(tokenizer, result)}
    except (
        Exception
    ) as exc:  # a template that cannot render this conversation: the episode's output still stands
        reason = f"the chat template could not re-render it ({type(exc).__name__}: {exc})"
        return {"checked": False, "reason": reason}


def cmd_run(args: argparse.Namespace) -> int:
    from prompt_r1.runs.episode import EpisodeRunner

    if not args.question.strip():
        raise ConfigError("the question is empty")
    if args.trajectory and not args.json:
        raise ConfigError("--trajectory adds to the JSON output: give --json too")
    from prompt_r1.core.text import valid

    if not valid(args.question):  # undecodable bytes on the command line arrive as lone surrogates
        raise ConfigError("the question is not valid UTF-8 text")
    agent_cfg, env_cfg, loop_cfg = configs_from_args(args)
    agent, environment = build_players(agent_cfg, env_cfg)
    runner = EpisodeRunner(agent, environment, loop_cfg, tags=["run"])
    try:
        result = asyncio.run(_run_episode(runner, args.question, live=not args.json, out=sys.stdout))
    except AgentError as exc:
        raise CommandFailure(f"agent failed: {exc}", EXIT_FAILED) from exc
    drift = _drift(agent, result, loop_cfg.protocol)
    if drift.get("differs") and getattr(agent, "tokenizer", None) is None:
        print(
            "prompt-r1: warning: the served agent read a re-rendered conversation that differs from what it was "
            f"trained on (from token {drift['first_difference']}); serve it with vLLM and give --agent-tokenizer "
            "for token-exact turns",
            file=sys.stderr,
        )
    if args.json:
        payload = {k: result.get(k) for k in ("question", "answer", "status", "turns", "usage", "error")}
        payload["drift"] = drift
        if args.trajectory:
            payload.update(_trajectory(agent, result))
        print(redaction.dumps(payload))
    else:
        if result.get("answer") is not None:
            print(f"answer: {result['answer']}")
        print(_summary(result))
    if result.get("status") == "environment_error":
        print(f"prompt-r1: error: {result.get('error')}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    from prompt_r1.cli.serve import cmd_serve

    return cmd_serve(args)


def _cmd_serve_model(args: argparse.Namespace) -> int:
    from prompt_r1.cli.serve import cmd_serve_model

    return cmd_serve_model(args)


def _cmd_batch(args: argparse.Namespace) -> int:
    from prompt_r1.cli.batch import cmd_batch

    return cmd_batch(args)


def _cmd_batch_merge(args: argparse.Namespace) -> int:
    from prompt_r1.cli.batch import cmd_batch_merge

    return cmd_batch_merge(args)


def _cmd_eval(args: argparse.Namespace) -> int:
    from prompt_r1.cli.eval import cmd_eval

    return cmd_eval(args)


def _cmd_score(args: argparse.Namespace) -> int:
    from prompt_r1.cli.eval import cmd_score

    return cmd_score(args)


def _cmd_train(argv: list[str]) -> int:
    from prompt_r1.cli.train import cmd_train

    return cmd_train(argv)


def _cmd_merge(args: argparse.Namespace) -> int:
    from prompt_r1.cli.train import cmd_merge

    return cmd_merge(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if argv and argv[0] == "train":
        command, args = (lambda _: _cmd_train(argv[1:])), None
    else:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help (0), or a bad flag: its one line is printed (_Parser.error), 2
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        command = {
            "run": cmd_run,
            "batch": _cmd_batch,
            "batch-merge": _cmd_batch_merge,
            "serve": _cmd_serve,
            "serve-model": _cmd_serve_model,
            "eval": _cmd_eval,
            "score": _cmd_score,
            "merge": _cmd_merge,
        }[args.command]
    # Everything the command prints, a progress bar, a warning or a traceback included, passes through the
    # redaction of every API key the command's clients read (prompt_r1.core.redaction).
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = redaction.RedactedStream(stdout), redaction.RedactedStream(stderr)
    redaction.protect_logging()
    try:
        with signals.sigterm_as_sigint():
            return _run_command(command, args)
    finally:
        if "prompt_r1.agents.model_server" in sys.modules:  # a built-in environment served for this command
            sys.modules["prompt_r1.agents.model_server"].stop_shared_model_servers()
        sys.stdout.flush()
        sys.stdout, sys.stderr = stdout, stderr


def _run_command(command, args) -> int:
    try:
        return command(args)
    except CommandFailure as exc:
        print(f"prompt-r1: error: {exc}", file=sys.stderr)
        return exc.code
    except ConfigError as exc:
        print(f"prompt-r1: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PromptR1Error as exc:
        print(f"prompt-r1: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        name = signals.received()
        print(f"prompt-r1: interrupted ({name}); stopped", file=sys.stderr)
        return signals.exit_code(name)
    except OSError as exc:
        # A file problem nothing more specific caught (a full disk mid-run, a folder where a file was meant):
        # one line naming the file; the rows written so far stand.
        where = f" {exc.filename}" if exc.filename else ""
        print(f"prompt-r1: error: cannot use{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception:
        # A bug: its traceback is for the report, and goes out through the redacting stderr like everything else.
        import traceback

        traceback.print_exc(file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
