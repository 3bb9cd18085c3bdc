"""The hops task's part of the learning benchmark (`evals/bench/learning.py --task hops`): train one seed, and the
lines that report the chain. See `prompt_r1.tasks.hops` for the task and `prompt_r1.tasks.hops_training` for the
figures; learning.py's docstring for the run's flags."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from learning_common import COLLAPSE, GRPO_FIELDS, HELD_OUT_STEP, WINDOW, async_figures

RISE = 30  # points of correct-from-the-last-reply that a 2- or 3-hop question must gain (the target)
SERIES = (
    "hops/hop1",
    "hops/hop2",
    "hops/hop3",
    "hops/from_last_reply",
    "hops/from_last_reply_1",
    "hops/from_last_reply_2",
    "hops/from_last_reply_3",
    "hops/calls",
    "hops/exact_calls",
    "frac_reward_zero_std",
)
CURVES = (
    ("first call right", "hops/hop1"),
    ("2nd call follows", "hops/hop2"),
    ("3rd call follows", "hops/hop3"),
    ("exactly the calls needed", "hops/exact_calls"),
)


def build_agent(seed: int, args: argparse.Namespace, work: Path) -> dict:
    """The seed's agent in WORK/hops-model-SEED, built unless an agent of the same build is there."""
    from prompt_r1.tasks.door_codes import SERVED_SHAPE
    from prompt_r1.tasks.hops_agent import HopsBuildError, build_hops_model

    model = work / f"hops-model-{seed}"
    marker = model / "hops_build.json"
    build = json.loads(marker.read_text()) if marker.is_file() else {}
    if build.get("steps") != args.sft_steps or build.get("shape") != SERVED_SHAPE:
        try:
            build_hops_model(model, seed=seed, steps=args.sft_steps, **SERVED_SHAPE)
        except HopsBuildError as exc:
            return {"seed": seed, "build_error": str(exc)}
        build = json.loads(marker.read_text())
    return build


