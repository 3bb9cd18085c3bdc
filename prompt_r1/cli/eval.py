"""`prompt-r1 eval` and `prompt-r1 score`: the commands around `prompt_r1.evaluation.harness.run_evaluation` and
`prompt_r1.evaluation.reports` (flags, plan, reports, exit code)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from types import SimpleNamespace

from prompt_r1.cli.dry_run import add_dry_run_flags, eval_dry_run
from prompt_r1.cli.eval_manifest import write_eval_manifest
from prompt_r1.cli.eval_search import add_search_flags, search_settings
from prompt_r1.cli.flags import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_ray_flags,
    add_stop_flags,
    build_players,
    check_ray_players,
    check_run_flags,
    configs_from_args,
    ray_failures,
    ray_settings_from,
)
from prompt_r1.cli.records import (
    add_allow_changed_flag,
    add_cache_flags,
    cache_verdict,
    check_run_cache,
    closing_caches,
    open_run_cache,
)
from prompt_r1.clients.costs import PriceTable
from prompt_r1.clients.response_cache import use_cache
from prompt_r1.core import signals
from prompt_r1.core.checks import flag_number
from prompt_r1.core.errors import ConfigError
from prompt_r1.data.datasets import load_samples, resolve_source
from prompt_r1.evaluation.harness import (
    METHODS,
    PREDICTIONS,
    SUITES,
    read_predictions,
    record_settings,
    resolve_plan,
)
from prompt_r1.evaluation.optimizers.search import check_search_prices, search_spend
from prompt_r1.evaluation.reports import summarize, write_reports
from prompt_r1.evaluation.search_run import search_then_run
from prompt_r1.evaluation.sweep import SWEEP_FIELDS, environment_sweep, write_sweep_report
from prompt_r1.runs.call_ledger import earlier_ledger
from prompt_r1.runs.metering import check_budget_prices
from prompt_r1.runs.output_lock import hold_output
from prompt_r1.runs.pool import named_keys
from prompt_r1.scoring.metrics import METRICS
from prompt_r1.scoring.scorers import SCORERS, read_rows

__all__ = ["add_eval_parsers", "cmd_eval", "cmd_score"]


def add_eval_parsers(sub: argparse._SubParsersAction, add_run_flags) -> None:
    """`eval` and `score`."""
    ev = sub.add_parser(
        "eval",
        help="evaluate methods on the paper's datasets (or your files); writes predictions, tables and a chart",
        description="Runs each method on each dataset row concurrently, appending one JSONL row per sample to "
        "OUT/predictions.jsonl (a rerun skips finished rows and retries failed ones), then writes "
        "OUT/summary.csv, OUT/table.md and OUT/chart.png. Ctrl-C or SIGTERM stops cleanly (exit 130 or 143), a "
        "prompt optimiser's search included; the next run does the rest.",
    )
    ev.add_argument(
        "--suite",
        choices=list(SUITES),
        help="; ".join(f"{name}: {suite.description}" for name, suite in SUITES.items()),
    )
    ev.add_argument(
        "--dataset",
        action="append",
        metavar="NAME|FILE",
        help="a bundled set (hotpot, 2wiki, musique, popqa, gsm8k, dapo, booksum, writingprompts, mathqa, "
        "squad_v2, triviaqa, xsum) or a .parquet/.jsonl/.json file; repeatable, adds to --suite",
    )
    ev.add_argument(
        "--method",
        action="append",
        choices=list(METHODS),
        help="repeatable (default: the suite's methods, else prompt-r1)",
    )
    ev.add_argument(
        "--limit",
        type=flag_number(integer=True, minimum=1),
        metavar="N",
        help="only the first N rows of each dataset",
    )
    ev.add_argument(
        "--out", default="eval-results", metavar="DIR", help="output folder (default: eval-results)"
    )
    ev.add_argument(
        "--concurrency",
        type=flag_number(integer=True, minimum=1),
        default=16,
        metavar="N",
        help="episodes in flight (default: 16)",
    )
    add_stop_flags(ev, "rows")
    add_dry_run_flags(ev)
    add_ray_flags(ev, "rows")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.add_argument("--no-chart", action="store_true", help="skip chart.png")
    _add_scorer_flag(ev)
    add_cache_flags(ev)
    add_allow_changed_flag(ev, "rows")
    add_search_flags(ev)
    add_run_flags(ev, repeatable_env=SWEEP_FIELDS)

    sc = sub.add_parser(
        "score",
        help="score a predictions file (JSONL rows with prediction and golden_answers)",
        description="Rows may also carry dataset and method; without them the file name is the dataset.",
    )
    sc.add_argument("file", help="a .jsonl file of rows with `prediction` and `golden_answers`")
    sc.add_argument(
        "--metric",
        action="append",
        choices=list(METRICS),
        help="repeatable (default: EM, SM, F1, plus SSim on text sets and math equivalence on math sets)",
    )
    sc.add_argument(
        "--out", metavar="DIR", help="where to write summary.csv/table.md/chart.png (default: beside FILE)"
    )
    sc.add_argument("--no-chart", action="store_true", help="skip the chart")
    _add_scorer_flag(sc)


def _add_scorer_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scorer",
        choices=list(SCORERS),
        default="paper",
        help="paper: the paper's metric definitions (default); release: the reference release's scoring rules "
        "(two-way substring match, an empty prediction scoring SM 1 and SSim 1.0, and for eval the release's "
        "reading of an episode's answer), written to summary.release.csv, table.release.md, chart.release.png",
    )


def _samples(datasets: list[str], limit: int | None) -> tuple[list, dict[str, str]]:
    """The rows to evaluate, and each dataset's label → the name or file it was loaded from."""
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
    return samples, sources


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
    check_run_flags(args)
    samples, sources = _samples(datasets, args.limit)
    search = search_settings(args)
    prices = PriceTable.load(args.prices)
    agent_cfg, env_cfg, loop_cfg = configs_from_args(args)
    needs_agent = any(METHODS[m].needs_agent for m in methods)
    needs_env = any(METHODS[m].needs_environment for m in methods)
    agent_cfg = agent_cfg if needs_agent else None
    given = {name: getattr(args, f"environment__{name}", None) for name in SWEEP_FIELDS}
    sweep = environment_sweep(env_cfg, given) if needs_env else [("", None)]
    folders = [(Path(args.out) / name if len(sweep) > 1 else Path(args.out), cfg) for name, cfg in sweep]
    if args.dry_run:  # the estimate alone: nothing sent, loaded or written
        return eval_dry_run(args, methods, samples, sources, search, prices, agent_cfg, loop_cfg, folders)
    # One writer per folder, to the end: a second eval on it is refused here, before a search or a row is paid for.
    with contextlib.ExitStack() as held:
        held.enter_context(closing_caches())
        for folder, _ in folders:
            held.enter_context(hold_output(folder, "--out", folder=True))
        return _eval_folders(
            args, methods, samples, sources, search, prices, agent_cfg, loop_cfg, sweep, folders
        )


