"""`prompt-r1 batch`: the command around `prompt_r1.runs.batch.run_batch` (flags, path checks, summary, exit code)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from prompt_r1.cli.dry_run import add_dry_run_flags, batch_dry_run
from prompt_r1.cli.flags import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_ray_flags,
    add_stop_flags,
    build_players,
    check_rate_store,
    check_ray_players,
    check_reachable,
    configs_from_args,
    ray_failures,
    ray_settings_from,
)
from prompt_r1.cli.records import (
    ALLOW_CHANGED,
    add_allow_changed_flag,
    add_cache_flags,
    cache_verdict,
    closing_caches,
    open_run_cache,
)
from prompt_r1.clients.costs import PriceTable
from prompt_r1.clients.environment import OPENAI_BASE_URL
from prompt_r1.clients.environment_pool import EnvironmentPool
from prompt_r1.clients.response_cache import use_cache
from prompt_r1.core import redaction, signals
from prompt_r1.core.checks import flag_number
from prompt_r1.core.errors import ConfigError, OutputError
from prompt_r1.runs.batch import run_batch
from prompt_r1.runs.batch_settings import BatchSettings
from prompt_r1.runs.output_files import write_text_file
from prompt_r1.runs.output_lock import hold_output
from prompt_r1.runs.shards import MAX_SHARDS, Shard, merge_shards

__all__ = ["add_batch_parser", "cmd_batch", "cmd_batch_merge"]


def add_batch_parser(sub: argparse._SubParsersAction, add_run_flags) -> None:
    bt = sub.add_parser(
        "batch",
        help="run the loop on every question of a file or bundled set, resumably, as fast as the rate limit allows",
        description="Episodes run independently, CONCURRENCY at a time, through the environment's rate limiter. "
        "Each finished episode is appended to --out as one JSON line (id, question, answer, status, turns, usage, "
        "error, cost_usd). Rerun the same command to skip finished ids and retry failed ones; with --checkpoint, "
        "episodes that were in flight or failed resume from their last completed step. Ctrl-C or SIGTERM stops "
        "cleanly (exit 130 or 143).",
    )
    bt.add_argument(
        "input",
        metavar="INPUT",
        help="a .parquet/.jsonl/.json file of questions (a `question` or the release's `prompt`, optional `id` "
        "and golden answers) or a bundled set's name",
    )
    bt.add_argument("--out", required=True, metavar="FILE.jsonl", help="results file, appended to")
    bt.add_argument(
        "--concurrency",
        type=flag_number(integer=True, minimum=1),
        default=32,
        metavar="N",
        help="episodes in flight at once (default: 32)",
    )
    bt.add_argument(
        "--checkpoint",
        metavar="FILE.sqlite",
        help="LangGraph SQLite checkpoints: an interrupted or failed episode resumes from its last completed "
        "step instead of paying again for the turns it had",
    )
    add_stop_flags(bt, "episodes")
    add_dry_run_flags(bt)
    bt.add_argument(
        "--env-pool",
        metavar="FILE",
        help="several environments with weights: episodes are routed to one each, and fall back to the next "
        "when it keeps failing (YAML: environments: [{model, base_url, weight, ...}]; unset fields come from "
        "the --env-* flags)",
    )
    bt.add_argument(
        "--limit", type=flag_number(integer=True, minimum=1), metavar="N", help="only the first N input rows"
    )
    bt.add_argument(
        "--summary",
        metavar="FILE",
        help="where to write the summary as JSON (default: beside --out, as NAME.summary.json)",
    )
    bt.add_argument(
        "--log-file",
        metavar="FILE",
        help="write debug logs (HTTP requests, retries) to FILE; API keys are redacted",
    )
    bt.add_argument(
        "--shard",
        metavar="I/N",
        help="run only shard I of N of the input (rows chosen by a stable hash of their id), writing its own "
        "results file beside --out (NAME.shard-I-of-N.jsonl); run every shard, on any machines, then "
        "`prompt-r1 batch-merge INPUT --out NAME.jsonl --shards N`. With --env-rate-store they share one limit",
    )
    add_ray_flags(bt, "episodes")
    bt.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cache_flags(bt)
    add_allow_changed_flag(bt, "rows")
    add_run_flags(bt)
    merge = sub.add_parser(
        "batch-merge",
        help="merge the results files of `batch --shard I/N` into one",
        description="Writes --out with the last row of each id from NAME.shard-1-of-N.jsonl … "
        "NAME.shard-N-of-N.jsonl beside it; every shard file must exist and --out must not. Each shard file is "
        "checked against INPUT, and only read: one still being written, with a torn row, or made from another "
        "input or N is refused (exit 2), naming the file and the ids missing or foreign. The merged file gets its "
        "manifest (NAME.manifest.json) from the shards': a later batch on it with other settings is refused as on "
        "any results file.",
    )
    merge.add_argument(
        "input", metavar="INPUT", help="the input the shards were run on (the INPUT of `prompt-r1 batch`)"
    )
    merge.add_argument("--out", required=True, metavar="FILE.jsonl", help="the merged results file to write")
    merge.add_argument(
        "--shards",
        required=True,
        type=flag_number(integer=True, minimum=1, maximum=MAX_SHARDS),
        metavar="N",
        help="N of --shard",
    )
    merge.add_argument(
        "--limit",
        type=flag_number(integer=True, minimum=1),
        metavar="N",
        help="the --limit the shards were run with: only the first N input rows",
    )


def _log_to_file(path: Path) -> None:
    import logging

    from prompt_r1.core.redaction import RedactingFilter

    try:
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write --log-file {path}: {exc.strerror or exc}") from None
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    for name in ("prompt_r1", "openai", "httpx", "langchain_openai"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)


def cmd_batch(args: argparse.Namespace) -> int:
    """Parse the flags once into typed settings, check every path (nothing contacted, loaded or written before),
    then run, then report."""
    shard = Shard.parse(args.shard) if args.shard else None
    out = Path(args.out)
    settings = BatchSettings(
        source=args.input,
        out=shard.path(out) if shard is not None else out,  # each shard its own results file, beside --out
        concurrency=args.concurrency,
        checkpoint=args.checkpoint,
        max_failures=args.max_failures,
        budget=args.budget,
        limit=args.limit,
        summary=args.summary,
        log_file=args.log_file,
        progress=not args.no_progress,
        shard=shard,
        ray=ray_settings_from(args),
        flags=True,
    )
    settings.check_files()
    if args.dry_run:  # the estimate alone: nothing sent, loaded or written
        return batch_dry_run(args, settings)
    # One writer per results file, from here to the end: a second run on it is refused before it loads a model
    # or calls anything (a shard's own file is its lock's; shards run side by side).
    with hold_output(settings.out, "--out"), closing_caches():
        return _batch(args, settings)


def _batch(args: argparse.Namespace, settings: BatchSettings) -> int:
    agent_cfg, env_cfg, loop_cfg = configs_from_args(args)
    prices = PriceTable.load(args.prices)
    if settings.ray is not None:
        return _batch_on_ray(args, settings, agent_cfg, env_cfg, loop_cfg, prices)
    if args.env_pool:
        environment = EnvironmentPool.from_file(args.env_pool, env_cfg)
        for member in environment.members:
            check_reachable(
                member.config.base_url or OPENAI_BASE_URL, f"environment {member.name}", "--env-pool"
            )
            check_rate_store(member.config.rate_store)
    else:
        _, environment = build_players(None, env_cfg)
    # The cache and the manifest before the agent loads: a bad one is one line, nothing loaded or sent.
    cache = open_run_cache(args, [environment], protected=settings.own_files())
    use_cache(environment, cache, always=args.env_cache_always)
    write = _manifest(args, settings, agent_cfg, env_cfg, loop_cfg, environment, prices)
    agent, _ = build_players(agent_cfg, None)
    if settings.log_file is not None:
        _log_to_file(settings.log_file)
    summary = asyncio.run(
        run_batch(
            settings,
            agent=agent,
            environment=environment,
            loop=loop_cfg,
            prices=prices,
            cache=cache,
            cache_always=args.env_cache_always,
            manifest=write,
        )  # fmt: skip
    )
    return _report(settings, summary, cache)


def _batch_on_ray(args, settings, agent_cfg, env_cfg, loop_cfg, prices) -> int:
    """The same run, its episodes in Ray actors: the endpoints and the store are checked from here (the actors
    load the agent, not this process), then Ray is joined or started."""
    if args.env_pool:
        raise ConfigError("--ray runs one environment per actor: --env-pool is not supported with --ray yet")
    if args.env_cache:  # the actors build their own clients: a cache here would be silently unused
        raise ConfigError(
            "--env-cache is not supported with --ray yet: run without --ray to replay from a cache"
        )
    check_ray_players(settings.ray, agent_cfg, env_cfg)
    write = _manifest(args, settings, agent_cfg, env_cfg, loop_cfg, None, prices)
    if settings.log_file is not None:
        _log_to_file(settings.log_file)
    with ray_failures():
        summary = asyncio.run(
            run_batch(
                settings,
                agent_config=agent_cfg,
                environment_config=env_cfg,
                loop=loop_cfg,
                prices=prices,
                manifest=write,
            )  # fmt: skip
        )
    return _report(settings, summary)


def _report(settings: BatchSettings, summary, cache=None) -> int:
    """Write the summary, print it, and the exit code it makes (a damaged `cache` entry found: exit 2)."""
    write_text_file(settings.summary, redaction.dumps(summary.to_dict(), indent=2) + "\n", "--summary")
    print(summary.render(), file=sys.stderr)
    print(f"summary: {settings.summary}", file=sys.stderr)
    damaged = cache_verdict(cache)
    if damaged:
        print(f"prompt-r1: error: {damaged}", file=sys.stderr)
        return EXIT_USAGE
    if summary.input_error:
        print(f"prompt-r1: error: {summary.input_error}", file=sys.stderr)
        return EXIT_USAGE
    if summary.stopped and summary.stopped.startswith("interrupted"):  # "interrupted (SIGTERM)": 143
        return signals.exit_code("SIGTERM" if "SIGTERM" in summary.stopped else "SIGINT")
    if not summary.complete:
        left = []
        if summary.failed:
            left.append(f"{summary.failed} failed")
        if summary.cancelled:
            left.append(f"{summary.cancelled} cancelled")
        if summary.conflicts:
            left.append(
                f"{summary.conflicts} ids finished earlier for another question, kept: use another --out"
            )
        if summary.stopped:
            left.append(f"stopped: {summary.stopped}")
        # A rerun retries what failed or was not run; it never reruns a kept row (use another --out for those).
        again = summary.failed or summary.cancelled or summary.stopped
        print(
            f"prompt-r1: error: not every episode finished ({'; '.join(left)})"
            + ("; run the same command again to retry the failed ones and run the rest" if again else ""),
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def _manifest(args, settings: BatchSettings, agent_cfg, env_cfg, loop_cfg, environment, prices):
    """Check the manifest beside --out (one that does not parse, or other settings, is refused: nothing is
    written), and return what writes this run's once the results file is checked too."""
    import dataclasses

    from prompt_r1.runs.manifest import (
        build_manifest,
        check_manifest,
        manifest_path,
        measured,
        write_manifest,
    )

    members = getattr(environment, "members", None)
    env_measured = [measured(m.config) for m in members] if members else measured(env_cfg)
    from prompt_r1.data.datasets import resolve_source

    source = resolve_source(settings.source)[0].resolve()  # one file however it is named
    # --limit is not among them: a first run on a few rows and a second on the rest add to one results file.
    runs_on = {"input": str(source), "shard": args.shard,
               "agent": measured(agent_cfg), "environment": env_measured, "loop": dataclasses.asdict(loop_cfg)}  # fmt: skip
    operational = {
        "concurrency": settings.concurrency, "max_failures": settings.max_failures, "budget": settings.budget,
        "limit": settings.limit,
        "out": settings.out, "checkpoint": settings.checkpoint, "summary": settings.summary,
        "env_pool": args.env_pool, "env_cache": args.env_cache, "env_cache_always": args.env_cache_always,
        "agent": dataclasses.asdict(agent_cfg), "environment": dataclasses.asdict(env_cfg),
    }  # fmt: skip
    path = manifest_path(results_file=settings.out)
    earlier, changes = check_manifest(
        path, runs_on, allow_changed=args.allow_changed_settings, flag=ALLOW_CHANGED, what="--out file"
    )
    manifest = build_manifest("batch", runs_on, operational, seeds={"agent": agent_cfg.seed}, prices=prices)
    return lambda: write_manifest(path, manifest, earlier, changes)


def cmd_batch_merge(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix != ".jsonl":
        raise ConfigError(f"--out must be a .jsonl file, got {out}")
    summary = merge_shards(out, args.shards, source=args.input, limit=args.limit)
    print(f"merged {args.shards} shards into {out}: {summary.render()}", file=sys.stderr)
    return EXIT_OK
