"""`prompt-r1 train` and `prompt-r1 merge`: GRPO from a recipe, and a LoRA adapter merged into its base model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prompt_r1.cli.flags import (
    EXIT_OK,
    EXIT_SPEND_CAP,
    EXIT_USAGE,
    CommandFailure,
    check_model,
    check_rate_store,
    check_reachable,
)
from prompt_r1.core import signals
from prompt_r1.core.errors import ConfigError

__all__ = ["add_train_parsers", "cmd_merge", "cmd_train", "train_parser"]

# A run stopped by max_env_cost or max_env_calls (with a checkpoint, or at one), resumable with a higher cap.


def add_train_parsers(sub: argparse._SubParsersAction) -> None:
    sub.add_parser(
        "train",
        add_help=False,
        help="GRPO-train the agent from a recipe: prompt-r1 train --config training/configs/RECIPE.yaml "
        "[--FIELD VALUE ...] (prompt-r1 train --help lists every field); or a built-in task, offline: "
        "prompt-r1 train --task door-codes [--max_steps N] [--output_dir DIR]",
    )
    mg = sub.add_parser(
        "merge",
        help="merge a trained LoRA adapter into its base model and save a folder vllm serve and --agent-model load",
    )
    mg.add_argument(
        "adapter", help="the adapter folder (a training output_dir or checkpoint-N with use_peft)"
    )
    mg.add_argument("--out", required=True, metavar="DIR", help="where to save the merged model")
    mg.add_argument("--base", metavar="MODEL", help="base model (default: the one the adapter names)")
    mg.add_argument(
        "--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"], help="weights dtype"
    )


def train_parser(argv: list[str] | None = None):
    """`prompt-r1 train`'s parser: TRL's, over the fields of the config of the trainer `argv` asks for
    (`PromptR1AsyncGRPOConfig` with `--async` or `async: true` in its recipe, `PromptR1GRPOConfig` otherwise),
    --resume and --async."""
    from dataclasses import dataclass, field, fields

    from trl import TrlParser

    from prompt_r1.core.checks import flag_number
    from prompt_r1.training.shared.checks import RANGES
    from prompt_r1.training.shared.config import unknown_keys_message

    config_class = _config_class(argv or [])

    @dataclass
    class TrainFlags:
        resume: bool = field(
            default=False, metadata={"help": "Continue from the last checkpoint-* folder in output_dir."}
        )
        allow_changed_settings: bool = field(
            default=False,
            metadata={
                "help": "With --resume: go on although settings that change what is learned differ from those "
                "in output_dir/manifest.json (refused otherwise, naming each); the manifest records the change."
            },
        )
        task: str | None = field(
            default=None,
            metadata={
                "help": "Train on a built-in task instead of a recipe, offline: door-codes (a tiny agent built "
                "here, a scripted environment on 127.0.0.1; prompt-r1 train --task door-codes --help)."
            },
        )
        async_grpo: bool = field(
            default=False,
            metadata={
                "help": "Train with TRL's AsyncGRPOTrainer: episodes keep flowing from a vLLM server "
                "(vllm_server_base_url) while the trainer trains; its own settings (prompt-r1 train --async "
                "--help). Also --async, or async: true in a recipe.",
                "aliases": ["--async"],
            },
        )

        dry_run: bool = field(
            default=False,
            metadata={
                "help": "Print what the run will cost (generation steps, episodes, environment calls, tokens, "
                "dollars, the time the limits impose, where max_env_cost stops it) and exit: nothing sent, no "
                "model loaded (docs/cost.md)."
            },
        )
        expect_turns: float | None = field(
            default=None,
            metadata={"help": "The dry run's expected environment calls per episode (default: 2)."},
        )
        expect_from: str | None = field(
            default=None,
            metadata={
                "help": "The dry run's episode shape from an earlier results file (batch or eval rows)."
            },
        )

    known = {f.name for f in fields(config_class)} | {f.name for f in fields(TrainFlags)}
    recipe = _recipe_path(argv or [])

    class Parser(TrlParser):
        def set_defaults_with_config(self, **kwargs):
            if "async" in kwargs:  # `async: true` in a recipe (a Python keyword, so the field is async_grpo)
                kwargs["async_grpo"] = kwargs.pop("async")
            unknown = [key for key in kwargs if key not in known]
            if unknown:  # one line naming each, with what to do instead, not TRL's list of leftovers
                raise ConfigError(
                    unknown_keys_message(config_class.trainer_name, unknown, kwargs, config_class.why_not)
                )
            if recipe is not None and isinstance(kwargs.get("train_data"), str):
                kwargs["train_data"] = _from_recipe(kwargs["train_data"], recipe)
            return super().set_defaults_with_config(**kwargs)

        def parse_known_args(self, args=None, namespace=None):
            parsed, rest = super().parse_known_args(args, namespace)
            unknown = [a[2:].split("=", 1)[0].replace("-", "_") for a in rest if a.startswith("--")]
            if unknown:
                raise ConfigError(
                    unknown_keys_message(config_class.trainer_name, unknown, {}, config_class.why_not)
                )
            return parsed, rest

        def error(self, message: str):
            # As every other command: the one line that matters and where to read the usage, not 200 lines of it.
            self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    parser = Parser([config_class, TrainFlags], prog="prompt-r1 train")
    # Every number flag by prompt_r1.core.checks, as the other commands' flags: argparse's plain int and float
    # take nan, inf and 1e400, on which TRL's and transformers' own checks fail with a traceback.
    for action in parser._actions:
        if action.type in (int, float):
            bounds = {k: v for k, v in RANGES.get(action.dest, {}).items() if k != "integer"}
            action.type = flag_number(integer=action.type is int, **bounds)
    return parser


_ASYNC_FLAGS = ("--async", "--async_grpo", "--async-grpo")


def _recipe_path(argv: list[str]) -> Path | None:
    """The recipe `argv` names (`--config FILE` or `--config=FILE`), or None."""
    for index, arg in enumerate(argv):
        if arg == "--config" and index + 1 < len(argv):
            return Path(argv[index + 1])
        if arg.startswith("--config="):
            return Path(arg.split("=", 1)[1])
    return None


def _from_recipe(train_data: str, recipe: Path) -> str:
    """A recipe's relative `train_data` as a path from the recipe's folder when a file is there; else as written,
    which `resolved_train_data` finds from the working folder or in the project (the shipped recipes write
    `training/data/...`, from the project folder). A flag's path stays relative to the working folder."""
    path = Path(train_data)
    beside = recipe.parent / path
    if path.is_absolute() or path.suffix == "" or not beside.is_file():
        return train_data
    return str(beside.resolve())