def _eval_folders(
    args, methods, samples, sources, search, prices, agent_cfg, loop_cfg, sweep, folders
) -> int:
    """`cmd_eval` once its folders are held: settings recorded, clients made, each folder evaluated."""
    from prompt_r1.runs.manifest import manifest_path, read_manifest

    if args.budget is not None:  # the optimiser model priced before a folder is recorded: its calls count too
        for _, cfg in folders:
            check_search_prices(prices, methods, search, cfg)
    # Before any endpoint is contacted or model loaded: a manifest that does not parse, or a folder of rows made
    # with other settings, is refused (unless --allow-changed-settings), with nothing written.
    if (
        args.ray is not None and args.env_cache
    ):  # the actors build their own clients: the cache would go unused
        raise ConfigError(
            "--env-cache is not supported with --ray yet: run without --ray to replay from a cache"
        )
    # A call ledger beside the rows (an earlier --ray run's) that is not one, or is damaged, is refused before a
    # file is written: the run would refuse it later, with its settings and manifest already recorded.
    for folder, _ in folders:
        ledger = earlier_ledger(Path(folder) / PREDICTIONS)
        if ledger is not None:
            ledger.close()
    # Ray's side before a file is written: the address, Ray installed, the cluster reachable, a shared store for
    # every environment (the actors load the players; here their endpoints are checked).
    ray = ray_settings_from(args)
    if ray is not None:
        for i, (_, cfg) in enumerate(folders):
            check_ray_players(ray, agent_cfg if i == 0 else None, cfg)
    earlier = [read_manifest(manifest_path(folder=folder)) for folder, _ in folders]
    protected = [(f"{folder}", folder) for folder, _ in folders]
    check_run_cache(args, [cfg for _, cfg in folders if cfg is not None], protected=protected)
    recorded = [
        record_settings(
            folder,
            methods,
            agent_config=agent_cfg,
            environment_config=cfg,
            loop=loop_cfg,
            search=search.to_dict(),
            datasets=sources,
            allow_changed=args.allow_changed_settings,
        )
        for folder, cfg in folders
    ]
    # Every environment's key and socket are checked before the agent loads (the cheap checks first), and the
    # agent is loaded once, whatever the environments.
    environments = [build_players(None, cfg)[1] for _, cfg in folders]
    called = [environment for environment in environments if environment is not None]
    cache = open_run_cache(args, called, protected=protected)
    for environment in called:
        use_cache(environment, cache, always=args.env_cache_always)
    for (folder, cfg), before, settings in zip(folders, earlier, recorded, strict=True):
        write_eval_manifest(args, folder, settings, cfg, sources, prices, agent_cfg, search, before)
    if ray is not None:  # the actors load the agent (checked above)
        agent = SimpleNamespace(config=agent_cfg) if agent_cfg is not None else None
    else:
        agent, _ = build_players(agent_cfg, None)
    if args.budget is not None:  # every environment's model priced before the first one is paid for
        for environment in environments:
            check_budget_prices(prices, environment, agent)
    summaries, code = {}, EXIT_OK
    for (name, _), (folder, cfg), environment in zip(sweep, folders, environments, strict=True):
        summary, done = _evaluate(
            args,
            folder,
            methods,
            samples,
            prices,
            agent,
            environment,
            agent_cfg,
            cfg,
            loop_cfg,
            sources=sources,
            search=search,
        )
        summaries[name] = summary
        code = max(code, done)  # the worst of the environments' (0 done, 1 rows left, 130/143 interrupted)
        if (
            done in signals.EXIT_CODES.values()
        ):  # a stop signal stops the sweep, not only this environment's run
            break
    if len(sweep) > 1:
        written = write_sweep_report(summaries, args.out, chart=not args.no_chart, scoring=args.scorer)
        print(written["markdown"].read_text(encoding="utf-8"))
        print("sweep: " + ", ".join(str(p) for p in written.values()), file=sys.stderr)
    if cache is not None:
        print(f"cache {cache.label}: {cache.render(prices)}", file=sys.stderr)
        damaged = cache_verdict(cache)
        if damaged:
            print(f"prompt-r1: error: {damaged}", file=sys.stderr)
            return EXIT_USAGE
    return code


