"""`--dry-run` of `batch`, `eval` and `train`: the flags, and each command's estimate (prompt_r1.runs.estimate),
printed instead of running. Nothing is sent, no model is loaded, no file is written (docs/cost.md).

Expected calls come from earlier episodes when there are any (the rows already in the results file or eval folder,
or `--expect-from FILE`), else from `--expect-turns N`, else from the stated assumption
(`prompt_r1.runs.estimate.ASSUMED_CALLS`); the at-most figures come from max_turns alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prompt_r1.cli.records import peek_run_cache
from prompt_r1.core.checks import flag_number
from prompt_r1.core.errors import ConfigError
from prompt_r1.runs.estimate import EpisodeShape, Estimate, TokenCounter
from prompt_r1.runs.estimate_report import render_estimate

__all__ = [
    "add_dry_run_flags",
    "batch_dry_run",
    "eval_dry_run",
    "print_estimate",
    "shape_for",
    "train_dry_run",
]

FAILED = {"environment_error", "agent_error", "internal_error"}


def add_dry_run_flags(parser: argparse.ArgumentParser) -> None:
    """--dry-run, --expect-turns and --expect-from (`batch` and `eval`; `train` has them as config-free flags)."""
    group = parser.add_argument_group("dry run (what the run will cost; nothing sent, no model loaded)")
    group.add_argument(
        "--dry-run",
        nargs="?",
        const="text",
        choices=["text", "json"],
        help="print the run's episodes, calls, tokens, dollars, the time the limits impose and where --budget "
        "stops it, then exit without running (--dry-run json: the same as JSON)",
    )
    group.add_argument(
        "--expect-turns",
        type=flag_number(minimum=0),
        metavar="X",
        help="the dry run's expected environment calls per episode (default: the mean of earlier episodes, "
        "else 2)",
    )
    group.add_argument(
        "--expect-from",
        metavar="FILE",
        help="the dry run's episode shape from this earlier results file (batch's results or eval's "
        "predictions.jsonl): mean calls, turn and reply lengths, characters per token",
    )


def _rows(path: Path) -> list[dict[str, Any]]:
    from prompt_r1.data.datasets import jsonl_rows

    if not path.exists():
        return []
    return [row for _, row in jsonl_rows(path, allow_cut_last_line=True)]


def shape_for(
    loop: Any,
    *,
    expect_from: str | None,
    expect_turns: float | None,
    earlier: list[dict[str, Any]],
    agent_max_tokens: int,
    env_max_tokens: int | None,
    where: str,
) -> EpisodeShape:
    """The episode shape: `expect_from`'s rows, else `earlier` (the run's own finished rows), else assumed."""
    options = dict(
        agent_max_tokens=agent_max_tokens, env_max_tokens=env_max_tokens, expect_turns=expect_turns
    )
    if expect_from is not None:
        path = Path(expect_from)
        if not path.is_file():
            raise ConfigError(
                f"--expect-from {path}: " + ("it is a folder" if path.is_dir() else "no such file")
            )
        shape = EpisodeShape.from_rows(_rows(path), loop, where=f"episodes in {path}", **options)
        if shape is None:
            raise ConfigError(f"--expect-from {path} holds no finished episode with turns to learn from")
        return shape
    shape = EpisodeShape.from_rows(earlier, loop, where=where, **options) if earlier else None
    return shape or EpisodeShape.assumed(loop, **options)


def _counter(agent_cfg: Any, shape: EpisodeShape) -> TokenCounter:
    """Characters per token from the shape; the agent's tokenizer when it is a local folder (no weights read)."""
    name = getattr(agent_cfg, "tokenizer", None) or getattr(agent_cfg, "model", None)
    tokenizer = None
    if name and Path(str(name)).is_dir():
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(name), local_files_only=True)
        except Exception:  # no tokenizer there: the characters rule counts the first prompt too
            tokenizer = None
    return TokenCounter(chars_per_token=shape.chars_per_token, tokenizer=tokenizer)


def _holding(cache: Any) -> str:
    size = cache.size()
    return f"holds {size:,} replies" if size is not None else "is a Redis store"


def _baseline_hits(cache: Any, config: Any, requests: list[str], prices: Any) -> tuple[int, float | None]:
    """How many of these single-call requests (env-only's, env-cot's) `cache` holds, and the dollars their
    stored usage would cost (None: a model without a price)."""
    from prompt_r1.clients.environment import OPENAI_BASE_URL, environment_messages
    from prompt_r1.clients.response_cache import request_key, sampling_of
    from prompt_r1.core.defaults import is_local_model_name, local_endpoint

    # The key the client makes (EnvironmentClient.ainvoke): its endpoint and model, its config's sampling.
    sampling = sampling_of(config)
    endpoint = (
        local_endpoint(config.model)
        if is_local_model_name(config.model)
        else config.base_url or OPENAI_BASE_URL
    )
    hits, saved = 0, 0.0
    for request in requests:
        reply = cache.holds(request_key(endpoint, config.model, environment_messages(request), sampling))
        if reply is None:
            continue
        hits += 1
        cost = prices.cost(str(reply.get("model") or ""), int(reply.get("input_tokens") or 0),
                           int(reply.get("output_tokens") or 0))  # fmt: skip
        saved = None if cost is None or saved is None else saved + cost
    return hits, saved


