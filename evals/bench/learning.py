"""Does GRPO teach the agent to collaborate? Learning curves on the door-codes task, over several seeds.

    python evals/bench/learning.py [--seeds 3] [--steps 100] [--train-env-tokens] [--no-format-gate] [--ablations]

The task (`prompt_r1.testing.door_codes`): only the environment knows the codes, and it gives a door's code when the
prompt names that door; the reward (the `reference` preset) pays 1 for asking about the question's door and
copying the reply's code, 0 for a well-formed episode that does not, and −0.4 for answering at once (one turn never
reaches the format gate). Each seed builds its own tiny agent, fine-tuned to read the question and the reply but
to prefer no behaviour (two stages, see `prompt_r1.testing.door_codes`), and trains it with GRPO against the scripted
environment on 127.0.0.1. `--work DIR` keeps the agents, so that a later run with other flags reuses them.

Printed per seed and step (the trainer's own progress lines, on stderr), then per seed: the mean total reward of
the first ten and the last ten steps and their difference (the gain), the share of episodes that asked about the
right door, and the environment calls per episode. The curves (mean over seeds, range shaded) go to
OUT/curves.png. The last line reads
    learning: mean gain +0.42 (min +0.31 over 3 seeds), first 10 vs last 10 steps

Ablations, each a flag: `--train-env-tokens` trains on the environment's tokens as if the agent wrote them
(env_mask forced to 1); `--no-format-gate` counts the answer whatever the format. `--ablations` runs the
baseline and both, and prints a table of their gains before the baseline's line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[2]
WINDOW = 10  # steps averaged at each end of the curve


def train_seed(seed: int, args: argparse.Namespace, work: Path, **ablation) -> dict:
    """Build the seed's agent, train it on the task, and return its per-step series and end-of-run figures."""
    from prompt_r1.testing.door_codes import (
        build_door_model,
        door_codes,
        door_environment,
        grpo_config,
        training_rows,
    )
    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.training.progress import step_series
    from prompt_r1.training.trainer import build_trainer

    model = work / f"model-{seed}"  # the seed's agent, built once and shared by the variants
    built = model / f"built-{args.sft_steps}-no-facts"  # written last: a half-built or older agent is rebuilt
    if not built.is_file():
        build_door_model(model, seed=seed, steps=args.sft_steps)
        built.write_text("")
    codes = door_codes(seed)
    rows = training_rows(args.steps * args.batch // args.group + args.batch, seed=seed, codes=codes)
    with ScriptedServer({"env": door_environment(codes)}, record=False) as server:
        config = grpo_config(
            work / f"run-{seed}-{len(list(work.glob('run-*')))}",
            model,
            server.base_url,
            per_device_train_batch_size=args.batch,
            num_generations=args.group,
            max_steps=args.steps,
            learning_rate=args.lr,
            seed=seed,
            data_seed=seed,
            **ablation,
        )
        trainer = build_trainer(config, train_rows=rows)
        rollout = trainer.rollout_func
        asked_right, episodes = [], 0
        original = rollout.to_trajectories

        def count(results, tokenizer):  # the share of episodes that asked about the question's own door
            nonlocal episodes
            from prompt_r1.testing.door_codes import named_doors

            right = 0
            for episode in results:
                door = named_doors(episode.question)[0]
                prompts = [t.get("prompt") or "" for t in episode.turns]
                right += any(named_doors(p) == [door] for p in prompts)
            asked_right.append(right / max(1, len(results)))
            episodes += len(results)
            return original(results, tokenizer)

        rollout.to_trajectories = count
        started = time.monotonic()
        trainer.train()
        seconds = time.monotonic() - started
    series = step_series(trainer.state.log_history)
    total = series["reward"]
    first, last = statistics.fmean(total[:WINDOW]), statistics.fmean(total[-WINDOW:])
    return {
        "seed": seed,
        "series": series,
        "asked_right": asked_right,
        "first": first,
        "last": last,
        "gain": last - first,
        "asked_right_first": statistics.fmean(asked_right[:WINDOW]),
        "asked_right_last": statistics.fmean(asked_right[-WINDOW:]),
        "env_calls_last": statistics.fmean(series["episode/env_calls"][-WINDOW:]),
        "seconds": seconds,
        "episodes": episodes,
    }


def run_variant(name: str, args: argparse.Namespace, work: Path, **ablation) -> list[dict]:
    results = []
    for seed in range(args.seed0, args.seed0 + args.seeds):
        print(f"== {name}, seed {seed}", file=sys.stderr, flush=True)
        result = train_seed(seed, args, work, **ablation)
        results.append(result)
        print(
            f"{name} seed {seed}: reward {result['first']:+.2f} -> {result['last']:+.2f} (gain {result['gain']:+.2f}); "
            f"asked about the right door {result['asked_right_first']:.0%} -> {result['asked_right_last']:.0%}; "
            f"env calls/episode at the end {result['env_calls_last']:.2f}; {result['seconds']:.0f} s",
            flush=True,
        )
    return results


def summary_line(results: list[dict]) -> str:
    gains = [r["gain"] for r in results]
    return (
        f"mean gain {statistics.fmean(gains):+.2f} (min {min(gains):+.2f} over {len(gains)} "
        f"seed{'s' if len(gains) != 1 else ''}), first {WINDOW} vs last {WINDOW} steps"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed0", type=int, default=0, help="first seed")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32, help="episodes per step")
    parser.add_argument("--group", type=int, default=8, help="episodes per question (GRPO's group)")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--sft-steps", type=int, default=300, help="fine-tuning steps (per stage) of each agent"
    )
    parser.add_argument("--train-env-tokens", action="store_true", help="ablation: env_mask forced to 1")
    parser.add_argument(
        "--no-format-gate", action="store_true", help="ablation: the answer counts regardless"
    )
    parser.add_argument("--ablations", action="store_true", help="the baseline and both ablations")
    parser.add_argument("--out", type=Path, default=ROOT / "evals/bench/results/learning")
    parser.add_argument("--work", type=Path, help="keep the agents and runs here (reused by a later run)")
    args = parser.parse_args()
    if args.steps < 2 * WINDOW:
        parser.error(f"--steps must be at least {2 * WINDOW} (the first and last {WINDOW} are compared)")

    from prompt_r1.training.progress import draw_curves

    variants = {"baseline": {}}
    if args.ablations or args.train_env_tokens:
        variants["env tokens trained"] = {"train_on_environment_tokens": True}
    if args.ablations or args.no_format_gate:
        variants["no format gate"] = {"reward_format_gate": False}
    if not args.ablations and (args.train_env_tokens or args.no_format_gate):
        variants.pop("baseline")
    args.out.mkdir(parents=True, exist_ok=True)
    outcomes = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for name, ablation in variants.items():
            outcomes[name] = run_variant(name, args, work, **ablation)
            slug = name.replace(" ", "-")
            draw_curves(
                [r["series"] for r in outcomes[name]],
                args.out / ("curves.png" if name == "baseline" else f"curves-{slug}.png"),
                title=f"door codes, {name}: mean and range over {args.seeds} seeds",
            )
    record = {
        name: [{k: v for k, v in r.items() if k != "series"} | {"series": r["series"]} for r in results]
        for name, results in outcomes.items()
    }
    slug = "" if "baseline" in outcomes else "-" + "-".join(n.replace(" ", "-") for n in outcomes)
    (args.out / f"learning{slug}.json").write_text(
        json.dumps(record, indent=1)
    )  # a baseline run, or the ablations alone
    print(f"curves and figures in {args.out}")
    if len(outcomes) > 1:
        print(
            "| variant | reward, first 10 | reward, last 10 | mean gain | min gain | right door, last 10 | env calls, last 10 |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, results in outcomes.items():
            gains = [r["gain"] for r in results]
            print(
                f"| {name} | {statistics.fmean(r['first'] for r in results):+.2f} | "
                f"{statistics.fmean(r['last'] for r in results):+.2f} | "
                f"{statistics.fmean(gains):+.2f} | {min(gains):+.2f} | "
                f"{statistics.fmean(r['asked_right_last'] for r in results):.0%} | "
                f"{statistics.fmean(r['env_calls_last'] for r in results):.2f} |"
            )
    name = "baseline" if "baseline" in outcomes else next(iter(outcomes))
    label = "learning" if name == "baseline" else f"learning ({name})"
    print(f"{label}: {summary_line(outcomes[name])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