def train_seed(seed: int, args: argparse.Namespace, work: Path, **settings) -> dict:
    """Build the seed's agent, train it on the hops task, and return its per-step series and figures."""
    from prompt_r1.tasks.hops import HopsTable, hops_environment, training_rows
    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.training.shared.progress import step_series

    build = build_agent(seed, args, work)
    if "build_error" in build or args.build_only:
        return build if "build_error" in build else {"seed": seed, "build": build}
    model = work / f"hops-model-{seed}"
    table = HopsTable(seed)
    rows = training_rows(args.steps * args.batch // args.group + args.batch, seed=seed)
    run_dir = (
        work / f"hops-run-{seed}-{'async-' if args.async_grpo else ''}{len(list(work.glob('hops-run-*')))}"
    )
    common = dict(
        per_device_train_batch_size=args.batch,
        num_generations=args.group,
        max_steps=args.steps,
        seed=seed,
        data_seed=seed,
        **settings,
    )
    extra: dict = {}
    with ScriptedServer({"env": hops_environment(table)}, record=False) as server:
        if args.async_grpo:
            from prompt_r1.tasks.hops_async import train_async

            try:
                run = train_async(
                    model,
                    table,
                    rows,
                    server.base_url,
                    run_dir,
                    held_out_step=HELD_OUT_STEP,
                    max_staleness=args.max_staleness,
                    **common,
                )
            except Exception as exc:  # noqa: BLE001 (one seed's failure is its result, not the run's end)
                return {"seed": seed, "build": build, "error": f"{type(exc).__name__}: {exc}"}
            config, log_history = run["config"], run["log_history"]
            before, after, seconds = run["before"], run["after"], run["seconds"]
            extra = {"async": async_figures(log_history), "max_staleness": args.max_staleness}
        else:
            from prompt_r1.tasks.hops_training import control, first_call_logprob, grpo_config, hops_trainer

            config = grpo_config(run_dir, model, server.base_url, **common)
            trainer = hops_trainer(config, table, rows, mask_first_turn=args.mask_first_turn)
            before = {
                **control(trainer, trainer.rollout_func, step=HELD_OUT_STEP),
                "first_call_logprob": first_call_logprob(trainer),
            }
            started = time.monotonic()
            trainer.train()
            seconds = time.monotonic() - started
            after = {
                **control(trainer, trainer.rollout_func, step=HELD_OUT_STEP),
                "first_call_logprob": first_call_logprob(trainer),
            }
            log_history = trainer.state.log_history
    series = step_series(log_history, extra=SERIES)

    def ends(key: str) -> tuple[float, float]:
        values = series[key]
        return _nanmean(values[:WINDOW]), _nanmean(values[-WINDOW:])

    first, last = ends("reward")
    windows = [_nanmean(series["reward"][i : i + WINDOW]) for i in range(len(series["reward"]) - WINDOW + 1)]
    b, a = before["honest_figures"], after["honest_figures"]
    return {
        "seed": seed,
        "task": "hops",
        "trainer": "async" if args.async_grpo else "sync",
        "build": build,
        "grpo": {k: getattr(config, k, None) for k in GRPO_FIELDS},  # None: a field the async config has not
        "series": series,
        "first": first,
        "last": last,
        "gain": last - first,
        "collapsed": max(windows) - last > COLLAPSE or a["from_last_reply"] < b["from_last_reply"],
        "ends": {key.removeprefix("hops/"): ends(key) for key in SERIES if key.startswith("hops/")},
        "before": before,
        "after": after,
        "seconds": seconds,
        **extra,
    }


def _nanmean(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.fmean(values) if values else math.nan


def rises(r: dict) -> tuple[float, float]:
    """Correct from the last reply, evaluated after minus before, on 2- and 3-hop questions (points)."""
    b, a = r["before"]["honest_figures"], r["after"]["honest_figures"]
    return tuple(100 * (a[f"from_last_reply_{k}"] - b[f"from_last_reply_{k}"]) for k in (2, 3))


def seed_line(name: str, r: dict) -> str:
    if "series" not in r:
        return (
            f"{name} seed {r['seed']}: not trained: {r.get('build_error') or r.get('error') or 'no figures'}"
        )
    b, a = r["before"]["honest_figures"], r["after"]["honest_figures"]
    per_hop = ", ".join(
        f"{k} hop{'s' if k > 1 else ''} {b[f'from_last_reply_{k}']:.0%} -> {a[f'from_last_reply_{k}']:.0%}"
        for k in (1, 2, 3)
    )
    return (
        f"{name} seed {r['seed']}: reward {r['first']:+.2f} -> {r['last']:+.2f} (gain {r['gain']:+.2f}); evaluated "
        f"correct from the last reply: {per_hop}; calls made {a['calls']:.2f} (before {b['calls']:.2f}; needed 2.00), "
        f"exactly as needed {b['exact_calls']:.0%} -> {a['exact_calls']:.0%}; chain after: first call "
        f"{a['hop1']:.0%}, 2nd follows {a['hop2']:.0%}, 3rd follows {a['hop3']:.0%}; controls: withheld "
        f"{r['after']['withheld']:.0%}, lied to {r['after']['lying']:.0%}, answered at once "
        f"{r['after']['at_once']:.0%}; first call log-prob {r['before']['first_call_logprob']:.2f} -> "
        f"{r['after']['first_call_logprob']:.2f}{'; COLLAPSED' if r['collapsed'] else ''}; {r['seconds']:.0f} s"
    )


def build_line(r: dict) -> str:
    if "build_error" in r:
        return f"seed {r['seed']}: agent not built: {r['build_error']}"
    b = r["build"]
    sampled = ", ".join(f"{k} {v:.0%}" for k, v in b["sampled"].items())
    return (
        f"seed {r['seed']}: agent built: {b['reading_steps']} whole-chain steps, {b['mixture_attempts']} mixture "
        f"tries; sampled: {sampled}"
    )


def summary_line(results: list[dict]) -> str:
    from prompt_r1.tasks.hops_training import CHANCE

    failed = [str(r["seed"]) for r in results if "series" not in r]
    trained = [r for r in results if "series" in r]
    tail = f"; not trained: seed{'s' if len(failed) > 1 else ''} {', '.join(failed)}" if failed else ""
    if not trained:
        return "no seed trained" + tail
    n = len(trained)
    gains = [r["gain"] for r in trained]
    two, three = zip(*(rises(r) for r in trained), strict=True)
    both = sum(x >= RISE and y >= RISE for x, y in zip(two, three, strict=True))
    after = [r["after"]["honest_figures"] for r in trained]
    exact = [f["exact_calls"] for f in after]
    mean = lambda key: statistics.fmean(f[key] for f in after)  # noqa: E731
    withheld = [r["after"]["withheld"] for r in trained]
    lied = [r["after"]["lying"] for r in trained]
    at_once = [r["after"]["at_once"] for r in trained]
    lp = [r["after"]["first_call_logprob"] - r["before"]["first_call_logprob"] for r in trained]
    return (
        f"mean gain {statistics.fmean(gains):+.2f} (min {min(gains):+.2f} over {n} seed{'s' if n != 1 else ''}), "
        f"first {WINDOW} vs last {WINDOW} steps; correct from the last reply: 2 hops {statistics.fmean(two):+.0f} "
        f"points (min {min(two):+.0f}), 3 hops {statistics.fmean(three):+.0f} (min {min(three):+.0f}), >= {RISE} on "
        f"both {both}/{n}; exactly the calls needed {statistics.fmean(exact):.0%} (min {min(exact):.0%}), calls "
        f"made {mean('calls'):.2f} vs needed 2.00; chain: first call {mean('hop1'):.0%}, 2nd follows "
        f"{mean('hop2'):.0%}, 3rd follows {mean('hop3'):.0%}; controls: last reply withheld "
        f"{statistics.fmean(withheld):.0%} (max {max(withheld):.0%}, chance {CHANCE:.0%}), first reply lied to "
        f"{statistics.fmean(lied):.0%} (max {max(lied):.0%}), answered at once {statistics.fmean(at_once):.0%}; "
        f"first call log-prob {statistics.fmean(lp):+.2f}; {sum(r['collapsed'] for r in trained)} collapsed"
        + tail
    )


def after_key(r: dict) -> float:
    """What `comparison` prints as evaluated after training: correct from the last reply."""
    return r["after"]["honest_figures"]["from_last_reply"]
