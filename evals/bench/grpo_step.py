"""Time per GRPO step: Prompt-R1's multi-turn rollout versus TRL's own single-turn GRPO, side by side in one run.

    python evals/bench/grpo_step.py [--steps 6] [--batch 8] [--latency 0.2] [--hidden 64]

Both trainers use the same tiny model, batch, group size and optimizer. The multi-turn run plays the two-turn
name task against a scripted environment on 127.0.0.1 whose every reply takes `--latency` seconds; the
single-turn run has TRL generate, in one call, as many tokens per completion as the multi-turn agent generated
(its mean over the run, forced with min_new_tokens). Printed: seconds per step (median over the steps after the
first), agent tokens per second, and the ratio multi-turn / single-turn, for the simulated latency and for a
zero-latency environment (orchestration cost alone). On CPU the tiny model makes generation cheap, so the
environment's latency dominates; the ratio at latency 0 is the loop's own overhead.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

NAME_QUESTION = "Which name does the item have?"
TURN_1 = "<think>ask</think><interaction_prompt>Which name?</interaction_prompt>"
RESPONSE = "The name is Ada."
NAMES = ("Ada", "Bob", "Cy", "Dee")


def _median_step(trainer) -> float:
    times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
    return statistics.median(times[1:] if len(times) > 1 else times)


def multi_turn(model: Path, args, latency: float, out: Path) -> tuple[float, float]:
    from prompt_r1.prompts import question_message
    from prompt_r1.testing import ScriptedServer
    from prompt_r1.training.config import PromptR1GRPOConfig
    from prompt_r1.training.trainer import build_trainer

    rows = [
        {"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}], "golden_answers": ["Ada"]}
    ]
    with ScriptedServer({"env": lambda body: RESPONSE}, latency=latency) as server:
        config = PromptR1GRPOConfig(
            output_dir=str(out),
            model_name_or_path=str(model),
            env_model="env",
            env_base_url=server.base_url,
            env_api_key_env="PROMPT_R1_BENCH_NO_KEY",
            per_device_train_batch_size=args.batch,
            num_generations=args.batch,
            max_steps=args.steps,
            max_turns=2,
            max_turn_tokens=24,
            max_total_tokens=96,
            learning_rate=1e-4,
            temperature=1.0,
            reward_preset="reference",
            logging_steps=1,
            report_to="none",
            use_cpu=True,
            save_strategy="no",
            seed=0,
        )
        trainer = build_trainer(config, train_rows=rows * (args.batch * args.steps))
        trainer.train()
    tokens = statistics.mean(
        h["completions/mean_length"] for h in trainer.state.log_history if "step_time" in h
    )
    return _median_step(trainer), tokens


def single_turn(model: Path, args, tokens: int, out: Path) -> float:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from prompt_r1.prompts import question_message

    rows = [{"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}]}] * (
        args.batch * args.steps
    )
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.batch,
        num_generations=args.batch,
        max_steps=args.steps,
        max_completion_length=tokens,
        generation_kwargs={"min_new_tokens": tokens},
        learning_rate=1e-4,
        temperature=1.0,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=[lambda completions, **_: [float(len(c[0]["content"]) % 3) for c in completions]],
        args=config,
        train_dataset=Dataset.from_list(rows),
    )
    trainer.train()
    return _median_step(trainer)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8, help="episodes per step (one group)")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per environment reply")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size of the tiny model")
    args = parser.parse_args()

    from prompt_r1.tiny_models import build_protocol_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        episodes = [
            (NAME_QUESTION, TURN_1, RESPONSE, f"<think>ok</think><answer>{n}</answer>") for n in NAMES
        ]
        model = build_protocol_model(tmp / "model", episodes, hidden_size=args.hidden, steps=150)
        print(f"built the tiny protocol model in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        results = []
        for latency in (args.latency, 0.0):
            step, tokens = multi_turn(model, args, latency, tmp / f"multi-{latency}")
            results.append((latency, step, tokens))
        n = max(1, round(statistics.mean(t for _, _, t in results)))
        base = single_turn(model, args, n, tmp / "single")

    print(f"\nGRPO step time, {args.batch} episodes per step, median of steps 2..{args.steps} (CPU, 2 cores)")
    print(f"{'run':44} {'s/step':>8} {'agent tok/s':>12} {'ratio':>7}")
    print(
        f"{'TRL single-turn GRPO, ' + str(n) + ' tokens per completion':44} {base:8.3f} {args.batch * n / base:12.1f} {1.0:7.2f}"
    )
    for latency, step, tokens in results:
        label = f"Prompt-R1 two-turn rollout, env latency {latency:.2f} s"
        print(f"{label:44} {step:8.3f} {args.batch * tokens / step:12.1f} {step / base:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
