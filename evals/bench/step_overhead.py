"""The two-turn GRPO step without the model's math: the CPU the loop itself costs per episode-turn, on CPU.

    python evals/bench/step_overhead.py [--episodes 16,64,256] [--steps 3] [--turn-tokens 19] [--profile N]

The synchronous trainer's step of `grpo_step.py` and `grpo_gpu.py` (the two-turn name task, the same config from
`TINY_GRPO`, one group of `--episodes` per step) with the model's work taken out: the policy's generate costs
nothing (`CannedPolicy`: canned token ids of the real length, `--turn-tokens` per turn, as many as the GPU run's
agent writes), and so does the training step (nothing is trained). What is left is what a GPU step pays outside
the model: TRL's rollout call into `GraphRollout` (the LangGraph loop, the batcher, parsing, tokenising each
environment message, the environment client's HTTP calls, trajectory assembly, the step's episode metrics) and
the reward functions over the step's episodes. The environment is the scripted server at zero latency in a
process of its own, so its CPU is not counted; this process's CPU is (every thread: the event loop's, the
batcher's worker, LangChain's callbacks).

Printed per batch size: CPU ms and wall ms per step (median of `--steps` after one warm-up step), CPU ms per
episode-turn, and that figure over the first size's; the last line reads
`overhead: X ms per episode-turn at 64, Y at 256; 256/64 per episode Z` (target: X and Y at most 2 ms, Z at
most 1, i.e. no worse than linear in the batch). `--profile N` prints cProfile's top N functions by own time
for one step at the largest size, which is where to look when the target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

NAME_QUESTION = "Which name does the item have?"  # the task of grpo_step.py and grpo_gpu.py
TURN_1 = "<think>ask</think><interaction_prompt>Which name?</interaction_prompt>"
TURN_2 = "<think>ok</think><answer>Ada</answer>"


def _canned(tokenizer, text: str, tokens: int) -> list[int]:
    """`text`'s ids with its think padded (one filler token at a time) to at least `tokens` ids."""
    head, tail = text.split("</think>", 1)
    filler = ""
    while len(ids := tokenizer.encode(f"{head}{filler}</think>{tail}", add_special_tokens=False)) < tokens:
        filler += " ask"
    return ids


def canned_policy(tokenizer, turn_tokens: int):
    """A batching backend (what the trainer's policy is) whose generate costs nothing: turn 1 asks the
    environment, turn 2 answers, each `turn_tokens` canned ids with logprob 0."""
    from prompt_r1.agents.base import AgentOutput
    from prompt_r1.agents.batching import BatchingBackend

    turns = [_canned(tokenizer, text, turn_tokens) for text in (TURN_1, TURN_2)]
    texts = [tokenizer.decode(ids) for ids in turns]

    class CannedPolicy(BatchingBackend):
        def __init__(self) -> None:
            super().__init__()
            self.tokenizer, self.default_max_new_tokens = tokenizer, turn_tokens
            self.max_batch_size = 1 << 16

        def _generate_locked(self, batch):
            out = []
            for item in batch:
                turn = min(item.key[1] if item.key is not None else 0, 1)
                ids = turns[turn]
                out.append(
                    AgentOutput(
                        text=texts[turn],
                        token_ids=list(ids),
                        logprobs=[0.0] * len(ids),
                        prompt_tokens=len(item.prompt_ids),
                        completion_tokens=len(ids),
                    )
                )
            return out

    return CannedPolicy


@contextlib.contextmanager
def environment_server():
    """The scripted environment (`python -m prompt_r1.testing.servers`, zero latency) in its own process."""
    server = subprocess.Popen(
        [sys.executable, "-m", "prompt_r1.testing.servers", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield server.stdout.readline().strip()
    finally:
        server.terminate()
        server.wait(30)


def build_step(episodes: int, turn_tokens: int, base_url: str, folder: Path):
    """One step's work: the rollout TRL would call, the rewards over its output, and a training step that costs
    nothing. Returns (step function, rollout)."""
    from transformers import AutoTokenizer

    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.prompts import question_message
    from prompt_r1.testing.tiny_grpo import TINY_GRPO
    from prompt_r1.training.run import trainer_config
    from prompt_r1.training.shared import spend
    from prompt_r1.training.shared.rewards import reward_functions
    from prompt_r1.training.sync import rollout as rollout_module

    config = trainer_config(
        **{
            **TINY_GRPO,
            "output_dir": str(folder / f"run-{episodes}"),
            "model_name_or_path": str(folder / "model"),
            "env_base_url": base_url,
            "per_device_train_batch_size": episodes,
            "num_generations": episodes,
            "max_turn_tokens": turn_tokens + 8,
            "max_total_tokens": 8 * turn_tokens + 256,
            # As grpo_gpu.py: the environment's client limits (defaults: 500 calls a minute, 32 in flight) not
            # in the way of a step's episodes.
            "env_max_in_flight": 256,
            "env_rate_limit": 100_000,
        }
    )
    tokenizer = AutoTokenizer.from_pretrained(config.model_name_or_path)
    policy = canned_policy(tokenizer, turn_tokens)
    environment = spend.paid_environment(
        config, EnvironmentClient(config.environment_config(num_processes=1))
    )
    rollout = rollout_module.GraphRollout(
        environment, loop=config.loop_config(), train_on_environment_tokens=config.train_on_environment_tokens
    )
    rewards = reward_functions(config)
    # What GraphRollout reads of TRL's trainer; the policy is the canned one instead of the trainer's model.
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=0),
        model=SimpleNamespace(training=True),
        args=config,
        accelerator=SimpleNamespace(process_index=0, num_processes=1, device="cpu", state=None),
        processing_class=tokenizer,
        _metrics={"train": defaultdict(list)},
    )
    rollout_module.trainer_policy = lambda trainer, max_new_tokens: contextlib.nullcontext(policy())
    prompts = [[{"role": "user", "content": question_message(NAME_QUESTION)}]] * episodes
    golden = [["Ada"]] * episodes

    def step() -> int:
        """One step; the episode-turns it generated."""
        trainer.state.global_step += 1
        out = rollout(prompts, trainer)
        completions = [tokenizer.decode(ids) for ids in out["completion_ids"]]
        columns = {k: v for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs")}
        for reward in rewards:
            reward(prompts, completions, out["completion_ids"], golden_answers=golden, **columns)
        return sum(rollout.last_batch_sizes)

    return step, rollout


def measure(step, steps: int) -> dict:
    """CPU and wall seconds of each of `steps` steps after a warm-up one, and its episode-turns."""
    step()
    cpu, wall, turns = [], [], []
    for _ in range(steps):
        c0, w0 = time.process_time(), time.perf_counter()
        turns.append(step())
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"cpu": statistics.median(cpu), "wall": statistics.median(wall), "turns": statistics.median(turns)}


