"""`prompt-r1 train` and `prompt-r1 merge`: GRPO from a recipe, and a LoRA adapter merged into its base model."""

from __future__ import annotations

import argparse
import sys

from prompt_r1.agents.model_source import check_model_source
from prompt_r1.cli.flags import (
    EXIT_OK,
    EXIT_SPEND_CAP,
    EXIT_UNREACHABLE,
    _Failure,
    check_rate_store,
    check_reachable,
)
from prompt_r1.core import signals
from prompt_r1.core.errors import ConfigError
from prompt_r1.training.checks import check_training_config

__all__ = ["add_train_parsers", "cmd_merge", "cmd_train"]

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


def cmd_train(argv: list[str]) -> int:
    """Everything after `train` goes to TRL's parser: a recipe (--config) whose fields flags override."""
    from dataclasses import dataclass, field

    import yaml
    from trl import TrlParser

    from prompt_r1.clients.environment import OPENAI_BASE_URL
    from prompt_r1.training.config import PromptR1GRPOConfig
    from prompt_r1.training.trainer import train
    from prompt_r1.training.trainer_keys import check_trainer_keys

    @dataclass
    class TrainFlags:
        resume: bool = field(
            default=False, metadata={"help": "Continue from the last checkpoint-* folder in output_dir."}
        )

    class Parser(TrlParser):
        def set_defaults_with_config(self, **kwargs):
            if "async" in kwargs:  # `async: true` in a recipe (a Python keyword, so the field is async_grpo)
                kwargs["async_grpo"] = kwargs.pop("async")
            return super().set_defaults_with_config(**kwargs)

    parser = Parser([PromptR1GRPOConfig, TrainFlags], prog="prompt-r1 train")
    for name in (
        "reproducible_rollouts",
        "call_ledger",
    ):  # unset by default (on for the sync trainer): no --no_* made
        dashed = name.replace("_", "-")
        parser.add_argument(f"--no_{name}", f"--no-{dashed}", action="store_const", const=False, dest=name,
                            help=f"Same as --{name} false.")  # fmt: skip
    try:
        config, flags = parser.parse_args_and_config(argv)
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
    from prompt_r1.training.graceful_stop import graceful_stop_of
    from prompt_r1.training.spend import SpendCapReached, stop_reason

    build = None
    if config.async_grpo:  # TRL's AsyncGRPOTrainer, the loop as its rollout worker
        from prompt_r1.training.async_trainer import build_async_trainer as build
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
    from prompt_r1.training.trainer import merge_adapter

    out = merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype)
    print(f"merged model saved to {out}", file=sys.stderr)
    return EXIT_OK
