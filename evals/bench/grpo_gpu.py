"""A short real GRPO training on a GPU under DeepSpeed: step time, tokens per second and peak memory, with TRL's own
single-turn GRPO on the same model and launch as the baseline, side by side in one run.

    python evals/bench/grpo_gpu.py [--steps 8] [--batch 16] [--latency 0.2] [--zero 2] [--processes 1] [--vllm]
                                   [--hidden 1024] [--layers 28] [--heads 16] [--kv-heads 8] [--intermediate 3072]
                                   [--async] [--max-staleness 4] [--no-compile-decode]

It builds a Qwen2-shaped model of the given size (default about 0.35 B parameters, Qwen3-0.6B's shape without its
large vocabulary: nothing can come from a hub here) with an in-process tokenizer, fine-tunes it on the GPU for a
few seconds to play the two-turn protocol, starts a scripted environment on 127.0.0.1 whose every reply takes
`--latency` seconds, and then runs each trainer under `accelerate launch` with the project's DeepSpeed config
(`training/accelerate/deepspeed_zero{2,3}.yaml`) in bf16:

- Prompt-R1: `build_trainer` (GraphRollout over the LangGraph loop, policy `generate` on the trainer's model);
- TRL single-turn GRPO: as many tokens per completion as the Prompt-R1 agent generated per episode, forced with
  min_new_tokens, and the same batch, group and optimizer.

Printed per run: median seconds per step over steps 2..N, agent tokens generated per second, peak GPU memory
allocated and reserved, and the step-time ratio. `--vllm` adds both trainers again with TRL's colocated vLLM engine
(`use_vllm: true, vllm_mode: colocate`, prefix caching on, vLLM's default), with the ratio of the two vLLM runs:
the target on a GPU is the multi-turn step within 1.25x of the single-turn one.
Runs on CPU too (gloo, fp32), which is how it is checked where no GPU is present.

`--async` adds the asynchronous trainer (`async_grpo`: TRL's AsyncGRPOTrainer, the loop as its rollout worker):
a `vllm serve` of the model is started on the last GPU (TRL's design: vLLM on a device of its own; the trainer
runs on the first, as one process without DeepSpeed, which the async trainer does not support), weights synced
over NCCL after every step; without a second GPU it shares the one (NCCL cannot join two processes on one
device, so the weights then go through a file, as on CPU). Its rows: two-turn async at `--latency` and at 1 s,
beside the sync two-turn run at the same latencies, s/step with the single-turn run as the unit.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[2]

NAME_QUESTION = "Which name does the item have?"
TURN_1 = "<think>ask</think><interaction_prompt>Which name?</interaction_prompt>"
RESPONSE = "The name is Ada."
NAMES = ("Ada", "Bob", "Cy", "Dee")


def _rows(n: int, *, golden: bool) -> list[dict]:
    from prompt_r1.core.prompts import question_message

    row = {"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}]}
    if golden:
        row["golden_answers"] = ["Ada"]
    return [dict(row) for _ in range(n)]


def _two_turn(args, cuda: bool) -> dict:
    """The two-turn task's agent, environment and loop fields, the same for the synchronous and async rows."""
    return dict(
        model_name_or_path=args.model,
        agent_dtype="bfloat16" if cuda else "float32",
        env_model="env",
        env_base_url=args.base_url,
        env_api_key_env="PROMPT_R1_BENCH_NO_KEY",
        env_max_in_flight=256,
        env_rate_limit=100_000,
        max_turns=2,
        max_turn_tokens=args.turn_tokens,
        max_total_tokens=4 * args.turn_tokens + 64,
        reward_preset="reference",
    )


def _common(args, out: Path, cuda: bool) -> dict:
    vllm = dict(use_vllm=True, vllm_mode="colocate")
    return dict(
        **(vllm if args.vllm else {}),
        output_dir=str(out),
        per_device_train_batch_size=args.batch,
        num_generations=args.batch,
        max_steps=args.steps,
        learning_rate=1e-5,
        temperature=1.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        bf16=cuda,
        use_cpu=not cuda,
    )