def _refuse_as_the_run_does(
    args: argparse.Namespace, prices: Any, env_configs: list[Any], agent_cfg: Any
) -> None:
    """What the real run refuses before it sends anything, refused here too: an estimate of a run that would not
    start is no estimate (docs/cost.md: flags and files are checked as for the real run)."""
    from prompt_r1.runs.metering import check_budget_prices

    if args.ray is not None and args.env_cache:  # as cli/batch.py's and cli/eval.py's --ray checks
        raise ConfigError(
            "--env-cache is not supported with --ray yet: run without --ray to replay from a cache"
        )
    if args.budget is not None:  # an unpriced paid model: the run exits 2 rather than spend without a cap
        for env_cfg in env_configs or [None]:
            check_budget_prices(prices, env_cfg, agent_cfg)


def _episodes_line(plan: Any, out: Path) -> str:
    """The episodes the run would start and skip, in the words of the run's own summary."""
    return (
        f"{len(plan.to_run):,} to run · {plan.already_done:,} already done in {out}"
        + (f" · {plan.duplicates:,} duplicate ids" if plan.duplicates else "")
        + (f" · {plan.conflicts:,} ids with a changed question (kept, not rerun)" if plan.conflicts else "")
    )


def print_estimate(estimate: Estimate, style: str) -> int:
    if style == "json":  # strict JSON: a figure beyond measure is null (Estimate.to_dict), never Infinity
        print(json.dumps(estimate.to_dict(), indent=2, allow_nan=False))
    else:
        print(render_estimate(estimate))
    return 0


def batch_dry_run(args: argparse.Namespace, settings: Any) -> int:
    """`batch --dry-run`: the input's rows not yet finished in --out, estimated."""
    from prompt_r1.cli.flags import configs_from_args
    from prompt_r1.clients.costs import PriceTable
    from prompt_r1.loop.protocols import protocol_for
    from prompt_r1.runs.batch import scan_input
    from prompt_r1.runs.batch_plan import plan_rows
    from prompt_r1.runs.estimate import episode_part

    if args.env_pool:
        raise ConfigError(
            "--dry-run does not estimate an --env-pool run yet: estimate each member's share alone"
        )
    agent_cfg, env_cfg, loop_cfg = configs_from_args(args)
    prices = PriceTable.load(args.prices)
    _refuse_as_the_run_does(args, prices, [env_cfg], agent_cfg)
    # The input as the run reads it first: no rows, or an id repeated with another question, refused alike.
    scan_input(settings.source, settings.limit, settings.shard)
    # Then the rows as the run's pool takes them: the first --limit, this shard's, each id once, those not done
    # in --out (read as the run reads it: a file it refuses is refused here in its words).
    plan = plan_rows(settings.source, settings.out, limit=settings.limit, shard=settings.shard,
                     checkpoint=settings.checkpoint)  # fmt: skip
    pending = plan.to_run
    earlier = _rows(settings.out)
    agent_max = loop_cfg.max_turn_tokens or agent_cfg.max_new_tokens
    shape = shape_for(
        loop_cfg, expect_from=args.expect_from, expect_turns=args.expect_turns, earlier=earlier,
        agent_max_tokens=agent_max, env_max_tokens=env_cfg.max_tokens, where=f"finished episodes in {settings.out}",
    )  # fmt: skip
    counter = _counter(agent_cfg, shape)
    protocol = protocol_for(loop_cfg)
    part = episode_part(
        f"{len(pending):,} episodes to run", [counter.first_prompt(protocol, s.question) for s in pending], shape,
        loop=loop_cfg, prices=prices, env_model=env_cfg.model, agent_model=agent_cfg.model,
        agent_paid=agent_cfg.resolved_backend == "served", counter=counter,
        system_prompt=protocol.environment_system_prompt,
    )  # fmt: skip
    cache = peek_run_cache(args, [env_cfg], protected=settings.own_files())
    estimate = Estimate(
        [part],
        environment=env_cfg,
        title="batch --dry-run",
        shape=shape,
        budget=("--budget", args.budget) if args.budget is not None else None,
        header=[("episodes", _episodes_line(plan, settings.out))],
        counts=plan.counts(),
    )
    if args.env_cache is not None:
        # A loop call's messages are the agent's turns, unknown before it runs: no key to look up.
        held = "does not exist yet (nothing to replay)" if cache is None else _holding(cache)
        estimate.header.append(("cache", f"--env-cache {args.env_cache} {held}; the loop's calls follow the "
                                "agent's turns, so the dry run does not look up which it would replay: the "
                                "figures are what the run pays without it"))  # fmt: skip
        if cache is not None:
            cache.close()
    return print_estimate(estimate, args.dry_run)


