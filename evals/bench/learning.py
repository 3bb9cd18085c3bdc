"""Does GRPO teach the agent to collaborate? Learning on the door-codes task (one call) or the hops task (a chain
of 1 to 3 dependent calls), over seeds of your choice.

    python evals/bench/learning.py --seed0 S --seeds N [--jobs 2] [--steps 100] [--out DIR] [--work DIR] [flags]
    python evals/bench/learning.py --async --seed0 S --seeds N [--max-staleness 4] [--out DIR] [--work DIR]
    python evals/bench/learning.py --async --processes 2 --seed0 S --seeds N [--compare SYNC_JSON] [...]
    python evals/bench/learning.py --task hops --seed0 S --seeds N [--async] [--mask-first-turn] [...]

`--task hops` (`prompt_r1.tasks.hops`, its figures in `evals/bench/learning_hops.py`): a question asks for the code
behind a room, a door or a key; only the environment knows which door a key opens, which room a door leads to and
each room's code, redrawn every step, so the agent must call once, twice or three times, each call naming what the
last reply named, and stop when a reply gives the code. Per seed it prints the gain, correct from the last reply per
number of calls needed (evaluated before and after on a held-out table), calls made against calls needed (and the
share that made exactly as many), the share of k-th calls that follow the (k-1)-th reply, the controls (the code
withheld, the first reply a lie, answering at once) and the log-probability of the right first call before and
after training (credit that reached the first turn from a reward given at the end). Its figures go to
OUT/learning-hops.json (and -async), its curves to OUT/curves-hops.png. `--mask-first-turn` is its ablation: the
agent's first turn is not trained on. The door-codes description follows.

The task (`prompt_r1.tasks.door_codes`, `prompt_r1.tasks.door_training`): only the environment knows the codes, and the table
is redrawn at every step, so no policy that ignores the reply beats a guess (1 in 8). The reward (the `reference`
preset) pays 1 for asking about the question's door and copying the reply's code, 0 for a well-formed episode that
does not, and −0.4 for answering at once (one turn never reaches the format gate). Each seed builds its own tiny
agent (fine-tuned to read the question and the reply, to prefer no behaviour, and checked for both; its heads 32
wide, `SERVED_SHAPE`, so that vLLM's CPU build serves it too), and trains it with GRPO against the scripted
environment on 127.0.0.1. A run is reproducible: the same seed and flags give the same figures on the same machine
and thread count. `--work DIR` keeps the agents, so that a later run with other flags, or the async one, reuses them
(`--build-only` builds them and stops). The figures are saved after every seed: a run stopped early keeps its seeds.

`--async` trains the same agents with the asynchronous trainer (`prompt_r1.tasks.door_async`): a vLLM CPU server
per seed (started for the seed, always stopped after it), each group of episodes playing a table of its own (groups
run across steps), the same KL term (`--beta`; `--loss-type` and `--mask-truncated` are refused, the async
trainer has neither), and `--max-staleness` (default 4, the async trainer's own default, at which its throughput
was measured). Its figures go to OUT/learning-async.json and OUT/curves-async.png, beside a synchronous run's;
when OUT/learning.json (or `--compare FILE`) holds one, the two are printed side by side: each seed's gain, sync
and async, the sync run's spread of gains, and a verdict per seed (within, above or below that spread; collapsed
or not). An async run is not reproducible: the trainer and the rollout worker interleave by timing (which policy
version samples which group, which samples come too late and are dropped), and the server samples concurrent
requests in arrival order.
What can be seeded is: the agents, every group's table (the seed and the group's index), the training rows' order,
the trainer, and the server's sampling seed. `--async --processes N` trains across N processes (`accelerate launch`
with training/accelerate/fsdp2.yaml, `async_ranks.py`: rank 0 runs the rollout worker, each step's `--batch`
episodes split across the ranks); its figures go to OUT/learning-async-Np.json and OUT/curves-async-Np.png.

Per seed (one line each, after the trainer's own progress lines on stderr):
- the mean total reward of the first ten and the last ten steps, and their difference (the gain);
- over the same windows, the share of episodes that asked about the question's door, and the share answered
  correctly with the code the environment gave for that door in the episode (correct from the reply);
- the evaluation before and after training on a table training never saw (every door, 8 samples each): correct
  from the reply, and the controls: the trained agent with the code withheld from the reply (any agent can only
  guess: right 12% of the time) and lied to (an agent whose answers come from the reply is then never right);
- collapse: the last ten steps' reward more than 0.3 below the best ten-step window, or the agent worse at
  answering from the reply after training than before;
- async only: the staleness of the samples trained on (mean, max), the samples dropped as too stale, and the range
  of the importance ratio.
The curves (mean over seeds, range shaded) go to OUT/curves.png, the figures to OUT/learning.json. The last line:
    learning: mean gain +0.42 (min +0.31 over 3 seeds), first 10 vs last 10 steps; correct from the reply +45 points
    (min +30, >= 30 on 3/3); reply withheld 11% (max 14%, chance 12%), lied to 2% (max 4%); 0 collapsed

Ablations, each a flag: `--train-env-tokens` trains on the environment's tokens as if the agent wrote them
(env_mask forced to 1); `--no-format-gate` counts the answer whatever the format; `--beta`, `--lr`, `--loss-type`,
`--mask-truncated` change the GRPO settings (the defaults are `prompt_r1.tasks.door_training.grpo_config`'s).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmark's own modules beside it

import learning_hops  # noqa: E402
from learning_common import COLLAPSE, GRPO_FIELDS, HELD_OUT_STEP, WINDOW, async_figures  # noqa: E402

DEFAULT_STALENESS = 4  # the async trainer's own default (TRL's), at which its throughput was measured
SERIES = ("door/asked_right", "door/correct", "door/correct_from_reply", "frac_reward_zero_std")


def build_agent(seed: int, args: argparse.Namespace, work: Path) -> dict:
    """The seed's agent in WORK/model-SEED, built unless an agent of the same build is there: its build figures
    (`door_build.json`), or {"build_error": ...}."""
    from prompt_r1.tasks.door_codes import SERVED_SHAPE, DoorBuildError, build_door_model

    model = work / f"model-{seed}"  # the seed's agent, built once and shared by the variants
    marker = model / "door_build.json"  # written last: a half-built agent, or one built otherwise, is rebuilt
    build = json.loads(marker.read_text()) if marker.is_file() else {}
    if build.get("steps") != args.sft_steps or build.get("shape") != SERVED_SHAPE:
        try:
            build_door_model(model, seed=seed, steps=args.sft_steps, **SERVED_SHAPE)
        except DoorBuildError as exc:  # reported with the seed's figures, not a lost run
            return {"seed": seed, "build_error": str(exc)}
        build = json.loads(marker.read_text())
    return build


def train_seed(seed: int, args: argparse.Namespace, work: Path, **settings) -> dict:
    """Build the seed's agent, train it on the task, and return its per-step series and end-of-run figures."""
    from prompt_r1.tasks.door_codes import DoorTable, door_environment, training_rows
    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.training.shared.progress import step_series

    build = build_agent(seed, args, work)
    if "build_error" in build:
        return build
    if args.build_only:
        return {"seed": seed, "build": build}
    model = work / f"model-{seed}"
    table = DoorTable(seed)
    rows = training_rows(args.steps * args.batch // args.group + args.batch, seed=seed)
    run_dir = work / f"run-{seed}-{'async-' if args.async_grpo else ''}{len(list(work.glob('run-*')))}"
    common = dict(
        per_device_train_batch_size=args.batch,
        num_generations=args.group,
        max_steps=args.steps,
        seed=seed,
        data_seed=seed,
        **settings,
    )
    extra: dict = {}
    with ScriptedServer({"env": door_environment(table)}, record=False) as server:
        if args.async_grpo:
            from prompt_r1.tasks.door_async import train_async

            launch = None
            if args.processes > 1:  # FSDP2 across processes: every rank builds the trainer (`door_rank`)
                common["per_device_train_batch_size"] = args.batch // args.processes
                launch = partial(
                    _launch_door,
                    processes=args.processes,
                    model=str(model),
                    seed=seed,
                    rows=len(rows),
                    env_base_url=server.base_url,
                    run_dir=str(run_dir),
                )
            try:
                run = train_async(
                    model,
                    table,
                    rows,
                    server.base_url,
                    run_dir,
                    held_out_step=HELD_OUT_STEP,
                    max_staleness=args.max_staleness,
                    launch=launch,
                    **common,
                )
            except Exception as exc:  # noqa: BLE001 (one seed's failure is its result, not the run's end)
                return {"seed": seed, "build": build, "error": f"{type(exc).__name__}: {exc}"}
            config, log_history = run["config"], run["log_history"]
            before, after, seconds = run["before"], run["after"], run["seconds"]
            extra = {
                "async": async_figures(log_history),
                "max_staleness": args.max_staleness,
                "processes": args.processes,
            }
        else:
            from prompt_r1.tasks.door_training import control, door_trainer, grpo_config

            config = grpo_config(run_dir, model, server.base_url, **common)
            trainer = door_trainer(config, table, rows)
            before = control(trainer, trainer.rollout_func, step=HELD_OUT_STEP)
            started = time.monotonic()
            trainer.train()
            seconds = time.monotonic() - started
            after = control(trainer, trainer.rollout_func, step=HELD_OUT_STEP)
            log_history = trainer.state.log_history
    # The KL to the starting policy, per step: `ref_kl` from the async trainer, `kl` from the synchronous one.
    series = step_series(log_history, extra=SERIES + (("ref_kl",) if args.async_grpo else ("kl",)))

    def ends(key: str) -> tuple[float, float]:
        values = series[key]
        return statistics.fmean(values[:WINDOW]), statistics.fmean(values[-WINDOW:])

    first, last = ends("reward")
    windows = [
        statistics.fmean(series["reward"][i : i + WINDOW]) for i in range(len(series["reward"]) - WINDOW + 1)
    ]
    return {
        "seed": seed,
        "trainer": "async" if args.async_grpo else "sync",
        "build": build,
        "grpo": {k: getattr(config, k, None) for k in GRPO_FIELDS},  # None: a field the async config has not
        "series": series,
        "first": first,
        "last": last,
        "gain": last - first,
        "collapsed": max(windows) - last > COLLAPSE or after["from_reply"] < before["from_reply"],
        "asked_right": ends("door/asked_right"),
        "from_reply": ends("door/correct_from_reply"),
        "env_calls_last": ends("episode/env_calls")[1],
        "before": before,
        "after": after,
        "seconds": seconds,
        **extra,
    }


def _launch_door(keywords: dict, final: Path, *, processes: int, **job) -> dict:
    """The async run across `processes` FSDP2 ranks (`async_ranks.launch_ranks`): its log history and seconds."""
    from async_ranks import launch_ranks

    job = {**job, "keywords": keywords, "final": str(final)}
    return launch_ranks("learning.door_rank", job, processes=processes, folder=Path(job["run_dir"]) / "ranks")


def door_rank(
    model: str, seed: int, rows: int, env_base_url: str, run_dir: str, keywords: dict, final: str
) -> dict:
    """One rank of an async door-codes run across processes: the config, the task's trainer, training, the
    model saved whole (every rank takes part); rank 0's log history and seconds."""
    from prompt_r1.tasks.door_async import door_async_trainer
    from prompt_r1.tasks.door_codes import DoorTable, training_rows
    from prompt_r1.tasks.door_training import grpo_config

    config = grpo_config(run_dir, model, env_base_url, **keywords)
    trainer = door_async_trainer(config, DoorTable(seed), training_rows(rows, seed=seed))
    started = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - started
    trainer.save_model(final)
    return {"log_history": trainer.state.log_history, "seconds": seconds}


def _threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def seed_line(name: str, r: dict) -> str:
    if "series" not in r:
        return f"{name} seed {r['seed']}: not trained: {_why(r)}"
    (a0, a1), (c0, c1) = r["asked_right"], r["from_reply"]
    return (
        f"{name} seed {r['seed']}: reward {r['first']:+.2f} -> {r['last']:+.2f} (gain {r['gain']:+.2f}); asked the "
        f"right door {a0:.0%} -> {a1:.0%}; correct from the reply {c0:.0%} -> {c1:.0%} (evaluated "
        f"{r['before']['from_reply']:.0%} -> {r['after']['from_reply']:.0%}); controls: withheld "
        f"{r['after']['withheld']:.0%}, lied to {r['after']['lying']:.0%}"
        f"{'; COLLAPSED' if r['collapsed'] else ''}; {r['seconds']:.0f} s{_async_part(r)}"
    )


def build_line(r: dict) -> str:
    if "build_error" in r:
        return f"seed {r['seed']}: agent not built: {r['build_error']}"
    b = r["build"]
    return (
        f"seed {r['seed']}: agent built: {b['reading_steps']} reading steps, greedy reading "
        f"{b['greedy_reading']:.0%}, sampled {b['sampled_reading']:.0%} ({b['mixture_attempts']} mixture tries)"
    )


def _async_part(r: dict) -> str:
    if "async" not in r:
        return ""
    a = r["async"]
    return (
        f"; staleness mean {a['staleness_mean']:.2f}, max {a['staleness_max']:.0f}, {a['dropped_stale']:.0f} "
        f"samples dropped; ratio {a['ratio_range'][0]:.3f}-{a['ratio_range'][1]:.3f}"
    )


def _why(r: dict) -> str:
    return r.get("build_error") or r.get("error") or "no figures"


def summary_line(results: list[dict]) -> str:
    from prompt_r1.tasks.door_training import CHANCE

    unbuilt = ""
    for what, key in (("agent build", "build_error"), ("training", "error")):
        failed = [str(r["seed"]) for r in results if key in r]
        if failed:
            unbuilt += f"; {what} failed on seed{'s' if len(failed) > 1 else ''} {', '.join(failed)}"
    results = [r for r in results if "series" in r]
    if not results:
        return "no seed trained" + unbuilt
    gains = [r["gain"] for r in results]
    rises = [100 * (r["after"]["from_reply"] - r["before"]["from_reply"]) for r in results]
    controls = [r["after"]["withheld"] for r in results]
    lied = [r["after"]["lying"] for r in results]
    n = len(results)
    return (
        f"mean gain {statistics.fmean(gains):+.2f} (min {min(gains):+.2f} over {n} seed{'s' if n != 1 else ''}), "
        f"first {WINDOW} vs last {WINDOW} steps; correct from the reply {statistics.fmean(rises):+.0f} points "
        f"(min {min(rises):+.0f}, >= 30 on {sum(r >= 30 for r in rises)}/{n}); reply withheld "
        f"{statistics.fmean(controls):.0%} (max {max(controls):.0%}, chance {CHANCE:.0%}), lied to "
        f"{statistics.fmean(lied):.0%} (max {max(lied):.0%}); "
        f"{sum(r['collapsed'] for r in results)} collapsed" + unbuilt
    )


def comparison(sync: list[dict], runs: list[dict], after_key=lambda r: r["after"]["from_reply"]) -> str:
    """The async seeds beside the sync ones, with the sync spread of gains and a verdict per seed: the gain
    within the spread (or above it, or below), and whether the seed collapsed. The last line is the verdict."""
    sync = [r for r in sync if "series" in r]
    by_seed = {r["seed"]: r for r in sync}
    if not sync:
        return "no synchronous seed to compare with"
    low, high = min(r["gain"] for r in sync), max(r["gain"] for r in sync)
    lines = [
        f"{'seed':>6}  {'sync gain':>9}  {'async gain':>10}  {'evaluated after, sync / async':>29}  verdict",
    ]
    ok = collapsed = 0
    for r in runs:
        if "series" not in r:
            lines.append(f"{r['seed']:>6}  not trained: {_why(r)}")
            continue
        s = by_seed.get(r["seed"])
        place = "below" if r["gain"] < low else "above" if r["gain"] > high else "within"
        ok += place != "below" and not r["collapsed"]
        collapsed += r["collapsed"]
        verdict = f"{place} the sync spread" + ("; COLLAPSED" if r["collapsed"] else "")
        sync_gain = f"{s['gain']:+.2f}" if s else "-"
        evaluated = f"{after_key(s):.0%} / " if s else "- / "
        evaluated += f"{after_key(r):.0%}"
        lines.append(f"{r['seed']:>6}  {sync_gain:>9}  {r['gain']:>+10.2f}  {evaluated:>29}  {verdict}")
    trained = [r for r in runs if "series" in r]
    mean = statistics.fmean(r["gain"] for r in trained) if trained else math.nan
    lines.append(
        f"async vs sync: mean gain {mean:+.2f} vs {statistics.fmean(r['gain'] for r in sync):+.2f}; sync spread "
        f"{low:+.2f} to {high:+.2f} over {len(sync)} seeds; {ok}/{len(trained)} async seeds within or above it "
        f"without collapsing; {collapsed} collapsed (sync: {sum(r['collapsed'] for r in sync)})"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--task",
        choices=("door-codes", "hops"),
        default="door-codes",
        help="door-codes: one call; hops: a chain of 1-3 dependent calls (default: %(default)s)",
    )
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds")
    parser.add_argument("--seed0", type=int, default=0, help="first seed")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once, each in its own process")
    parser.add_argument("--batch", type=int, default=32, help="episodes per step")
    parser.add_argument("--group", type=int, default=8, help="episodes per question (GRPO's group)")
    parser.add_argument("--lr", type=float, help="learning rate (default: grpo_config's)")
    parser.add_argument("--beta", type=float, help="KL coefficient (default: grpo_config's)")
    parser.add_argument("--loss-type", help="TRL's loss_type (default: grpo_config's)")
    parser.add_argument(
        "--mask-truncated",
        action="store_true",
        help="mask_truncated_completions: cut-off episodes not trained on",
    )
    parser.add_argument(
        "--sft-steps", type=int, default=300, help="fine-tuning steps per round of each agent"
    )
    parser.add_argument("--train-env-tokens", action="store_true", help="ablation: env_mask forced to 1")
    parser.add_argument(
        "--no-format-gate", action="store_true", help="ablation: the answer counts regardless"
    )
    parser.add_argument(
        "--mask-first-turn",
        action="store_true",
        help="ablation (hops): the agent's first turn is not trained on",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "prompt-r1-learning",
        help="where the figures and curves go (default: %(default)s, outside the repository)",
    )
    parser.add_argument("--work", type=Path, help="keep the agents and runs here (reused by a later run)")
    parser.add_argument(
        "--async",
        dest="async_grpo",
        action="store_true",
        help="train with the async trainer (a vLLM CPU server per seed)",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=DEFAULT_STALENESS,
        help="async: the most policy versions a trained sample may lag (default: %(default)s)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="async: trainer processes (accelerate launch with training/accelerate/fsdp2.yaml; --batch split "
        "across them); default: %(default)s, in this process",
    )
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="build the seeds' agents into --work and stop (a later run, sync or async, trains them)",
    )
    parser.add_argument(
        "--compare",
        type=Path,
        help="a synchronous run's learning.json to print beside the async one (default: OUT/learning.json)",
    )
    args = parser.parse_args()
    if args.steps < 2 * WINDOW:
        parser.error(f"--steps must be at least {2 * WINDOW} (the first and last {WINDOW} are compared)")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.seeds < 1 or args.batch < 1 or args.group < 2 or args.batch % args.group:
        parser.error("need --seeds >= 1, --group >= 2 and --batch a multiple of --group")
    if args.async_grpo and (args.loss_type or args.mask_truncated):
        parser.error("--loss-type and --mask-truncated are settings the async trainer does not have")
    if args.processes < 1 or (args.processes > 1 and not args.async_grpo):
        parser.error("--processes N (N > 1) trains the async trainer across processes: add --async")
    if args.batch % args.processes or (args.batch // args.processes) < 1:
        parser.error("--batch must be a multiple of --processes (each process trains an equal share)")
    if args.processes > 1 and args.task != "door-codes":
        parser.error("--processes runs the door-codes task (--task hops runs in one process)")
    if args.max_staleness < 0:
        parser.error("--max-staleness must be at least 0")
    if args.build_only and args.work is None:
        parser.error("--build-only needs --work (where the agents are kept)")
    if args.mask_first_turn and (args.task != "hops" or args.async_grpo):
        parser.error("--mask-first-turn is an ablation of the synchronous hops task (--task hops)")
    hops = args.task == "hops"
    task = learning_hops if hops else sys.modules[__name__]

    from prompt_r1.runs.manifest import git_commit
    from prompt_r1.training.shared.progress import CURVES, draw_curves

    settings = {"learning_rate": args.lr, "beta": args.beta, "loss_type": args.loss_type}
    settings = {k: v for k, v in settings.items() if v is not None}
    if args.mask_truncated:
        settings["mask_truncated_completions"] = True
    if args.train_env_tokens:
        settings["train_on_environment_tokens"] = True
    if args.no_format_gate:
        settings["reward_format_gate"] = False
    shown = {**settings, **({"mask_first_turn": True} if args.mask_first_turn else {})}
    name = "baseline" if not shown else ", ".join(f"{k}={v}" for k, v in shown.items())
    if args.async_grpo:
        processes = f", {args.processes} processes" if args.processes > 1 else ""
        name = f"async (max_staleness={args.max_staleness}{processes})" + (f", {name}" if settings else "")
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = ("-hops" if hops else "") + ("-async" if args.async_grpo else "")
    suffix += f"-{args.processes}p" if args.processes > 1 else ""
    results: list[dict] = []
    commit = git_commit(mark_changes=True)

    def done(result: dict) -> None:
        """One seed finished: its line, and the figures so far saved (a run stopped early keeps its seeds)."""
        results.append(result)
        results.sort(key=lambda r: r["seed"])
        if args.build_only:
            print(task.build_line(result), flush=True)
            return
        print(task.seed_line(name, result), flush=True)
        record = {"task": args.task, "settings": shown, "steps": args.steps, "results": results}
        record["commit"] = commit  # the code the figures came from (`+changes`: not all of it committed)
        if args.async_grpo:
            record["max_staleness"] = args.max_staleness
        (args.out / f"learning{suffix}.json").write_text(json.dumps(record, indent=1))

    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        seeds = range(args.seed0, args.seed0 + args.seeds)
        if args.jobs == 1:
            for seed in seeds:
                print(f"== {name}, seed {seed}", file=sys.stderr, flush=True)
                done(task.train_seed(seed, args, work, **settings))
        else:  # seeds in parallel processes, the cores shared out (a thread count of its own: see docs/benchmarks.md)
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            threads = max(1, (os.cpu_count() or 1) // args.jobs)
            with ProcessPoolExecutor(
                args.jobs,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_threads,
                initargs=(threads,),
            ) as pool:
                futures = [pool.submit(task.train_seed, seed, args, work, **settings) for seed in seeds]
                for future in as_completed(futures):
                    done(future.result())
    if args.build_only:
        return 0
    draw_curves(
        [r["series"] for r in results if "series" in r],
        args.out / f"curves{suffix}.png",
        title=f"{args.task}, {name}: mean and range over {len(results)} seeds",
        curves=(*CURVES, *learning_hops.CURVES)
        if hops
        else (*CURVES, ("correct from the reply", "door/correct_from_reply")),
    )
    print(f"curves and figures in {args.out}")
    label = "learning" if name == "baseline" else f"learning ({name})"
    print(f"{label}: {task.summary_line(results)}")
    compare = args.compare or args.out / f"learning{'-hops' if hops else ''}.json"
    if args.async_grpo and compare.is_file():
        after_key = learning_hops.after_key if hops else (lambda r: r["after"]["from_reply"])
        print(comparison(json.loads(compare.read_text())["results"], results, after_key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
