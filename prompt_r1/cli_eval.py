"""`prompt-r1 eval`: the command around `prompt_r1.evaluation.run_evaluation` (flags, plan, reports, exit code)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from prompt_r1.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, _prepare, configs_from_args
from prompt_r1.costs import PriceTable
from prompt_r1.data import load_samples, resolve_source
from prompt_r1.errors import ConfigError
from prompt_r1.evaluation import (
    METHODS,
    PREDICTIONS,
    read_predictions,
    record_settings,
    resolve_plan,
    run_evaluation,
)
from prompt_r1.reports import summarize, write_reports

__all__ = ["cmd_eval"]


def _samples(datasets: list[str], limit: int | None) -> list:
    samples, sources = [], {}
    for name in datasets:
        loaded = load_samples(name, limit=limit)
        label = loaded[0].dataset if loaded else name
        if label in sources:
            raise ConfigError(
                f"two datasets are both named {label!r} ({sources[label]} and {name}); rename a file"
            )
        sources[label] = name
        samples += loaded
    return samples


def cmd_eval(args: argparse.Namespace) -> int:
    """Check the plan and the folder first (nothing contacted or loaded before), then run, then report."""
    datasets, methods = resolve_plan(args.suite, args.dataset, args.method)
    out_dir = Path(args.out).resolve()
    for (
        name
    ) in datasets:  # the folder's files are written and rewritten: an input inside it would be one of them
        source = resolve_source(name)[0].resolve()
        if source == out_dir or out_dir in source.parents:
            raise ConfigError(f"the input {name} is inside the --out folder {args.out}; name another folder")
    for flag, value in (("--limit", args.limit), ("--max-failures", args.max_failures)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be ≥ 1, got {value}")
    if args.concurrency < 1:
        raise ConfigError(f"--concurrency must be ≥ 1, got {args.concurrency}")
    if args.budget is not None and args.budget <= 0:
        raise ConfigError(f"--budget must be > 0 dollars, got {args.budget}")
    samples = _samples(datasets, args.limit)
    prices = PriceTable.load(args.prices)
    agent_cfg, env_cfg, loop_cfg = configs_from_args(args)
    needs_agent = any(METHODS[m].needs_agent for m in methods)
    needs_env = any(METHODS[m].needs_environment for m in methods)
    agent_cfg, env_cfg = (agent_cfg if needs_agent else None), (env_cfg if needs_env else None)
    # Before any endpoint is contacted or model loaded: a folder of rows made with other settings is refused.
    record_settings(args.out, methods, agent_config=agent_cfg, environment_config=env_cfg, loop=loop_cfg)
    agent, environment = _prepare(agent_cfg, env_cfg)
    print(
        f"evaluating {', '.join(methods)} on {len(datasets)} dataset(s), {len(samples)} rows each method "
        f"→ {args.out}",
        file=sys.stderr,
    )
    outcome = asyncio.run(
        run_evaluation(
            args.out,
            methods,
            samples,
            agent=agent,
            environment=environment,
            loop=loop_cfg,
            agent_config=agent_cfg,
            environment_config=env_cfg,
            concurrency=args.concurrency,
            max_failures=args.max_failures,
            budget=args.budget,
            prices=prices,
            progress=not args.no_progress,
        )
    )
    # Scored: this run's rows, less those kept from an earlier run for another question.
    wanted = {(m, str(s.dataset), str(s.id)) for m in methods for s in samples} - set(outcome.conflict_keys)
    rows = [
        r
        for r in read_predictions(Path(args.out) / PREDICTIONS)
        if (str(r["method"]), str(r["dataset"]), str(r["id"])) in wanted
    ]
    summary = summarize(rows)
    written = write_reports(summary, args.out, chart=not args.no_chart)
    print(written["markdown"].read_text(encoding="utf-8"))
    cost = outcome.usage.get("cost_usd")
    print(
        f"{outcome.written} rows run, {outcome.skipped} already done, in {outcome.seconds:.1f} s"
        + (f", ${cost:.4f} estimated" if cost else "")
        + "; "
        + ", ".join(str(p) for p in written.values()),
        file=sys.stderr,
    )
    return _verdict(outcome, sum(s.failed for s in summary))


def _verdict(outcome, failed: int) -> int:
    """The exit code, with one line saying what is left when the run is not complete."""
    if outcome.stopped and outcome.stopped.startswith("interrupted"):
        print(
            f"prompt-r1: {outcome.stopped}: {outcome.cancelled} row(s) in flight were cancelled; run the same "
            "command again to do the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    left = []
    if failed:
        left.append(f"{failed} rows failed")
    if outcome.cancelled:
        left.append(f"{outcome.cancelled} cancelled")
    if outcome.conflict_keys:
        left.append(
            f"{len(outcome.conflict_keys)} rows finished earlier for another question, kept and not scored "
            "(use another --out folder to run the new questions)"
        )
    if outcome.stopped:
        left.append(f"stopped: {outcome.stopped}")
    if left:
        print(
            f"prompt-r1: error: {'; '.join(left)}; run the same command again to retry them", file=sys.stderr
        )
        return EXIT_FAILED
    return EXIT_OK