def profiled(step, top: int) -> str:
    """cProfile's top `top` functions by own time for one step, in the process-wide event loop's thread (where
    the episodes run) and in this one (rewards, trajectories)."""
    from prompt_r1.core.aio import run_sync

    # CPU time, not wall: a thread waiting (on a disk, a socket) is not overhead the CPU pays.
    loop_profile, main_profile = cProfile.Profile(time.thread_time), cProfile.Profile(time.thread_time)

    async def switch(on: bool) -> None:  # a profiler sees only the thread that enabled it
        loop_profile.enable() if on else loop_profile.disable()

    run_sync(switch(True))
    main_profile.runcall(step)
    run_sync(switch(False))
    text = io.StringIO()
    for name, profile in (("event loop thread", loop_profile), ("main thread", main_profile)):
        text.write(f"--- {name}\n")
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--episodes",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[16, 64, 256],
        help="episodes per step, comma-separated (default: 16,64,256)",
    )
    parser.add_argument("--steps", type=int, default=3, help="timed steps per size, after one warm-up step")
    parser.add_argument(
        "--turn-tokens", type=int, default=19, help="canned agent tokens per turn (GPU run: 19)"
    )
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N for one largest step")
    args = parser.parse_args()
    if args.steps < 1 or min(args.episodes) < 1:
        parser.error("--steps and --episodes must be at least 1")

    from prompt_r1.testing.tiny_models import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp, environment_server() as base_url:
        folder = Path(tmp)
        # Only the tokenizer is used: the task's words in its corpus, as the protocol model's tokenizer has them.
        build_tiny_model(folder / "model", corpus=[NAME_QUESTION, TURN_1, TURN_2, "Response 1: Which name?"])
        rows = {}
        for episodes in args.episodes:
            step, rollout = build_step(episodes, args.turn_tokens, base_url, folder)
            rows[episodes] = measure(step, args.steps)
            rows[episodes]["times"] = dict(rollout.last_times)  # the last step's, as its step line shows it
            if args.profile and episodes == max(args.episodes):
                print(profiled(step, args.profile), file=sys.stderr)

    print(
        f"GRPO step without the model's math (CPU, {len(os.sched_getaffinity(0))} cores, environment at 0 s in "
        f"its own process, {args.turn_tokens} canned tokens per turn), median of {args.steps} steps"
    )
    print(
        f"{'episodes':>8} {'turns':>6} {'CPU ms/step':>11} {'wall ms/step':>12} {'CPU ms/ep-turn':>14} {'x first':>7}"
    )
    first = None
    per_turn = {}
    for episodes, row in rows.items():
        per_turn[episodes] = 1000 * row["cpu"] / row["turns"]
        first = first or per_turn[episodes]
        print(
            f"{episodes:>8} {row['turns']:>6.0f} {1000 * row['cpu']:>11.1f} {1000 * row['wall']:>12.1f} "
            f"{per_turn[episodes]:>14.3f} {per_turn[episodes] / first:>7.2f}"
        )
    from prompt_r1.training.shared.progress import by_turn

    print("the last step's rollout, as the trainer's step line splits it (s): generate, environment, loop")
    for episodes, row in rows.items():
        t = row["times"]
        turns = ", ".join(f"{seconds:.3f}" for seconds in by_turn(t))
        print(
            f"{episodes:>8} rollout {t['rollout']:.3f} = generate {t['generate']:.3f} (by turn {turns}) + "
            f"environment {t['environment']:.3f} + loop {t['loop']:.3f}"
        )
    small, large = (64, 256) if {64, 256} <= per_turn.keys() else (min(per_turn), max(per_turn))
    print(
        f"overhead: {per_turn[small]:.3f} ms per episode-turn at {small}, {per_turn[large]:.3f} at {large}; "
        f"{large}/{small} per episode {per_turn[large] / per_turn[small]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
