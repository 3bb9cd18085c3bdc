"""`prompt-r1 train --task NAME`: a built-in training task end to end, no recipe, model or environment of yours.

    prompt-r1 train --task door-codes [--max_steps N] [--output_dir DIR] [--seed S]

The task builds its tiny agent, starts its scripted environment on 127.0.0.1 and trains with the learning
benchmark's GRPO settings (`prompt_r1.tasks.door_run`); only the steps, the folder and the seed are yours, so
any other flag is refused in one line (exit 2): a recipe's fields belong to `prompt-r1 train --config`.
"""

from __future__ import annotations

import argparse

from prompt_r1.cli.flags import EXIT_OK, EXIT_USAGE
from prompt_r1.core.checks import flag_number
from prompt_r1.core.errors import ConfigError

__all__ = ["asks_for_task", "cmd_train_task", "task_parser"]


def asks_for_task(argv: list[str]) -> bool:
    """Whether `prompt-r1 train`'s arguments ask for a built-in task (`--task NAME` or `--task=NAME`)."""
    return any(arg == "--task" or arg.startswith("--task=") for arg in argv)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # As every other command: the one line that matters and where to read the usage, exit 2.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def task_parser() -> argparse.ArgumentParser:
    from prompt_r1.tasks.door_run import DEFAULT_OUTPUT, DEFAULT_STEPS, TASKS, WINDOW

    parser = _Parser(
        prog="prompt-r1 train --task",
        description="Train a tiny agent on a built-in task, offline on CPU: the agent is built here, the "
        "environment is a scripted server on 127.0.0.1. door-codes: only the environment knows each door's "
        "code, so the reward rises as the agent learns to ask it (about five minutes on 2 cores).",
    )
    parser.add_argument("--task", required=True, choices=TASKS, help="the task")
    parser.add_argument(
        "--max_steps",
        "--max-steps",
        type=flag_number(integer=True, minimum=2 * WINDOW),
        default=DEFAULT_STEPS,
        help=f"GRPO steps (default: %(default)s; at least {2 * WINDOW}: the first and last {WINDOW} are compared)",
    )
    parser.add_argument(
        "--output_dir",
        "--output-dir",
        default=DEFAULT_OUTPUT,
        help="where the agent, the trained model and curves.png go (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=flag_number(integer=True, minimum=0),
        default=0,
        help="the agent's build, the environment's tables and the trainer (default: %(default)s)",
    )
    return parser


def cmd_train_task(argv: list[str]) -> int:
    parser = task_parser()
    try:
        args, rest = parser.parse_known_args(argv)
    except SystemExit as exc:  # --help (0), or a bad flag: its one line is printed (_Parser.error), 2
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if rest:
        # The task's GRPO settings are the learning benchmark's; a recipe's flag here would be silently dropped.
        raise ConfigError(
            f"--task {args.task} takes only --max_steps, --output_dir and --seed, not {' '.join(rest)} (its GRPO "
            "settings are the learning benchmark's; train with your own through prompt-r1 train --config)"
        )
    from prompt_r1.tasks.door_run import run_door_task

    run_door_task(args.output_dir, max_steps=args.max_steps, seed=args.seed)
    return EXIT_OK
