"""`prompt-r1 train` and `prompt-r1 merge`: GRPO from a recipe, and a LoRA adapter merged into its base model."""

from __future__ import annotations

import argparse
import sys

from prompt_r1.agents.model_source import check_model_source
from prompt_r1.cli.flags import (
    EXIT_OK,
    EXIT_SPEND_CAP,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    _Failure,
    check_rate_store,
    check_reachable,
)
from prompt_r1.core import signals
from prompt_r1.core.errors import ConfigError
from prompt_r1.training.shared.checks import check_training_config

__all__ = ["add_train_parsers", "cmd_merge", "cmd_train", "train_parser"]

# A run stopped by max_env_cost or max_env_calls (with a checkpoint, or at one), resumable with a higher cap.


def add_train_parsers(sub: argparse._SubParsersAction) -> None:
    sub.add_parser(
        "train",
        add_help=False,
        help="GRPO-train the agent from a recipe: prompt-r1 train --config training/configs/RECIPE.yaml "
        "[--FIELD VALUE ...] (prompt-r1 train --help lists every field)",
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


def train_parser():
    """`prompt-r1 train`'s parser: TRL's, over the recipe's fields (PromptR1GRPOConfig) and --resume."""
    from dataclasses import dataclass, field

    from trl import TrlParser

    from prompt_r1.core.checks import flag_number
    from prompt_r1.training.shared.checks import RANGES, check_number_field
    from prompt_r1.training.shared.config import PromptR1GRPOConfig

    numeric: set[str] = set()

    @dataclass
    class TrainFlags:
        resume: bool = field(
            default=False, metadata={"help": "Continue from the last checkpoint-* folder in output_dir."}
        )

    class Parser(TrlParser):
        def set_defaults_with_config(self, **kwargs):
            if "async" in kwargs:  # `async: true` in a recipe (a Python keyword, so the field is async_grpo)
                kwargs["async_grpo"] = kwargs.pop("async")
            for name in numeric & set(kwargs):  # a recipe's numbers, which argparse never sees
                check_number_field(name, kwargs[name])
            return super().set_defaults_with_config(**kwargs)

        def error(self, message: str):
            # As every other command: the one line that matters and where to read the usage, not 200 lines of it.
            self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    parser = Parser([PromptR1GRPOConfig, TrainFlags], prog="prompt-r1 train")
    for name in (
        "reproducible_rollouts",
        "call_ledger",
    ):  # unset by default (on for the sync trainer): no --no_* made
        dashed = name.replace("_", "-")
        parser.add_argument(f"--no_{name}", f"--no-{dashed}", action="store_const", const=False, dest=name,
                            help=f"Same as --{name} false.")  # fmt: skip
    # Every number flag by prompt_r1.core.checks, as the other commands' flags: argparse's plain int and float
    # take nan, inf and 1e400, on which TRL's and transformers' own checks fail with a traceback.
    for action in parser._actions:
        if action.type in (int, float):
            numeric.add(action.dest)
            bounds = {k: v for k, v in RANGES.get(action.dest, {}).items() if k != "integer"}
            action.type = flag_number(integer=action.type is int, **bounds)
    return parser


def cmd_train(argv: list[str]) -> int:
    """Everything after `train` goes to TRL's parser: a recipe (--config) whose fields flags override."""
    import yaml

    from prompt_r1.clients.environment import OPENAI_BASE_URL
    from prompt_r1.training.run import train
    from prompt_r1.training.shared.trainer_keys import check_trainer_keys

    parser = train_parser()
    try:
        config, flags = parser.parse_args_and_config(argv)
    except SystemExit as exc:  # --help (0), or a bad flag: its one line is printed (Parser.error), 2
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except (ValueError, OSError, yaml.YAMLError) as exc:  # GRPOConfig's own checks, an unreadable recipe
        raise ConfigError(str(exc).strip()) from None
    # The cheapest checks first, and all of them before any model loads: the whole config, the model's folder or
    # hub id, then the environment's socket.
    check_training_config(config)
    check_trainer_keys(config)  # a key the chosen trainer (sync or --async) does not support
    try:
        check_model_source(config.model_name_or_path, "model_name_or_path")
    except ConfigError as exc:
        raise _Failure(str(exc), EXIT_UNREACHABLE) from None
    check_reachable(config.env_base_url or OPENAI_BASE_URL, "environment", "--env-base-url")
    check_rate_store(config.env_rate_store)
    if config.async_grpo and config.vllm_server_base_url:  # the async trainer's agent: unreachable is exit 3
        check_reachable(config.vllm_server_base_url, "vLLM server", "--vllm_server_base_url")
    from prompt_r1.training.shared.graceful_stop import graceful_stop_of
    from prompt_r1.training.shared.spend import SpendCapReached, stop_reason

    build = None
    if config.async_grpo:  # TRL's AsyncGRPOTrainer, the loop as its rollout worker
        from prompt_r1.training.asynchronous.trainer import build_async_trainer as build
    try:
        trainer = train(config, resume=flags.resume, build=build)
    except SpendCapReached as exc:
        raise _Failure(f"stopped by the spend cap, {exc}", EXIT_SPEND_CAP) from None
    stopped = stop_reason(trainer)
    interrupted = graceful_stop_of(trainer)
    if interrupted is not None:
        if trainer.accelerator.is_main_process:
            saved = f"saved {interrupted.checkpoint}; resume with --resume"
            if interrupted.checkpoint is None:
                saved = "no checkpoint was written"
            print(f"prompt-r1: stopped by {interrupted.signal} after step {interrupted.step}; {saved}",
                  file=sys.stderr)  # fmt: skip
        _leave_process_group(trainer)
        return signals.exit_code(interrupted.signal)
    if trainer.accelerator.is_main_process:
        steps = trainer.state.global_step
        print(
            f"trained {steps} step{'' if steps == 1 else 's'}; saved to {config.output_dir}", file=sys.stderr
        )
        if stopped:
            print(f"prompt-r1: stopped by the spend cap: {stopped}; resume with --resume and a higher cap",
                  file=sys.stderr)  # fmt: skip
    _leave_process_group(trainer)
    return EXIT_SPEND_CAP if stopped else EXIT_OK


def _leave_process_group(trainer) -> None:
    """Under accelerate launch, leave the process group before exiting: a gloo group still alive at interpreter
    exit can abort a rank ("terminate called without an active exception") after the run succeeded."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        trainer.accelerator.wait_for_everyone()
        dist.destroy_process_group()


def cmd_merge(args: argparse.Namespace) -> int:
    from prompt_r1.training.shared.lora import merge_adapter

    out = merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype)
    print(f"merged model saved to {out}", file=sys.stderr)
    return EXIT_OK