def _peak_memory_callback():
    """A trainer callback that keeps the peak GPU memory over the run (0 on CPU)."""
    import torch
    from transformers import TrainerCallback

    class PeakMemory(TrainerCallback):
        peak_allocated = peak_reserved = 0

        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                self.peak_allocated = max(self.peak_allocated, torch.cuda.max_memory_allocated())
                self.peak_reserved = max(self.peak_reserved, torch.cuda.max_memory_reserved())

    return PeakMemory()


def worker(args) -> None:
    """One trainer under `accelerate launch`; the main process writes its figures to args.result."""
    import torch
    from torch._dynamo.utils import counters

    cuda = torch.cuda.is_available()
    out = Path(args.result).parent / f"run-{args.worker}"
    memory = _peak_memory_callback()
    if args.worker == "multi":
        from prompt_r1.agents.batching import BatchingBackend
        from prompt_r1.training.sync.config import PromptR1GRPOConfig

        BatchingBackend.batch_wait = args.batch_wait
        from prompt_r1.training.sync.trainer import build_trainer

        config = PromptR1GRPOConfig(
            **_common(args, out, cuda),
            **_two_turn(args, cuda),
            agent_compile_decode=args.compile_decode,
        )
        trainer = build_trainer(
            config, train_rows=_rows(args.batch * args.steps, golden=True), callbacks=[memory]
        )
    elif args.worker == "async":
        from prompt_r1.training.asynchronous.config import PromptR1AsyncGRPOConfig
        from prompt_r1.training.asynchronous.trainer import build_async_trainer

        common = _common(args, out, cuda)
        common.pop("use_vllm", None), common.pop("vllm_mode", None)
        config = PromptR1AsyncGRPOConfig(
            **common,
            **_two_turn(args, cuda),
            max_staleness=args.max_staleness,
            vllm_server_base_url=args.vllm_url,
            gradient_checkpointing=False,
        )
        trainer = build_async_trainer(
            config,
            train_rows=_rows(args.batch * args.steps, golden=True),
            callbacks=[memory],
            file_weights=args.file_weights,
        )
    else:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        config = GRPOConfig(
            **_common(args, out, cuda),
            max_completion_length=args.tokens,
            # The forced length, in each backend's own word for it.
            generation_kwargs={"min_tokens" if args.vllm else "min_new_tokens": args.tokens},
            model_init_kwargs={"dtype": "bfloat16" if cuda else "float32"},
        )
        from prompt_r1.training.sync.weight_sync import install_cpu_weight_sync, same_dtype_engine

        # The model's dtype for a colocated engine, and on CPU a sync that can reload prepacked weights (GPU: TRL's).
        with same_dtype_engine("bfloat16" if cuda else "float32"):
            trainer = GRPOTrainer(
                model=args.model,
                reward_funcs=[
                    lambda completions, **_: [float(len(c[0]["content"]) % 3) for c in completions]
                ],
                args=config,
                train_dataset=Dataset.from_list(_rows(args.batch * args.steps, golden=False)),
                callbacks=[memory],
            )
        install_cpu_weight_sync(trainer)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    if not trainer.accelerator.is_main_process:
        return
    logs = [h for h in trainer.state.log_history if "step_time" in h or "perf/step_s" in h]
    steps = [h.get("step_time", h.get("perf/step_s")) for h in logs]

    def mean(key: str) -> float:
        values = [h[key] for h in logs if key in h]
        return statistics.mean(values) if values else float("nan")

    result = {
        "step_times": steps,
        "median_step": statistics.median(steps[1:] if len(steps) > 1 else steps),
        "wall": wall,
        "agent_tokens": mean("episode/agent_completion_tokens") if args.worker != "single" else args.tokens,
        "reward": mean("reward"),
        "turns": mean("episode/turns"),
        "answered": mean("episode/status_answered"),
        "generate_calls": mean("rollout/generate_calls") if args.worker == "multi" else 1.0,
        "staleness": mean("sample/staleness_mean"),
        # The async trainer's: its wait for samples, and the weight sync (NCCL on two GPUs) with its transfer phase.
        "rollout_wait": sum(h.get("perf/rollout_wait_s", 0.0) for h in logs[1:]),
        "weight_sync": _median(trainer.state.log_history, "perf/weight_sync_s"),
        "weight_transfer": _median(trainer.state.log_history, "perf/weight_sync_transfer_s"),
        "ratio": mean("ratio"),
        # Where a step's seconds went (the step line's parts, `time/*_s`), the median over steps 2.. of each.
        "times": _median_times(logs[1:] or logs),
        "weights": type(getattr(trainer, "weight_transfer", None)).__name__,  # WeightTransferClient: NCCL
        "peak_allocated": memory.peak_allocated,
        "peak_reserved": memory.peak_reserved,
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "processes": trainer.accelerator.num_processes,
        # Graphs torch.compile made in this process: with compiled decoding on, the policy's decoding step's (and
        # any other compiled function's: none in these runs).
        "compiled_graphs": counters["stats"]["unique_graphs"],
    }
    Path(args.result).write_text(json.dumps(result))


