"""A real agent that learns to prompt a real model: the notes task (prompt_r1.tasks.notes) on the built-in
SmolLM2-135M-Instruct as agent and as environment, trained with GRPO, against direct prompting and the prompt
optimisers on held-out questions.

    python evals/bench/real_agent.py --seed0 S --seeds N [--async] [--out DIR]    # train N seeds, then compare
    python evals/bench/real_agent.py --seed-list S1,S2,S3 [--out DIR]            # these seeds, then compare
    python evals/bench/real_agent.py --eval-only [--questions N] [--seed S]       # the shipped agent, no training

Per seed: the cold start (LoRA on format demonstrations from the training pool: prompt_r1.tasks.notes_agent),
then `--steps` GRPO steps (prompt_r1.tasks.notes_training; a line per step), the adapters saved under
OUT/seed-S/. `--async`: the GRPO steps with the asynchronous trainer instead (prompt_r1.tasks.notes_async: a
sheet per group of episodes, the policy served by a vLLM server of its own; the `vllm` extra), under
OUT/seed-S/grpo-async (a seed's cold start is reused from OUT when its settings are the same). The cold start's
demonstrations: `--ask-again` (the share that asks again after a builder reply), `--kind-thoughts` (thoughts
that name what the question asks for, with the turn cap at 64 tokens, `--turn-tokens`; with `--eval-only`, the
cap the shipped agent was trained with), `--plan-thoughts` (thoughts after a reply that end with the choice made,
"I ask where X was born." or "I answer X.", the cap at 80) and `--served-replies` (the built-in environment's replies in them, on
training-pool sheets, in place of scripted ones); `--generations` sets the samples per question in a step (a GRPO group;
the step keeps its 16 episodes). With `--eval-only`, the settings of training (`--seed0 --seeds --seed-list --steps
--cold-steps --ask-again --kind-thoughts --plan-thoughts --served-replies --generations --async`) are refused. Then one table on `--questions`
held-out questions (evaluation pool, drawn from `--eval-seed`, half of them 2-call): direct, instruction, OPRO and
GEPA (their search budget in metric calls: as many as the episodes one seed trained on, with `--eval-only` the
shipped agent's, read from its adapter's record; `--search-budget`), each seed's cold-started and trained agent,
and the controls (the trained agent with the notes withheld; answering at once: its first turn guided into the
answer's tags, `--agent-guide-calls 0`, so that it answers from what it knows).
Agents decode greedily; the environment is greedy.
Work already done under OUT is reused, so that a run cut short, or seeds added later (`--seeds 3` after `--seeds
1`, the same `--seed0`, `--eval-seed` and settings), redo only what is missing: a seed's cold start and its GRPO run
of the same settings (their records, cold_start.json and run.json, are written last), and each table row, kept
under OUT/rows by what decides it (evals/bench/kept_rows.py: the method, the agent's and the environment's model
folders, the held-out draw, the loop's caps, the search budget, the code that plays and scores an episode; code
outside it is not seen). A line says what was reused; real_agent.json, which GRPO runs were, and whether the seeds
were drawn, named or listed. Each seed's targets are read against its own cold start and, with several seeds,
against the best cold start of any.
The trained row evaluates the float32 merge of a run; the shipped agent (`--eval-only`) is its float16 adapters.
Seeds not given are drawn at run time and printed. Figures go to OUT/real_agent.json, curves to
OUT/curves.png; OUT defaults to a folder under the system's temporary directory, outside the checkout.

Last line: `comparison: direct E1/E2, instruction E1/E2, opro ..., gepa ..., untrained ..., trained ...` (EM in
percent on 1-call/2-call questions; agents: the mean over seeds). Run it alone: 2 cores, minutes per step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmark's own modules beside it

from kept_rows import KeptRows, model_digest  # noqa: E402

from prompt_r1.agents.trained import TRAINED_AGENTS, adapter_folders  # noqa: E402
from prompt_r1.tasks.notes_agent import ASK_AGAIN, COLD_STEPS  # noqa: E402
from prompt_r1.tasks.notes_eval import (  # noqa: E402
    INSTRUCTION,
    agent_method,
    env_method,
    held_out,
    search_instruction,
    summary,
)
from prompt_r1.tasks.notes_training import ENV_MODEL, TOTAL_TOKENS, TURN_TOKENS  # noqa: E402

BASELINES = ("direct", "instruction", "opro", "gepa")
RISE = 15  # points of 2-call EM over the best untrained baseline (the target)
CURVES = (
    ("reward", "reward"), ("EM", "notes/em"), ("EM, 2-call", "notes/em_2"), ("calls", "notes/calls"),
    ("calls, 1-call", "notes/calls_1"), ("calls, 2-call", "notes/calls_2"),
)  # fmt: skip
EPISODES_PER_STEP = 16  # 4 questions x 4 samples by default (--generations)
GENERATIONS = 4
STEPS = 20  # GRPO steps per seed
SEEDS = 3
SHIPPED_AGENT = TRAINED_AGENTS["smollm2-135m-notes"]
# The table's loop and environment: calls an episode may make (+ the answer), tokens a reply.
MAX_TURNS, REPLY_TOKENS = 3, 32


# The settings of training (flag: its argument's name, its default), refused with --eval-only, which trains nothing.
TRAINING = {
    "--seed0": ("seed0", None), "--seeds": ("seeds", SEEDS), "--steps": ("steps", STEPS),
    "--cold-steps": ("cold_steps", COLD_STEPS), "--ask-again": ("ask_again", ASK_AGAIN),
    "--kind-thoughts": ("kind_thoughts", False), "--generations": ("generations", GENERATIONS),
    "--async": ("async_grpo", False), "--served-replies": ("served_replies", False),
    "--plan-thoughts": ("plan_thoughts", False), "--seed-list": ("seed_list", None),
}  # fmt: skip


def seed_list(text: str) -> list[int]:
    """`--seed-list`'s seeds: distinct whole numbers, comma-separated."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds are whole numbers separated by commas, got {text!r}"
        ) from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"a seed is named twice in {text!r}")
    return seeds