def eval_dry_run(args, methods, samples, sources, search, prices, agent_cfg, loop_cfg, folders) -> int:
    """`eval --dry-run`: every folder's (one per swept environment) rows still to run and searches not done."""
    from prompt_r1.evaluation.dry_run import baseline_request, eval_parts
    from prompt_r1.evaluation.harness import PREDICTIONS
    from prompt_r1.evaluation.optimizers.search import check_search_prices
    from prompt_r1.evaluation.plan import METHODS
    from prompt_r1.runs.estimate_report import format_usd

    env_configs = [cfg for _, cfg in folders if cfg is not None]
    _refuse_as_the_run_does(args, prices, env_configs, agent_cfg)
    if args.budget is not None:  # the optimiser model too, as the real run checks it
        for cfg in env_configs:
            check_search_prices(prices, methods, search, cfg)
    parts, shape, environment = [], None, None
    cache = peek_run_cache(args, env_configs)
    baseline, hits, saved = 0, 0, 0.0
    for folder, env_cfg in folders:
        earlier = _rows(Path(folder) / PREDICTIONS)
        done = {
            (str(r.get("method")), str(r.get("dataset")), str(r.get("id"))) for r in earlier if r.get("status") not in FAILED
        }  # fmt: skip
        pending = {m: [s for s in samples if (m, str(s.dataset), str(s.id)) not in done] for m in methods}
        agent_max = (loop_cfg.max_turn_tokens or agent_cfg.max_new_tokens) if agent_cfg is not None else 1024
        shape = shape_for(
            loop_cfg, expect_from=args.expect_from, expect_turns=args.expect_turns,
            earlier=[r for r in earlier if r.get("method") == "prompt-r1"], agent_max_tokens=agent_max,
            env_max_tokens=getattr(env_cfg, "max_tokens", None), where=f"finished prompt-r1 rows in {folder}",
        )  # fmt: skip
        counter = _counter(agent_cfg, shape)
        found = eval_parts(
            Path(folder), methods, pending, sources, samples, shape, loop=loop_cfg, prices=prices,
            env_model=getattr(env_cfg, "model", None), agent_model=getattr(agent_cfg, "model", None),
            agent_paid=getattr(agent_cfg, "resolved_backend", None) == "served",
            agent_max_tokens=getattr(agent_cfg, "max_new_tokens", 1024), search=search, counter=counter,
        )  # fmt: skip
        if cache is not None and env_cfg is not None:  # a baseline's one call is known: its key is looked up
            requests = [
                baseline_request(m, s) for m in methods if m in ("env-only", "env-cot") for s in pending[m]
            ]
            found_hits, found_saved = _baseline_hits(cache, env_cfg, requests, prices)
            baseline, hits = baseline + len(requests), hits + found_hits
            saved = None if found_saved is None or saved is None else saved + found_saved
        if len(folders) > 1:
            for part in found:
                part.label = f"{Path(folder).name}: {part.label}"
        parts += found
        environment = environment or env_cfg
    rows = sum(p.episodes for p in parts if p.kind == "rows")
    estimate = Estimate(
        parts,
        environment=environment,
        title="eval --dry-run",
        shape=shape
        if any(METHODS[m].needs_agent and METHODS[m].needs_environment for m in methods)
        else None,
        budget=("--budget", args.budget) if args.budget is not None else None,
        unit="row",
        units=rows,
        header=[
            ("rows", f"{rows:,} to run ({', '.join(methods)}) in {', '.join(str(f) for f, _ in folders)}")
        ],
    )
    if args.env_cache is not None:
        if cache is None:
            line = f"--env-cache {args.env_cache} does not exist yet (nothing to replay)"
        else:
            line = (
                f"--env-cache {args.env_cache} {_holding(cache)}: {hits:,} of the {baseline:,} env-only/env-cot "
                f"calls to run are in it ({hits:,} calls, {format_usd(saved)} saved)"
            )
            cache.close()
        estimate.header.append(("cache", line + "; the loop's and the searches' calls follow the agent's and "
                                "the optimiser's turns and are not looked up: the figures are without the cache"))  # fmt: skip
    if args.budget is not None and any(p.kind == "search" for p in parts):
        estimate.notes.append("--budget counts the searches' calls too: a search stops at it like the rows")
    return print_estimate(estimate, args.dry_run)


def train_dry_run(config: Any, *, style: str, expect_turns: float | None, expect_from: str | None) -> int:
    """`train --dry-run`: the recipe's steps and their environment calls, per step and for the whole run."""
    from prompt_r1.data.datasets import load_samples
    from prompt_r1.training.shared.dry_run import train_estimate

    questions = [
        s.question for s in load_samples(config.resolved_train_data(), limit=config.max_train_samples)
    ]
    loop = config.loop_config()
    shape = shape_for(
        loop, expect_from=expect_from, expect_turns=expect_turns, earlier=[], agent_max_tokens=config.max_turn_tokens,
        env_max_tokens=config.env_max_tokens, where="earlier episodes",
    )  # fmt: skip
    counter = _counter(type("Agent", (), {"model": config.model_name_or_path})(), shape)
    estimate = train_estimate(config, questions, shape, counter=counter)
    return print_estimate(estimate, style)