def _config_class(argv: list[str]) -> type:
    """The config class of the trainer `argv` asks for: its --async flag (`--async`, `--async false`,
    `--async=true`), else its recipe's `async` (or `async_grpo`) key, else the synchronous trainer's. Only that
    one is imported: the async trainer's config brings TRL's async trainer and vLLM (seconds a process)."""
    wanted: bool | None = None
    for index, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name in _ASYNC_FLAGS:
            if not value and index + 1 < len(argv) and not argv[index + 1].startswith("-"):
                value = argv[index + 1]
            wanted = not value or value.lower() in ("true", "1", "yes")
    if wanted is None and "--config" in argv and argv.index("--config") + 1 < len(argv):
        import yaml

        try:
            with open(argv[argv.index("--config") + 1]) as handle:
                recipe = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError):
            recipe = None  # TRL's parser reports it, as before
        if isinstance(recipe, dict):
            wanted = bool(recipe.get("async", recipe.get("async_grpo", False)))
    if wanted:
        from prompt_r1.training.asynchronous.config import PromptR1AsyncGRPOConfig

        return PromptR1AsyncGRPOConfig
    from prompt_r1.training.sync.config import PromptR1GRPOConfig

    return PromptR1GRPOConfig


def cmd_train(argv: list[str]) -> int:
    """Everything after `train` goes to TRL's parser: a recipe (--config) whose fields flags override; or, with
    --task, to the built-in task's own parser (`prompt_r1.cli.train_task`)."""
    import yaml

    from prompt_r1.cli.train_task import asks_for_task, cmd_train_task

    if asks_for_task(argv):
        return cmd_train_task(argv)

    from prompt_r1.clients.environment import OPENAI_BASE_URL
    from prompt_r1.training.run import leave_process_group, train
    from prompt_r1.training.shared.checks import check_train_data

    if any(a.split("=")[0] in ("--dry_run", "--dry-run") for a in argv):
        # A dry run plans a GPU recipe on any machine: precision changes nothing it counts, and TRL refuses bf16
        # where no GPU has it.
        argv = [*argv, "--bf16", "false", "--fp16", "false"]
    parser = train_parser(argv)
    try:
        config, flags = parser.parse_args_and_config(argv)  # the config checked itself as it was built
    except SystemExit as exc:  # --help (0), or a bad flag: its one line is printed (Parser.error), 2
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except (ValueError, OSError, yaml.YAMLError) as exc:  # TRL's own checks, an unreadable recipe
        raise ConfigError(str(exc).strip()) from None
    # The cheapest checks first, and all of them before any model loads: the training file, the model's folder or
    # hub id, then the environment's socket.
    check_train_data(config)
    if flags.dry_run:  # the estimate alone: nothing sent, loaded or written
        from prompt_r1.cli.dry_run import train_dry_run

        return train_dry_run(
            config, style="text", expect_turns=flags.expect_turns, expect_from=flags.expect_from
        )
    from prompt_r1.agents.builtin import is_builtin

    check_model(config.model_name_or_path, "model_name_or_path")
    if is_builtin(config.env_model) and not config.env_base_url:
        check_model(config.env_model, "env_model")
    if not (is_builtin(config.env_model) and not config.env_base_url):  # else the trainer serves it here
        check_reachable(config.env_base_url or OPENAI_BASE_URL, "environment", "--env-base-url")
    check_rate_store(config.env_rate_store)
    if config.async_grpo and config.vllm_server_base_url:  # the async trainer's agent: unreachable is exit 3
        check_reachable(config.vllm_server_base_url, "vLLM server", "--vllm_server_base_url")
    from prompt_r1.training.shared.graceful_stop import graceful_stop_of
    from prompt_r1.training.shared.spend import SpendCapReached, stop_reason

    try:
        trainer = train(config, resume=flags.resume, allow_changed_settings=flags.allow_changed_settings)
    except SpendCapReached as exc:
        raise CommandFailure(f"stopped by the spend cap, {exc}", EXIT_SPEND_CAP) from None
    stopped = stop_reason(trainer)
    interrupted = graceful_stop_of(trainer)
    if interrupted is not None:
        if trainer.accelerator.is_main_process:
            saved = f"saved {interrupted.checkpoint}; resume with --resume"
            if interrupted.checkpoint is None:
                saved = "no checkpoint was written"
            print(f"prompt-r1: stopped by {interrupted.signal} after step {interrupted.step}; {saved}",
                  file=sys.stderr)  # fmt: skip
        leave_process_group()
        return signals.exit_code(interrupted.signal)
    if trainer.accelerator.is_main_process:
        steps = trainer.state.global_step
        print(
            f"trained {steps} step{'' if steps == 1 else 's'}; saved to {config.output_dir}", file=sys.stderr
        )
        if stopped:
            print(f"prompt-r1: stopped by the spend cap: {stopped}; resume with --resume and a higher cap",
                  file=sys.stderr)  # fmt: skip
    leave_process_group()
    return EXIT_SPEND_CAP if stopped else EXIT_OK


def cmd_merge(args: argparse.Namespace) -> int:
    from prompt_r1.training.shared.lora import merge_adapter

    out = merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype)
    print(f"merged model saved to {out}", file=sys.stderr)
    return EXIT_OK
