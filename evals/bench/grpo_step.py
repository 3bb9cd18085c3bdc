"""Time per GRPO step: Prompt-R1's multi-turn rollout versus TRL's own single-turn GRPO, side by side in one run.

    python evals/bench/grpo_step.py [--steps 6] [--batch 8] [--latency 0.2] [--hidden 64] [--vllm]
    python evals/bench/grpo_step.py --async [--steps 10] [--max-staleness 4]

Both trainers use the same tiny model, batch, group size and optimizer. The multi-turn run plays the two-turn
name task against a scripted environment on 127.0.0.1 whose every reply takes `--latency` seconds; the
single-turn run has TRL generate, in one call, as many tokens per completion as the multi-turn agent generated
(its mean over the run, forced with min_new_tokens). Printed: seconds per step (median over the steps after the
first), agent tokens per second, and the ratio multi-turn / single-turn, for the simulated latency and for a
zero-latency environment (orchestration cost alone). On CPU the tiny model makes generation cheap, so the
environment's latency dominates; the ratio at latency 0 is the loop's own overhead.

`--vllm` runs every row twice, with `generate` on the trainer's model and with TRL's colocated vLLM engine (vLLM's
CPU build here; the model then has attention heads 64 wide, as vLLM's CPU attention needs), and adds the ratio
vLLM / generate per row.

`--async` compares the synchronous trainer with the asynchronous one (`async_grpo`, TRL's AsyncGRPOTrainer with
the loop as its rollout worker, the agent on a `vllm serve` of vLLM's CPU build started here, its weights synced
through a file after every step) at environment latencies 0, 0.2 and 1 s. Every row uses the same model (heads 64
wide, as vLLM's CPU attention needs); the sync rows use `generate` (the default policy). Printed per row: seconds
per step (median over the steps after the first: for async, the time between optimizer steps, rollout waits
included), steps per second, the ratio to TRL's single-turn step, and for async its throughput over sync at the
same latency and the mean staleness of the samples it trained on.
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


def _vllm_settings(vllm: bool) -> dict:
    # On CPU the engine gets an explicit KV cache (prompt_r1/training/sync/weight_sync.py), whatever this process holds.
    return dict(use_vllm=True, vllm_mode="colocate") if vllm else {}


def _rows() -> list[dict]:
    from prompt_r1.core.prompts import question_message

    return [
        {"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}], "golden_answers": ["Ada"]}
    ]


def _config(model: Path, args, out: Path, server, **settings):
    """The two-turn name task's training config, the same for the synchronous and the asynchronous rows
    (`async_grpo=True` in `settings`: the async trainer's config)."""
    from prompt_r1.training.run import trainer_config

    return trainer_config(
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
        **settings,
    )


def multi_turn(
    model: Path, args, latency: float, out: Path, vllm: bool = False, **settings
) -> tuple[float, float]:
    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.training.sync.trainer import build_trainer

    with ScriptedServer({"env": lambda body: RESPONSE}, latency=latency) as server:
        config = _config(model, args, out, server, **_vllm_settings(vllm), **settings)
        trainer = build_trainer(config, train_rows=_rows() * (args.batch * args.steps))
        trainer.train()
    tokens = statistics.mean(
        h["completions/mean_length"] for h in trainer.state.log_history if "step_time" in h
    )
    return _median_step(trainer), tokens


def single_turn(model: Path, args, tokens: int, out: Path, vllm: bool = False, **settings) -> float:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from prompt_r1.core.prompts import question_message

    rows = [{"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}]}] * (
        args.batch * args.steps
    )
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.batch,
        num_generations=args.batch,
        max_steps=args.steps,
        max_completion_length=tokens,
        # The same forced length, in each backend's own word for it.
        generation_kwargs={"min_tokens": tokens} if vllm else {"min_new_tokens": tokens},
        learning_rate=1e-4,
        temperature=1.0,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
        **_vllm_settings(vllm),
        **settings,
    )
    from prompt_r1.training.sync.weight_sync import install_cpu_weight_sync, same_dtype_engine

    # TRL's own trainer, given the same two things a vLLM engine on CPU needs under build_trainer: the model's
    # dtype and a weight sync that can reload prepacked CPU weights (no-ops without vLLM, or on a GPU).
    with same_dtype_engine("float32"):
        trainer = GRPOTrainer(
            model=str(model),
            reward_funcs=[lambda completions, **_: [float(len(c[0]["content"]) % 3) for c in completions]],
            args=config,
            train_dataset=Dataset.from_list(rows),
        )
    install_cpu_weight_sync(trainer)
    trainer.train()
    return _median_step(trainer)


def async_multi_turn(model: Path, args, latency: float, out: Path, root: str) -> tuple[float, float, float]:
    """(s/step, agent tokens per episode, mean staleness) of the async trainer on the two-turn task."""
    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.training.asynchronous.trainer import build_async_trainer

    with ScriptedServer({"env": lambda body: RESPONSE}, latency=latency, record=False) as server:
        config = _config(
            model,
            args,
            out,
            server,
            bf16=False,
            async_grpo=True,
            max_staleness=args.max_staleness,
            vllm_server_base_url=root,
        )
        trainer = build_async_trainer(config, train_rows=_rows() * args.batch)
        trainer.train()
    history = trainer.state.log_history
    times = [h["perf/step_s"] for h in history if "perf/step_s" in h]
    tokens = statistics.mean(h["episode/agent_completion_tokens"] for h in history if "reward" in h)
    staleness = statistics.mean(h["sample/staleness_mean"] for h in history if "sample/staleness_mean" in h)
    return statistics.median(times), tokens, staleness


def _restore(root: str, model: Path) -> None:
    """Put the server's weights back to the model's own, between rows."""
    from prompt_r1.training.shared.vllm_reload import post_json

    post_json(
        f"{root}/collective_rpc",
        {"method": "prompt_r1_reload_weights", "args": [str(model / "model.safetensors")]},
        600,
    )
    post_json(f"{root}/reset_prefix_cache", {}, 60)


def main_async(args) -> int:
    from prompt_r1.testing.tiny_models import build_protocol_model
    from prompt_r1.testing.vllm_process import start_vllm_server, stop_vllm_server

    latencies = (0.0, 0.2, 1.0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        episodes = [
            (NAME_QUESTION, TURN_1, RESPONSE, f"<think>ok</think><answer>{n}</answer>") for n in NAMES
        ]
        model = build_protocol_model(tmp / "model", episodes, steps=150, hidden_size=128, heads=2, kv_heads=1)
        # float32 throughout: the async trainer computes as the vLLM server does (its importance ratio needs it).
        sync = {lat: multi_turn(model, args, lat, tmp / f"sync-{lat}", bf16=False) for lat in latencies}
        root, process = start_vllm_server(model, tmp / "vllm.log")
        try:
            results = {}
            for lat in latencies:
                results[lat] = async_multi_turn(model, args, lat, tmp / f"async-{lat}", root)
                _restore(root, model)
        finally:
            stop_vllm_server(process)
        n = max(1, round(statistics.mean(t for _, t in sync.values())))
        base = single_turn(model, args, n, tmp / "single", bf16=False)

    print(
        f"\nGRPO step time, sync vs async, {args.batch} episodes per step, median of steps 2..{args.steps} "
        f"(CPU, 2 cores; async: max_staleness {args.max_staleness})"
    )
    print(f"{'run':52} {'s/step':>8} {'steps/s':>8} {'vs single':>10} {'async/sync':>11} {'staleness':>10}")
    label = f"TRL single-turn GRPO (generate), {n} tokens per completion"
    print(f"{label:52} {base:8.3f} {1 / base:8.2f} {1.0:10.2f}")
    for lat in latencies:
        step = sync[lat][0]
        label = f"Prompt-R1 two-turn, sync (generate), env {lat:.1f} s"
        print(f"{label:52} {step:8.3f} {1 / step:8.2f} {step / base:10.2f}")
    for lat in latencies:
        step, _, staleness = results[lat]
        label = f"Prompt-R1 two-turn, async (vLLM server), env {lat:.1f} s"
        speedup = sync[lat][0] / step
        print(f"{label:52} {step:8.3f} {1 / step:8.2f} {step / base:10.2f} {speedup:11.2f} {staleness:10.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8, help="episodes per step (one group)")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per environment reply")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size of the tiny model")
    parser.add_argument(
        "--vllm", action="store_true", help="also run every row with TRL's colocated vLLM engine"
    )
    parser.add_argument(
        "--async", dest="async_grpo", action="store_true", help="sync vs async rows at 0, 0.2 and 1 s latency"
    )
    parser.add_argument(
        "--max-staleness", type=int, default=4, help="the async trainer's bound (TRL's default)"
    )
    args = parser.parse_args()
    if args.async_grpo:
        return main_async(args)
    shape = dict(hidden_size=128, heads=2, kv_heads=1) if args.vllm else dict(hidden_size=args.hidden)

    from prompt_r1.testing.tiny_models import build_protocol_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        episodes = [
            (NAME_QUESTION, TURN_1, RESPONSE, f"<think>ok</think><answer>{n}</answer>") for n in NAMES
        ]
        model = build_protocol_model(tmp / "model", episodes, steps=150, **shape)
        print(f"built the tiny protocol model in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        backends = (False, True) if args.vllm else (False,)
        results = {}  # (backend, latency) -> (s/step, tokens)
        for vllm in backends:
            for latency in (args.latency, 0.0):
                results[vllm, latency] = multi_turn(
                    model, args, latency, tmp / f"multi-{vllm}-{latency}", vllm
                )
        n = max(1, round(statistics.mean(t for _, t in results.values())))
        base = {vllm: single_turn(model, args, n, tmp / f"single-{vllm}", vllm) for vllm in backends}

    print(f"\nGRPO step time, {args.batch} episodes per step, median of steps 2..{args.steps} (CPU, 2 cores)")
    header = f"{'run':58} {'s/step':>8} {'agent tok/s':>12} {'vs single':>10}"
    print(header + (f" {'vLLM/generate':>14}" if args.vllm else ""))
    for vllm in backends:
        name = "vLLM" if vllm else "generate"
        single = f"TRL single-turn GRPO ({name}), {n} tokens per completion"
        extra = f" {base[True] / base[False]:14.2f}" if vllm else ""
        print(f"{single:58} {base[vllm]:8.3f} {args.batch * n / base[vllm]:12.1f} {1.0:10.2f}{extra}")
        for latency in (args.latency, 0.0):
            step, tokens = results[vllm, latency]
            label = f"Prompt-R1 two-turn ({name}), env latency {latency:.2f} s"
            extra = f" {step / results[False, latency][0]:14.2f}" if vllm else ""
            print(
                f"{label:58} {step:8.3f} {args.batch * tokens / step:12.1f} {step / base[vllm]:10.2f}{extra}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