def say(line: str) -> None:
    print(line, flush=True)


def cold_start_once(seed: int, args: argparse.Namespace, cold: Path) -> dict:
    """The seed's cold start into COLD, unless a finished one of the same settings is there; its record (the
    settings and the minutes it took)."""
    from prompt_r1.tasks import notes_agent

    started = time.monotonic()
    # Written last: a finished cold start of these settings, reused by a rerun with the same ones.
    marker = cold / "cold_start.json"
    made = json.loads(marker.read_text()) if marker.is_file() else {}
    replies = "served" if args.served_replies else "scripted"
    recipe = {"steps": args.cold_steps, "ask_again": args.ask_again, "kinds": args.kind_thoughts,
              "plans": args.plan_thoughts, "replies": replies}  # fmt: skip
    # A marker from before a setting existed: scripted replies, no plan thoughts.
    made = {"replies": "scripted", "plans": False} | made
    if {k: made.get(k) for k in recipe} != recipe:
        marker.unlink(missing_ok=True)  # a redo cut short leaves no marker of the settings it replaced
        notes_agent.cold_start(cold, seed=seed, steps=args.cold_steps, ask_again=args.ask_again,
                               kinds=args.kind_thoughts, plans=args.plan_thoughts, replies=replies,
                               say=lambda line: say(f"seed {seed}: {line}"))  # fmt: skip
        made = {**recipe, "seconds": time.monotonic() - started}
        marker.write_text(json.dumps(made) + "\n")
    return made