def _median_times(logs: list[dict]) -> dict[str, float]:
    """Each `time/PART_s` metric of the logged steps as PART: its median over the steps that logged it."""
    keys = {key for h in logs for key in h if key.startswith("time/") and key.endswith("_s")}
    return {key[len("time/") : -len("_s")]: _median(logs, key) for key in keys}


def _median(history: list[dict], key: str) -> float:
    values = [h[key] for h in history if key in h]
    return statistics.median(values) if values else float("nan")


def _route(transfer: str) -> str:
    return "nccl" if transfer == "WeightTransferClient" else "file"


def plan(args) -> list[str]:
    """The runs `main` makes, in order, with what each launches: what `--dry-run` prints."""
    zero = f"accelerate launch, DeepSpeed ZeRO-{args.zero}, {args.processes} process(es)"
    lines = [
        f"build: a Qwen2-shaped model (hidden {args.hidden}, {args.layers} layers, heads {args.heads}/"
        f"{args.kv_heads}), {args.sft_steps} protocol fine-tuning steps",
        f"sync two-turn, env {args.latency:.1f} s: {zero}",
    ]
    if not args.skip_eager:
        lines.append(f"sync two-turn, batch_wait 0, env {args.latency:.1f} s: {zero}")
    if args.no_compile_decode:
        lines.append(
            f"sync two-turn, decoding not compiled (compile_decode off), env {args.latency:.1f} s: {zero}"
        )
    if args.vllm:
        lines.append(f"sync two-turn, vLLM colocate, env {args.latency:.1f} s: {zero}")
    if args.async_grpo:
        lines.append(
            "vllm serve of the model on the last GPU (NCCL weight transfer when there are 2 or more GPUs, "
            "else through a file)"
        )
        for latency in sorted({args.latency, 1.0}):
            lines.append(
                f"async two-turn, env {latency:.1f} s: one process on GPU 0, max_staleness {args.max_staleness}"
            )
        lines.append(f"sync two-turn, env 1.0 s: {zero}")
    lines.append(f"TRL single-turn GRPO: {zero}")
    if args.vllm:
        lines.append(f"TRL single-turn GRPO, vLLM colocate: {zero}")
    return lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(
    args,
    mode: str,
    model: Path,
    base_url: str,
    tmp: Path,
    tokens: int = 0,
    batch_wait: float = 0.5,
    vllm: bool = False,
    compile_decode: str = "auto",
) -> dict:
    result = tmp / f"{mode}-{batch_wait}-{'vllm' if vllm else 'generate'}-{compile_decode}.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    import torch

    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / f"training/accelerate/deepspeed_zero{args.zero}.yaml"),
        "--num_processes", str(args.processes),
        "--main_process_port", str(_free_port()),
        *([] if torch.cuda.is_available() else ["--cpu"]),
        __file__, "--worker", mode, "--model", str(model), "--base-url", base_url,
        "--result", str(result), "--steps", str(args.steps), "--batch", str(args.batch),
        "--turn-tokens", str(args.turn_tokens), "--tokens", str(tokens), "--batch-wait", str(batch_wait),
        "--compile-decode", compile_decode, *(["--vllm"] if vllm else []),
    ]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    print(f"{mode}: launched and trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return json.loads(result.read_text())


def _start_vllm(model: Path, tmp: Path) -> tuple[str, subprocess.Popen, bool]:
    """`vllm serve` of the model for the async rows: (root URL, process, whether weights go over NCCL). On a GPU it
    takes the last device (shared when there is one: then the weights go through a file); on CPU the CPU route."""
    import torch

    if not torch.cuda.is_available():
        from prompt_r1.testing.vllm_process import start_vllm_server

        root, process = start_vllm_server(model, tmp / "vllm.log")
        return root, process, False
    import urllib.request

    from prompt_r1.training.shared.vllm_reload import CPU_SERVER_FLAGS

    gpus = torch.cuda.device_count()
    nccl = gpus > 1
    port = _free_port()
    flags = ["--weight-transfer-config", '{"backend":"nccl"}'] if nccl else CPU_SERVER_FLAGS.split()[-2:]
    command = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
        "--port", str(port), "--dtype", "bfloat16", "--logprobs-mode", "processed_logprobs",
        "--gpu-memory-utilization", "0.8" if nccl else "0.3", *flags,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": str(gpus - 1)}
    with (tmp / "vllm.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    root = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited: {(tmp / 'vllm.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{root}/health", timeout=2):
                return root, process, nccl
        except OSError:
            time.sleep(1)
    process.kill()
    raise RuntimeError("vllm serve did not start in 600 s")


def _run_async(
    args, model: Path, base_url: str, vllm_url: str, nccl: bool, tmp: Path, latency: float
) -> dict:
    """The async trainer in a process of its own on the first GPU (one process: the async trainer does not run
    under DeepSpeed)."""
    result = tmp / f"async-{latency}.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if nccl:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    command = [
        sys.executable, __file__, "--worker", "async", "--model", str(model), "--base-url", base_url,
        "--vllm-url", vllm_url, "--result", str(result), "--steps", str(args.steps), "--batch", str(args.batch),
        "--turn-tokens", str(args.turn_tokens), "--max-staleness", str(args.max_staleness),
        *([] if nccl else ["--file-weights"]),  # one GPU shared with the server: no NCCL between them
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True)
    return json.loads(result.read_text())