def _evaluate(
    args, out, methods, samples, prices, agent, environment, agent_cfg, env_cfg, loop_cfg, *, sources, search
):
    """One folder's searches, run, scoring and reports; (its summary, its exit code)."""
    print(
        f"evaluating {', '.join(methods)} on {len({s.dataset for s in samples})} dataset(s), {len(samples)} rows "
        f"each method → {out}",
        file=sys.stderr,
    )
    if args.ray is None and env_cfg is not None:
        from prompt_r1.agents.model_server import local_environment

        env_cfg = local_environment(
            env_cfg
        )  # a built-in environment: the optimisers call this process's server
    with ray_failures():
        records, outcome = asyncio.run(
            search_then_run(
                out,
                methods,
                sources,
                samples,
                environment,
                env_cfg,
                search,
                prices,
                agent=agent,
                loop=loop_cfg,
                agent_config=agent_cfg,
                concurrency=args.concurrency,
                max_failures=args.max_failures,
                budget=args.budget,
                progress=not args.no_progress,
                ray=ray_settings_from(args),
            )  # fmt: skip
        )
    # Scored: this run's rows, less those kept from an earlier run for another question.
    wanted = {(m, str(s.dataset), str(s.id)) for m in methods for s in samples} - set(outcome.conflict_keys)
    rows = [
        r
        for r in read_predictions(Path(out) / PREDICTIONS)
        if (str(r["method"]), str(r["dataset"]), str(r["id"])) in wanted
    ]
    rows = read_rows(args.scorer, rows)  # each row's prediction as the scorer reads it
    summary = summarize(rows, scoring=args.scorer)
    for s in summary:  # what a prompt optimiser's search cost, beside what answering the rows cost
        record = records.get((s.method, s.dataset))
        if record is not None:
            s.spend.update(search_spend(record))
    written = write_reports(summary, out, chart=not args.no_chart, scoring=args.scorer)
    print(written["markdown"].read_text(encoding="utf-8"))
    cost = outcome.usage.get("cost_usd")
    print(
        f"{outcome.written} rows run, {outcome.skipped} already done, in {outcome.seconds:.1f} s"
        + (f", ${cost:.4f} estimated" if cost else "")
        + "; "
        + ", ".join(str(p) for p in written.values()),
        file=sys.stderr,
    )
    if outcome.ray is not None:
        from prompt_r1.runs.batch import ray_line

        print(f"ray: {ray_line(outcome.ray)}", file=sys.stderr)
    return summary, _verdict(outcome, sum(s.failed for s in summary))


