"""`prompt-r1 eval`'s prompt-optimiser flags (`--method opro`, `gepa`, `textgrad`): the search budget, the
training rows, the optimiser model and the OPRO paper's knobs, and the `SearchSettings` they make.

    add_search_flags(parser)          # the "prompt optimisers" argument group
    settings = search_settings(args)  # prompt_r1.evaluation.optimizers.search.SearchSettings, checked

The searches themselves run in prompt_r1.evaluation.search_run (then the rows) and
prompt_r1.evaluation.optimizers.search.
"""

from __future__ import annotations

import argparse

from prompt_r1.core.checks import flag_number, number
from prompt_r1.core.errors import ConfigError
from prompt_r1.evaluation.optimizers.opro import OproSettings
from prompt_r1.evaluation.optimizers.search import SearchSettings

__all__ = ["add_search_flags", "search_settings"]

_COUNT = flag_number(integer=True, minimum=1)


def add_search_flags(parser: argparse.ArgumentParser) -> None:
    """The prompt optimisers' (`--method opro`, `gepa`, `textgrad`): their search budget, training rows and the OPRO
    paper's knobs."""
    group = parser.add_argument_group("prompt optimisers (--method opro, gepa, textgrad)")
    defaults = SearchSettings()
    group.add_argument("--optimizer-budget", type=_COUNT, default=defaults.budget, metavar="N",
                       help="metric calls per search: training rows answered under a candidate instruction "
                       f"(default: {defaults.budget})")  # fmt: skip
    group.add_argument("--optimizer-train-rows", type=_COUNT, default=defaults.train_rows, metavar="N",
                       help="training rows per search: the dataset's rows after the evaluated ones "
                       f"(default: {defaults.train_rows})")  # fmt: skip
    group.add_argument("--optimizer-train", metavar="FILE", help="training rows from this file instead")
    group.add_argument("--reflection-model", metavar="NAME",
                       help="the optimiser model, on the environment's endpoint (default: the environment model)")  # fmt: skip
    opro = defaults.opro
    group.add_argument("--opro-candidates", type=_COUNT, default=opro.candidates, metavar="N",
                       help=f"instructions sampled per step (default: {opro.candidates}, the paper's)")  # fmt: skip
    group.add_argument("--opro-steps", type=_COUNT, default=opro.steps, metavar="N",
                       help=f"most steps; the budget usually ends the search first (default: {opro.steps})")  # fmt: skip
    group.add_argument("--opro-keep", type=_COUNT, default=opro.keep, metavar="N",
                       help=f"best instructions shown in the meta-prompt (default: {opro.keep})")  # fmt: skip
    group.add_argument("--opro-temperature", type=flag_number(minimum=0, maximum=2), default=opro.temperature, metavar="X",
                       help=f"the optimiser model's sampling temperature, every optimiser's (default: {opro.temperature})")  # fmt: skip


def search_settings(args: argparse.Namespace) -> SearchSettings:
    """The searches' settings from the flags: each number checked (`core.checks.number`), and a budget that can
    score the first instruction on every training row."""
    for flag in ("optimizer_budget", "optimizer_train_rows", "opro_candidates", "opro_steps", "opro_keep"):
        number(getattr(args, flag), f"--{flag.replace('_', '-')}", integer=True, minimum=1)
    number(args.opro_temperature, "--opro-temperature", minimum=0, maximum=2)
    if args.optimizer_budget < args.optimizer_train_rows:  # the first instruction is scored on every row
        raise ConfigError(
            f"--optimizer-budget {args.optimizer_budget} cannot score one instruction on "
            f"--optimizer-train-rows {args.optimizer_train_rows}: give a budget of at least the training rows"
        )
    return SearchSettings(
        budget=args.optimizer_budget,
        train_rows=args.optimizer_train_rows,
        reflection_model=args.reflection_model,
        train_file=args.optimizer_train,
        opro=OproSettings(
            candidates=args.opro_candidates,
            steps=args.opro_steps,
            keep=args.opro_keep,
            temperature=args.opro_temperature,
        ),  # fmt: skip
    )