def train_seed(seed: int, args: argparse.Namespace, out: Path) -> dict:
    """Cold start, then GRPO, for one seed; the adapters and the merged trained model under OUT/seed-SEED."""
    from prompt_r1.tasks.notes import training_questions
    from prompt_r1.tasks.notes_agent import save_adapter
    from prompt_r1.tasks.notes_training import grpo_config, notes_trainer, training_rows
    from prompt_r1.training.shared.progress import step_series

    work = out / f"seed-{seed}"
    cold = work / "cold"
    made = cold_start_once(seed, args, cold)
    cold_s = made["seconds"]
    started = time.monotonic()
    run = work / ("grpo-async" if args.async_grpo else "grpo")
    # Written last: a finished GRPO run of these settings from this cold start, reused by a rerun with the same.
    record = run / "run.json"
    recipe = {"steps": args.steps, "generations": args.generations, "turn_tokens": args.turn_tokens,
              "cold_start": {k: v for k, v in made.items() if k != "seconds"}}  # fmt: skip
    done = json.loads(record.read_text()) if record.is_file() else {}
    if done.get("recipe") == recipe and (run / "model" / "config.json").is_file():
        minutes = done["result"]["minutes"]
        say(f"seed {seed}: reusing the finished GRPO run in {run} (it took: cold start {minutes['cold_start']:.1f} "
            f"min, training {minutes['training']:.1f} min)")  # fmt: skip
        # The folders where they are now (OUT may have moved since), and the run marked as reused.
        return {**done["result"], "cold_model": str(cold / "model"), "trained_model": str(run / "model"),
                "reused": True}  # fmt: skip
    record.unlink(missing_ok=True)
    rows = training_rows(training_questions(args.steps * EPISODES_PER_STEP // args.generations + 4, seed))
    # 16 episodes a step under either trainer: 16 / G questions (groups) x G samples.
    settings = dict(
        max_steps=args.steps, data_seed=seed, per_device_train_batch_size=4, gradient_accumulation_steps=4,
        max_turn_tokens=args.turn_tokens, num_generations=args.generations,
    )  # fmt: skip
    if args.async_grpo:
        from prompt_r1.tasks.notes_async import train_async

        trained = train_async(cold / "model", rows, run, seed=seed, **settings)
        trainer = trained["trainer"]
    else:
        trainer = notes_trainer(grpo_config(run, cold / "model", seed=seed, **settings), rows)
        trainer.train()
    grpo_s = time.monotonic() - started
    # The async run's training alone (its vLLM server's start aside); the sync run's is the whole stage.
    training_s = trained["seconds"] if args.async_grpo else grpo_s
    save_adapter(trainer.model, run / "adapter", {"stage": "grpo", "seed": seed, "steps": args.steps})
    merged = trainer.model.merge_and_unload()
    merged.save_pretrained(run / "model")
    trainer.processing_class.save_pretrained(run / "model")
    series = step_series(trainer.state.log_history, extra=[key for _, key in CURVES])
    kind = "async" if args.async_grpo else "sync"
    say(f"seed {seed}: cold start {cold_s / 60:.1f} min, GRPO ({kind}) {args.steps} steps {grpo_s / 60:.1f} min "
        f"(training {training_s / 60:.1f} min)")  # fmt: skip
    result = {
        "seed": seed, "trainer": kind, "cold_model": str(cold / "model"), "trained_model": str(run / "model"),
        "cold_start": made, "turn_tokens": args.turn_tokens, "generations": args.generations,
        "minutes": {"cold_start": cold_s / 60, "grpo": grpo_s / 60, "training": training_s / 60}, "series": series,
    }  # fmt: skip
    record.write_text(json.dumps({"recipe": recipe, "result": result}, default=str) + "\n")
    return result


async def compare(args: argparse.Namespace, agents: dict[str, str], budget: int, kept: KeptRows) -> dict:
    """Every method on one held-out draw; `agents`: name -> model folder (or built-in name). Rows `kept` from an
    earlier run are reused, the others computed and kept."""
    from prompt_r1.agents.local import TransformersAgent
    from prompt_r1.agents.model_server import model_server_in_thread
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig

    questions = held_out(args.questions, args.eval_seed)
    loop = LoopConfig(max_turns=MAX_TURNS, max_turn_tokens=args.turn_tokens, max_total_tokens=TOTAL_TOKENS)
    rows: dict[str, list] = {}
    searched: dict[str, dict] = {}
    reused: list[str] = []
    with model_server_in_thread(ENV_MODEL, seed=args.eval_seed) as server:
        client = EnvironmentClient(
            EnvironmentConfig(model=server.name, base_url=server.base_url, max_tokens=REPLY_TOKENS, temperature=0.0,
                              max_in_flight=256),
            api_key="none",
        )  # fmt: skip

        async def method_rows(name: str, key: dict, work) -> dict:
            """The method's kept rows (and search), or computed by `work` and kept."""
            started = time.monotonic()
            value = kept.get(key)
            if value is not None:
                reused.append(name)
                return value
            say(f"{name}: {len(questions)} questions...")  # an agent's row takes minutes on 2 cores
            value = await work()
            kept_now = kept.put(key, value)
            say(
                f"{name}: {time.monotonic() - started:.0f} s{'' if kept_now else ' (a failure in it: not kept)'}"
            )
            return value

        async def instructed(method: str) -> dict:
            if method in ("opro", "gepa"):
                search = await search_instruction(method, client, budget=budget, seed=args.eval_seed)
                return {"rows": await env_method(client, questions, search["instruction"]), "search": search}
            return {
                "rows": await env_method(client, questions, INSTRUCTION if method == "instruction" else "")
            }

        for method in BASELINES:
            value = await method_rows(method, kept.key(method), lambda method=method: instructed(method))
            rows[method] = value["rows"]
            if "search" in value:
                searched[method] = value["search"]
        for name, model in agents.items():
            loaded: dict[bool, TransformersAgent] = {}  # an agent is loaded only when a row of it is not kept

            async def played(withheld=False, at_once=False, model=model, loaded=loaded) -> dict:
                if at_once not in loaded:  # at once: its first turn guided into the answer's tags (guide.py)
                    shared = next(iter(loaded.values()), None)  # the weights, loaded once
                    config = AgentConfig(
                        model=model,
                        temperature=0.0,
                        seed=args.eval_seed,
                        max_new_tokens=args.turn_tokens,
                        guide_calls=0 if at_once else None,
                    )
                    given = {} if shared is None else {"model": shared.model, "tokenizer": shared.tokenizer}
                    loaded[at_once] = TransformersAgent(config, **given)  # fmt: skip
                played_rows = await agent_method(loaded[at_once], client, questions, loop, withheld=withheld)
                return {"rows": played_rows}

            weights = model_digest(model)  # the folder read once for all of its rows
            plays_of = {name: {}}
            if name.startswith("trained"):  # the controls: no notes to ask about; no call made
                plays_of |= {f"{name}, notes withheld": {"withheld": True},
                             f"{name}, answering at once": {"at_once": True}}  # fmt: skip
            for row_name, play in plays_of.items():
                key = kept.key("agent", model, weights=weights, **play)
                work = lambda play=play: played(**play)  # noqa: E731
                rows[row_name] = (await method_rows(row_name, key, work))["rows"]
    if reused:
        say(f"reused from {kept.folder}: {', '.join(reused)}")
    return {
        "questions": len(questions),
        "eval_seed": args.eval_seed,
        "table": {name: summary(r) for name, r in rows.items()},
        "instructions": {
            m: {k: s[k] for k in ("instruction", "score", "metric_calls", "calls")}
            for m, s in searched.items()
        },  # fmt: skip
        "rows": rows,
        "reused": reused,
    }


def print_table(table: dict[str, dict]) -> None:
    say(f"{'method':<34} {'EM':>6} {'F1':>6} {'EM 1':>6} {'EM 2':>6} {'F1 1':>6} {'F1 2':>6} "
        f"{'calls':>6} {'calls 1':>7} {'calls 2':>7} {'tokens':>7} {'at once':>7}")  # fmt: skip
    for name, s in table.items():
        say(f"{name:<34} {s['em']:6.1f} {s['f1']:6.1f} {s['em_1']:6.1f} {s['em_2']:6.1f} {s['f1_1']:6.1f} "
            f"{s['f1_2']:6.1f} {s['calls']:6.2f} {s['calls_1']:7.2f} {s['calls_2']:7.2f} {s['tokens']:7.0f} "
            f"{s['at_once']:7.1f}")  # fmt: skip


def targets(table: dict[str, dict], seeds: list[int]) -> list[str]:
    """The issue's targets, per seed: a line each, met or not, with the figures. A seed's untrained baseline is its
    own cold start, where its GRPO began; with several seeds the line also reads the targets against the best cold
    start of any seed (the stricter reading of "the best untrained baseline")."""
    lines = []
    for seed in seeds:
        suffix = f" {seed}" if len(seeds) > 1 else ""
        name = f"trained{suffix}"
        if name not in table:
            continue
        t = table[name]
        baselines = [*BASELINES, *[k for k in (f"untrained{suffix}",) if k in table]]
        best_2 = max(table[b]["em_2"] for b in baselines)
        best = max(table[b]["em"] for b in baselines)
        lines.append(
            f"seed {seed}: 2-call EM {t['em_2']:.1f} vs best untrained {best_2:.1f} + {RISE} "
            f"({'met' if t['em_2'] >= best_2 + RISE else 'NOT met'}); overall EM {t['em']:.1f} vs best baseline "
            f"{best:.1f} ({'met' if t['em'] >= best else 'NOT met'}); notes withheld EM "
            f"{table[name + ', notes withheld']['em']:.1f} (target <= 5); answering at once EM "
            f"{table[name + ', answering at once']['em']:.1f}"
        )
        every = [k for k in table if k.startswith("untrained") and k != f"untrained{suffix}"]
        if every:  # the stricter reading: the best cold start of any seed in the table
            strict_2 = max(best_2, *(table[k]["em_2"] for k in every))
            strict = max(best, *(table[k]["em"] for k in every))
            lines[-1] += (
                f"; against every seed's cold start: 2-call {strict_2:.1f} + {RISE} "
                f"({'met' if t['em_2'] >= strict_2 + RISE else 'NOT met'}), overall {strict:.1f} "
                f"({'met' if t['em'] >= strict else 'NOT met'})"
            )
    return lines


def comparison_line(table: dict[str, dict]) -> str:
    def mean_of(prefix: str) -> tuple[float, float] | None:
        names = [k for k in table if k.startswith(prefix) and "," not in k]  # the controls' rows aside
        if not names:
            return None
        return tuple(statistics.fmean(table[k][f"em_{c}"] for k in names) for c in (1, 2))  # type: ignore[return-value]

    parts = []
    for name in (*BASELINES, "untrained", "trained"):
        pair = (
            mean_of(name) if name in ("untrained", "trained") else (table[name]["em_1"], table[name]["em_2"])
        )
        if pair is not None and not any(math.isnan(v) for v in pair):
            parts.append(f"{name} {pair[0]:.0f}/{pair[1]:.0f}")
    return "comparison: " + ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed0", type=int, help="first training seed (unset: drawn at run time)")
    parser.add_argument("--seeds", type=int, help=f"how many seeds, from --seed0 on ({SEEDS})")
    parser.add_argument(
        "--seed-list", type=seed_list, help="training seeds, comma-separated, in place of --seed0 and --seeds"
    )
    parser.add_argument("--steps", type=int, help=f"GRPO steps per seed ({STEPS})")
    parser.add_argument("--cold-steps", type=int, help=f"cold-start fine-tuning steps ({COLD_STEPS})")
    parser.add_argument(
        "--ask-again", type=float,
        help=f"the cold start's share of demonstrations that ask again after a builder reply ({ASK_AGAIN})",
    )  # fmt: skip
    parser.add_argument(
        "--generations", type=int,
        help=f"samples of each question in a step (a GRPO group; {GENERATIONS}): 2, 4, 8 or 16, the step's "
        f"{EPISODES_PER_STEP} episodes being {EPISODES_PER_STEP} / N questions",
    )  # fmt: skip
    parser.add_argument(
        "--kind-thoughts", action="store_true", default=None,
        help="the cold start's thoughts name what the question asks for (prompt_r1.tasks.notes_agent)",
    )  # fmt: skip
    parser.add_argument(
        "--plan-thoughts", action="store_true", default=None,
        help="the cold start's thoughts after a reply end with the choice made, naming the next prompt",
    )  # fmt: skip
    parser.add_argument(
        "--served-replies", action="store_true", default=None,
        help="the cold start's demonstrations carry the served environment's replies, not scripted ones",
    )  # fmt: skip
    parser.add_argument(
        "--turn-tokens", type=int,
        help="most tokens an agent turn may take, in training and in the table (unset: the shipped agent's own "
        "with --eval-only; 80 with --plan-thoughts and 64 with --kind-thoughts, whose thoughts are longer; "
        "else 48)",
    )  # fmt: skip
    parser.add_argument("--questions", type=int, default=200, help="held-out questions in the table")
    parser.add_argument("--eval-seed", "--seed", dest="eval_seed", type=int,
                        help="the held-out draw (unset: drawn at run time)")  # fmt: skip
    parser.add_argument(
        "--search-budget", type=int, help="OPRO's and GEPA's metric calls (unset: cost-matched)"
    )
    parser.add_argument(
        "--eval-only", action="store_true", help="the shipped agent and the baselines, no training"
    )
    parser.add_argument(
        "--async", dest="async_grpo", action="store_true", default=None,
        help="GRPO with the asynchronous trainer (its policy served by a vLLM server of its own)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="where figures and models go (default: a temporary folder)")
    args = parser.parse_args(argv)
    # Unset settings of training are None here: given ones are refused with --eval-only, then the defaults filled.
    given = [flag for flag, (name, _) in TRAINING.items() if getattr(args, name) is not None]
    if args.eval_only and given:
        parser.error(f"{', '.join(given)}: settings of training, which --eval-only does not do")
    if args.seed_list is not None and (args.seed0 is not None or args.seeds is not None):
        parser.error("--seed-list names the seeds: give it without --seed0 and --seeds")
    for name, default in TRAINING.values():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if not 0 <= args.ask_again <= 1:
        parser.error(f"--ask-again must be a share from 0 to 1, got {args.ask_again}")
    for flag, value in (("--seeds", args.seeds), ("--steps", args.steps), ("--cold-steps", args.cold_steps)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    if args.generations < 2 or EPISODES_PER_STEP % args.generations:
        parser.error(f"--generations must be 2, 4, 8 or 16 (a group of 2 or more that divides a step's "
                     f"{EPISODES_PER_STEP} episodes), got {args.generations}")  # fmt: skip
    if args.turn_tokens is None and args.eval_only:  # the cap the shipped agent was trained and measured with
        args.turn_tokens = SHIPPED_AGENT.turn_tokens
    elif args.turn_tokens is None:  # kind and plan thoughts are longer
        args.turn_tokens = 80 if args.plan_thoughts else 64 if args.kind_thoughts else TURN_TOKENS
    elif not 1 <= args.turn_tokens <= TOTAL_TOKENS:
        parser.error(
            f"--turn-tokens must be from 1 to {TOTAL_TOKENS} (an episode's cap), got {args.turn_tokens}"
        )
    draw = random.SystemRandom()
    # How the seeds came: drawn here, named by --seed0, or listed (a table's provenance, in real_agent.json).
    seeds_from = "listed" if args.seed_list else "drawn" if args.seed0 is None else "named"
    eval_seed_from = "drawn" if args.eval_seed is None else "named"
    if args.seed0 is None:
        args.seed0 = draw.randrange(1, 10**6)
    if args.eval_seed is None:
        args.eval_seed = draw.randrange(10**6, 2 * 10**6)
    out = args.out or Path(tempfile.mkdtemp(prefix="prompt-r1-real-agent-"))
    out.mkdir(parents=True, exist_ok=True)
    seeds = [] if args.eval_only else args.seed_list or list(range(args.seed0, args.seed0 + args.seeds))
    say(f"real agent: seeds {seeds or '(none: --eval-only)'}{', async GRPO' if args.async_grpo else ''}, "
        f"held-out draw {args.eval_seed}, {args.questions} questions, out {out}")  # fmt: skip
    runs = [train_seed(seed, args, out) for seed in seeds]
    agents = _shipped_agents(out) if args.eval_only else {}
    for run in runs:
        suffix = f" {run['seed']}" if len(runs) > 1 else ""
        agents |= {f"untrained{suffix}": run["cold_model"], f"trained{suffix}": run["trained_model"]}
    # Cost-matched: as many metric calls as the episodes one seed trains on (--eval-only: the shipped agent did).
    budget = args.search_budget or (shipped_steps() if args.eval_only else args.steps) * EPISODES_PER_STEP
    loop = {"max_turns": MAX_TURNS, "reply_tokens": REPLY_TOKENS, "total_tokens": TOTAL_TOKENS}
    kept = KeptRows(out, eval_seed=args.eval_seed, questions=args.questions, turn_tokens=args.turn_tokens,
                    budget=budget, loop=loop, environment=ENV_MODEL)  # fmt: skip
    result = asyncio.run(compare(args, agents, budget, kept))
    print_table(result["table"])
    for line in targets(result["table"], seeds or [0]):
        say(line)
    if runs:
        from prompt_r1.training.shared.progress import draw_curves

        curves = draw_curves(
            [r["series"] for r in runs],
            out / "curves.png",
            f"notes task, GRPO{' (async)' if args.async_grpo else ''}",
            CURVES,
        )
        say(f"curves: {curves}")
    summary_path = out / "real_agent.json"
    provenance = {"seeds_from": seeds_from, "eval_seed_from": eval_seed_from,
                  "reused_runs": [run["seed"] for run in runs if run.get("reused")]}  # fmt: skip
    summary_path.write_text(json.dumps({"seeds": seeds, **provenance, "runs": runs, "search_budget": budget,
                                        "turn_tokens": args.turn_tokens, **result},
                                       indent=1, default=str) + "\n")  # fmt: skip
    say(f"figures: {summary_path}")
    say(comparison_line(result["table"]))
    return 0


def shipped_steps() -> int:
    """The shipped agent's GRPO steps, from its GRPO adapter's record."""
    from prompt_r1.tasks.notes_agent import ADAPTER_RECORD

    records = [json.loads((folder / ADAPTER_RECORD).read_text()) for folder in adapter_folders(SHIPPED_AGENT)]
    (grpo,) = [record for record in records if record.get("stage") == "grpo"]
    return grpo["steps"]


def _shipped_agents(out: Path) -> dict[str, str]:
    """The shipped agent, and its cold start alone (the untrained agent) merged into OUT/shipped-cold."""
    import dataclasses

    from prompt_r1.agents.builtin import resolve_model
    from prompt_r1.agents.trained import merge_into

    agent = SHIPPED_AGENT
    cold = out / "shipped-cold"
    if not (cold / "config.json").is_file():
        merge_into(
            dataclasses.replace(agent, adapters=agent.adapters[:1]), Path(resolve_model(agent.base)), cold
        )
    return {"untrained": str(cold), "trained": resolve_model(agent.name)}


if __name__ == "__main__":
    raise SystemExit(main())