def _async_rows(args, model: Path, tmp: Path) -> dict:
    """The async and sync two-turn runs at `--latency` and at 1 s: {("async"|"sync", latency): result}."""
    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.testing.vllm_process import stop_vllm_server

    runs = {}
    root, process, nccl = _start_vllm(model, tmp)
    try:
        for latency in sorted({args.latency, 1.0}):
            with ScriptedServer({"env": lambda body: RESPONSE}, latency=latency, record=False) as server:
                runs["async", latency] = _run_async(args, model, server.base_url, root, nccl, tmp, latency)
    finally:
        stop_vllm_server(process)
    (tmp / "sync-1").mkdir(exist_ok=True)
    with ScriptedServer({"env": lambda body: RESPONSE}, latency=1.0, record=False) as server:
        runs["sync", 1.0] = _launch(args, "multi", model, server.base_url, tmp / "sync-1")
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="episodes per step and process (one group)")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per environment reply")
    parser.add_argument("--turn-tokens", type=int, default=64, help="most agent tokens per turn")
    parser.add_argument("--zero", type=int, choices=(2, 3), default=2, help="DeepSpeed ZeRO stage")
    parser.add_argument("--processes", type=int, default=1, help="processes (GPUs) under accelerate launch")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--sft-steps", type=int, default=120, help="protocol fine-tuning steps before GRPO")
    parser.add_argument("--sft-lr", type=float, default=2e-4, help="protocol fine-tuning learning rate")
    parser.add_argument("--worker", choices=("multi", "single", "async"), help=argparse.SUPPRESS)
    parser.add_argument("--vllm-url", help=argparse.SUPPRESS)
    parser.add_argument("--file-weights", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--async", dest="async_grpo", action="store_true", help="add the async trainer's rows"
    )
    parser.add_argument("--max-staleness", type=int, default=4, help="the async trainer's bound")
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--batch-wait", type=float, default=0.5, help=argparse.SUPPRESS)
    parser.add_argument("--compile-decode", default="auto", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-compile-decode",
        action="store_true",
        help="add the two-turn run with the policy's decoding not compiled (compile_decode off)",
    )
    parser.add_argument(
        "--vllm", action="store_true", help="also run both trainers with TRL's colocated vLLM"
    )
    parser.add_argument(
        "--skip-eager",
        action="store_true",
        help="leave out the run with the batcher not waiting for episodes at the environment (batch_wait 0)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the runs this would make, in order, and stop (loads nothing)",
    )
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.steps < 2 or args.batch < 2 or args.processes < 1:
        parser.error("need --steps >= 2 (the first is not timed), --batch >= 2 and --processes >= 1")
    if args.dry_run:
        print("\n".join(f"{i}. {line}" for i, line in enumerate(plan(args), 1)))
        return 0

    import torch

    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.testing.tiny_models import build_protocol_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        episodes = [
            (NAME_QUESTION, TURN_1, RESPONSE, f"<think>ok</think><answer>{n}</answer>") for n in NAMES
        ]
        model = build_protocol_model(
            tmp / "model", episodes, hidden_size=args.hidden, layers=args.layers, heads=args.heads,
            kv_heads=args.kv_heads, intermediate_size=args.intermediate, steps=args.sft_steps, lr=args.sft_lr,
            device=device,
        )  # fmt: skip
        print(f"built and fine-tuned the protocol model in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        with ScriptedServer({"env": lambda body: RESPONSE}, latency=args.latency) as server:
            multi = _launch(args, "multi", model, server.base_url, tmp)
            # The same run with the batcher's bounded wait for episodes at the environment off (those between
            # their reply and their request are still waited for: prompt_r1.agents.batching).
            eager = (
                None
                if args.skip_eager
                else _launch(args, "multi", model, server.base_url, tmp, batch_wait=0.0)
            )
            plain = (
                _launch(args, "multi", model, server.base_url, tmp, compile_decode="off")
                if args.no_compile_decode
                else None
            )
            multi_vllm = _launch(args, "multi", model, server.base_url, tmp, vllm=True) if args.vllm else None
        runs = _async_rows(args, model, tmp) if args.async_grpo else {}
        tokens = max(1, round(multi["agent_tokens"]))
        single = _launch(args, "single", model, "", tmp, tokens=tokens)
        single_vllm = _launch(args, "single", model, "", tmp, tokens=tokens, vllm=True) if args.vllm else None

    episodes = args.batch * args.processes
    gib = 1024**3
    print(
        f"\nGRPO on {multi['device']} x{multi['processes']}, DeepSpeed ZeRO-{args.zero}, "
        f"{'bf16' if device == 'cuda' else 'fp32'}, model {multi['params'] / 1e6:.0f} M parameters, "
        f"{episodes} episodes per step, median of steps 2..{args.steps}, env latency {args.latency:.2f} s"
    )
    header = f"{'run':46} {'s/step':>7} {'agent tok/s':>11} {'peak alloc GiB':>14} {'peak resv GiB':>13} {'ratio':>6}"
    print(header)
    rows = [
        (f"TRL single-turn GRPO, {tokens} tokens per completion", single, single),
        ("Prompt-R1 two-turn rollout (LangGraph loop)", multi, single),
    ]
    if eager is not None:
        rows.append(("  the same, batcher not waiting for the environment (batch_wait 0)", eager, single))
    if plain is not None:
        rows.append(("  the same, decoding not compiled (compile_decode off)", plain, single))
    if args.vllm:
        rows += [
            (f"TRL single-turn GRPO, vLLM colocate, {tokens} tokens", single_vllm, single_vllm),
            ("Prompt-R1 two-turn rollout, vLLM colocate", multi_vllm, single_vllm),
        ]
    for label, r, base in rows:
        step = r["median_step"]
        print(
            f"{label:46} {step:7.3f} {episodes * r['agent_tokens'] / step:11.1f} "
            f"{r['peak_allocated'] / gib:14.2f} "
            f"{r['peak_reserved'] / gib:13.2f} {step / base['median_step']:6.2f}"
        )
    if args.vllm:
        print(
            f"vLLM / generate, step time: two-turn {multi_vllm['median_step'] / multi['median_step']:.2f}, "
            f"single-turn {single_vllm['median_step'] / single['median_step']:.2f} (ratio column: against the "
            "single-turn run of the same backend)"
        )
    print(
        f"Prompt-R1 episodes: {multi['turns']:.2f} turns, {multi['generate_calls']:.2f} policy generate calls per "
        f"step, {multi['answered']:.0%} answered, mean reward "
        f"{multi['reward']:.3f}; agent tokens per episode {multi['agent_tokens']:.1f}"
    )
    print(
        f"policy decoding: {'compiled' if multi['compiled_graphs'] else 'eager'} "
        f"({multi['compiled_graphs']} graph(s) compiled in the run's process)"
    )
    parts = multi.get("times") or {}
    if "rollout" in parts:
        from prompt_r1.training.shared.progress import by_turn

        if "inputs" in parts:  # the step clock's parts (prompt_r1.training.shared.step_clock)
            prepare = parts["inputs"] - parts["rollout"] - parts.get("scoring", 0.0)
            rest = f"prepare {prepare:.3f}; training {parts['training']:.3f}; other {parts['other']:.3f}"
        else:
            rest = f"training and the rest {multi['median_step'] - parts['rollout'] - parts.get('scoring', 0.0):.3f}"
        print(
            f"Prompt-R1 step, where its seconds went (each part's median over the steps, s): rollout "
            f"{parts['rollout']:.3f} = generate {parts['generate']:.3f} (by turn "
            f"{', '.join(f'{seconds:.3f}' for seconds in by_turn(parts))}) + environment "
            f"{parts['environment']:.3f} + loop {parts['loop']:.3f}; scoring {parts.get('scoring', 0.0):.3f}; "
            f"{rest}"
        )
    if runs:
        runs["sync", args.latency] = multi
        print(
            f"\nsync vs async two-turn GRPO (async: max_staleness {args.max_staleness}; ratio: to single-turn)"
        )
        for latency in sorted({args.latency, 1.0}):
            sync, asynchronous = runs["sync", latency], runs["async", latency]
            for name, r in (("sync", sync), ("async", asynchronous)):
                step = r["median_step"]
                print(
                    f"  {name:5} env {latency:.1f} s  {step:7.3f} s/step  {1 / step:6.2f} steps/s  "
                    f"ratio {step / single['median_step']:5.2f}"
                    + (
                        f"  async/sync {sync['median_step'] / step:5.2f}  staleness {r['staleness']:.2f}  "
                        f"trainer idle {r['rollout_wait'] / max(sum(r['step_times'][1:]), 1e-9):.0%}  "
                        f"weight sync ({_route(r['weights'])}) {r['weight_sync']:.3f} s, transfer "
                        f"{r['weight_transfer']:.3f} s  ratio {r['ratio']:.4f}"
                        if name == "async"
                        else ""
                    )
                )
    if eager is not None:
        print(f"policy generate calls per step without the wait: {eager['generate_calls']:.2f}")
    print(f"step times (s): multi {[round(t, 3) for t in multi['step_times']]}")
    if eager is not None:
        print(f"                eager {[round(t, 3) for t in eager['step_times']]}")
    if plain is not None:
        print(f"        not compiled {[round(t, 3) for t in plain['step_times']]}")
    print(f"               single {[round(t, 3) for t in single['step_times']]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