def _verdict(outcome, failed: int) -> int:
    """The exit code, with one line saying what is left when the run is not complete."""
    if outcome.stopped and outcome.stopped.startswith("interrupted"):
        print(
            f"prompt-r1: {outcome.stopped}: {outcome.cancelled} row(s) in flight were cancelled; run the same "
            "command again to do the rest",
            file=sys.stderr,
        )
        return signals.exit_code("SIGTERM" if "SIGTERM" in outcome.stopped else "SIGINT")
    left = []
    if failed:
        left.append(f"{failed} rows failed")
    if outcome.cancelled:
        left.append(f"{outcome.cancelled} cancelled")
    if outcome.conflict_keys:
        left.append(
            f"{len(outcome.conflict_keys)} rows finished earlier for another question, kept and not scored "
            f"({named_keys(outcome.conflict_keys)}; use another --out folder to run the new questions)"
        )
    if outcome.stopped:
        left.append(f"stopped: {outcome.stopped}")
    if left:
        # A rerun retries what failed or was not run; it never reruns a kept row, so it is not offered for those.
        again = (
            "; run the same command again to retry them"
            if failed or outcome.cancelled or outcome.stopped
            else ""
        )
        print(f"prompt-r1: error: {'; '.join(left)}{again}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_score(args: argparse.Namespace) -> int:
    from prompt_r1.core.errors import DataError
    from prompt_r1.evaluation.harness import prediction_problem, read_predictions, summarize, write_reports
    from prompt_r1.scoring.rewards import golden_answers_of

    path = Path(args.file)
    if not path.exists():
        raise DataError(f"no such predictions file: {path}")
    if not path.is_file():
        raise DataError(f"{path} is not a file; give a .jsonl file of predictions")
    # Strict: a torn or unreadable line is refused, never left out (it would change the scores without a word).
    repeats: list[tuple[int, tuple[str, str, str]]] = []
    rows = read_predictions(path, strict=True, repeats=repeats)
    if not rows:
        raise DataError(f"{path} has no rows")
    for i, row in enumerate(rows):
        problem = prediction_problem(row)  # the rule an eval resuming its folder applies too
        if problem is not None:
            raise DataError(f"{path} row {i}: {problem}")
        row["golden_answers"] = golden_answers_of(row)
    if repeats:
        keys = list(dict.fromkeys(key for _, key in repeats))
        one_group = len({key[:2] for key in keys}) == 1
        named = ", ".join(repr(key[2]) if one_group else "/".join(key) for key in keys[:5])
        print(
            f"prompt-r1: warning: {path}: {len(keys)} id{'s are' if len(keys) > 1 else ' is'} on more than one "
            f"row ({named}{', …' if len(keys) > 5 else ''}); only the last row of each is scored, "
            f"{len(repeats)} earlier row{'s' if len(repeats) > 1 else ''} left out",
            file=sys.stderr,
        )
    summary = summarize(rows, metrics=args.metric, scoring=args.scorer)
    written = write_reports(
        summary,
        args.out or path.parent,
        stem=f"{path.stem}.",
        chart=not args.no_chart,
        metrics=args.metric,
        scoring=args.scorer,
    )
    print(written["markdown"].read_text(encoding="utf-8"))
    print(", ".join(str(p) for p in written.values()), file=sys.stderr)
    return EXIT_OK
