"""Time per GRPO step: Prompt-R1's multi-turn rollout versus TRL's own single-turn GRPO, side by side in one run.

    python evals/bench/grpo_step.py [--steps 6] [--batch 8] [--latency 0.2] [--hidden 64] [--vllm]
    python evals/bench/grpo_step.py --async [--steps 10] [--max-staleness 4] [--processes 2] [--latencies 0.2,1]

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
through a file after every step) at environment latencies `--latencies` (default 0.2 and 1 s). Every row uses
the same model (heads 64 wide, as vLLM's CPU attention needs); the sync rows use `generate` (the default policy).
Against its ceiling: overlapping rollouts with training hides at best the shorter of the two, so two more kinds of
rows are measured in the same run:
- **rollout alone**, per latency: the async trainer's rollout worker producing groups with no training beside it
  (seconds per step's worth of samples);
- **training alone**, per process count: the async trainer fed, without end, samples the worker produced
  (`ReplayWorker`, none stale), so its step is forward, backward, optimizer and weight sync.
Printed per async row: seconds per step (median over the steps after the first: the time between optimizer
steps, rollout waits included), the ratio to TRL's single-turn step (`vs single`), its throughput over sync at the
same latency, `overlap` = async s/step / max(rollout alone, training alone) (1.00: perfect overlap), `vs CPU
bound` = async s/step / max(rollout alone, training alone, CPU seconds of both / cores) (rollouts and training that
share the machine's cores overlap no better: `async_measure.py`), the benchmark's CPU seconds per step, the trainer's
idle share (its wait for samples over the steps' time), the rollout worker's idle share (no group generating, or
the server paused for a weight sync; between the first and the last step's end), the median weight sync in
seconds, and the mean staleness of the samples trained on. `--processes N` adds the async rows with the trainer
across N processes (`accelerate launch` with training/accelerate/fsdp2.yaml, `async_ranks.py`; the step's episodes
split across them), labelled `N processes` beside the `1 process` rows.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # async_ranks and async_measure beside it
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from async_measure import (  # noqa: E402
    ReplayWorker,
    figures,
    measured,
    print_async,
    processes_label,
    step_clock,
    tree_cpu,
)

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


def _config(model: Path, args, out: Path, env_url: str, per_device: int | None = None, **settings):
    """The two-turn name task's training config, the same for the synchronous and the asynchronous rows
    (`async_grpo=True` in `settings`: the async trainer's config)."""
    from prompt_r1.testing.tiny_grpo import TINY_GRPO
    from prompt_r1.training.run import trainer_config

    return trainer_config(
        **{
            **TINY_GRPO,
            "output_dir": str(out),
            "model_name_or_path": str(model),
            "env_base_url": env_url,
            "per_device_train_batch_size": per_device or args.batch,
            "num_generations": args.batch,
            "max_steps": args.steps,
            "learning_rate": 1e-4,
        },
        **settings,
    )


def multi_turn(
    model: Path, args, latency: float, out: Path, vllm: bool = False, **settings
) -> tuple[float, float]:
    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.training.sync.trainer import build_trainer

    with ScriptedServer({"env": lambda body: RESPONSE}, latency=latency) as server:
        config = _config(model, args, out, server.base_url, **_vllm_settings(vllm), **settings)
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


def async_run(
    model: str,
    args,
    env_url: str,
    out: str,
    root: str,
    processes: int = 1,
    replay: list | None = None,
    variant: str = "",
    cpu_root: int | None = None,
) -> dict | None:
    """One async training run of the two-turn task (in this process, or as one rank of `processes`: see
    `async_ranks`), with the real worker or, given `replay` samples, the `ReplayWorker`. `variant`: "" as it is (the
    trainer waits for the server's reload of its weights); "reload in background": the trainer training on while the
    server reloads; "no headroom": the worker using all of max_inflight; "before": as before the overlap work (the
    server paused for the whole weight sync, the worker not counting queued samples against max_inflight, no
    headroom). The main process returns its figures: the steps' seconds (perf/step_s, from the second step), the
    trainer's wait for samples and its weight syncs per step, the worker's idle seconds and the CPU seconds of
    process `cpu_root`'s tree (this process's by default; the benchmark's own, when run as ranks) at each step's end,
    agent tokens, staleness, and each step's `time/*` parts."""
    from prompt_r1.training.asynchronous.trainer import build_async_trainer

    config = _config(
        Path(model),
        args,
        Path(out),
        env_url,
        per_device=args.batch // processes,
        bf16=False,
        async_grpo=True,
        max_staleness=args.max_staleness,
        vllm_server_base_url=root,
    )
    trainer = build_async_trainer(config, train_rows=_rows() * args.batch)
    if replay is not None and trainer.accelerator.is_main_process:
        trainer.rollout_worker.stop()  # built, never started
        trainer.rollout_worker = ReplayWorker(replay)
        trainer.rollout_queue = trainer.rollout_worker.rollout_buffer
    if variant == "reload in background" and trainer.accelerator.is_main_process:
        trainer.weight_transfer.reload_in_background = True
    if variant == "before" and trainer.accelerator.is_main_process:
        trainer.weight_transfer.write_before_pause = False
        trainer.rollout_worker.bound_queued = False
    if variant in ("before", "no headroom") and trainer.accelerator.is_main_process:
        trainer.rollout_worker.headroom = 0
    clock = step_clock(trainer.rollout_worker, cpu_root or os.getpid())
    trainer.add_callback(clock)
    trainer.train()
    if not trainer.accelerator.is_main_process:
        return None
    history = trainer.state.log_history
    steps = [h for h in history if "perf/step_s" in h]
    return {
        "step_s": [h["perf/step_s"] for h in steps],
        "wait_s": [h.get("perf/rollout_wait_s", 0.0) for h in steps],
        "sync_s": [h["perf/weight_sync_s"] for h in history if "perf/weight_sync_s" in h],
        "marks": clock.marks,
        "tokens": [
            h["episode/agent_completion_tokens"] for h in history if "episode/agent_completion_tokens" in h
        ],
        "staleness": [h["sample/staleness_mean"] for h in history if "sample/staleness_mean" in h],
        "dropped": sum(h.get("sample/dropped_stale_total") or 0 for h in history),
        # Where each step's seconds went (prompt_r1.training.asynchronous.step_times), every step.
        "times": [
            {k: v for k, v in h.items() if k.startswith("time/")} for h in history if "time/step_s" in h
        ],
    }


def async_rank(**keywords) -> dict | None:
    """`async_run` on one of the ranks of `accelerate launch` (`async_ranks.launch_ranks`)."""
    return async_run(**keywords)


def rollout_alone(
    model: Path, args, env_url: str, out: Path, root: str, headroom: bool = True
) -> tuple[dict, list]:
    """Rollout time alone: the async trainer's rollout worker producing groups with no trainer training beside it.
    Returns the seconds and the CPU seconds (this process's tree: the worker, the environment, the vLLM server)
    per step's worth of samples (from the first step's worth to the last of `args.steps`), and the samples, in the
    order they came."""
    from prompt_r1.training.asynchronous.trainer import build_async_trainer

    config = _config(
        model, args, out, env_url, bf16=False, async_grpo=True, max_staleness=args.max_staleness,
        vllm_server_base_url=root,
    )  # fmt: skip
    trainer = build_async_trainer(config, train_rows=_rows() * args.batch)
    worker, samples, marks = trainer.rollout_worker, [], []  # (time, CPU) at each step's worth
    if not headroom:
        worker.headroom = 0
    worker.start()
    try:
        while len(samples) < args.batch * args.steps:
            try:
                samples.append(worker.rollout_buffer.get(timeout=5))
            except queue.Empty:
                worker.check_health(300)
                continue
            if len(samples) % args.batch == 0:
                marks.append((time.monotonic(), tree_cpu(os.getpid())))
    finally:
        worker.stop()
    (t0, cpu0), (t1, cpu1) = marks[0], marks[-1]
    return {"step": (t1 - t0) / (len(marks) - 1), "cpu": (cpu1 - cpu0) / (len(marks) - 1)}, samples


def _restore(root: str, model: Path) -> None:
    """Put the server's weights back to the model's own, between rows."""
    from prompt_r1.training.shared.vllm_reload import post_json

    post_json(
        f"{root}/collective_rpc",
        {"method": "prompt_r1_reload_weights", "args": [str(model / "model.safetensors")]},
        600,
    )
    post_json(f"{root}/reset_prefix_cache", {}, 60)


def run_async(processes: int, folder: Path, **job) -> dict:
    """`async_run(**job)` in this process, or on `processes` FSDP2 ranks (`async_ranks.launch_ranks`, its spec and
    log kept in `folder`); the main process's figures."""
    from async_ranks import launch_ranks

    if processes == 1:
        return async_run(**job, processes=1)
    return launch_ranks(
        "grpo_step.async_rank", {**job, "processes": processes}, processes=processes, folder=folder
    )


def main_async(args) -> int:
    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.testing.tiny_models import build_protocol_model
    from prompt_r1.testing.vllm_process import start_vllm_server, stop_vllm_server

    latencies = args.latencies
    counts = (1, args.processes) if args.processes > 1 else (1,)
    variants = (
        *(("before",) if args.before else ()),
        *(("reload in background",) if args.reload_in_background else ()),
        *(("no headroom",) if args.no_headroom else ()),
        "",
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        episodes = [
            (NAME_QUESTION, TURN_1, RESPONSE, f"<think>ok</think><answer>{n}</answer>") for n in NAMES
        ]
        model = tmp / "model"
        if args.model is None or not (args.model / "model.safetensors").is_file():
            build_protocol_model(model, episodes, steps=150, hidden_size=128, heads=2, kv_heads=1)
        if args.model is not None:  # built once, then reused (copied whole, once trained: never half-built)
            if not (args.model / "model.safetensors").is_file():
                shutil.copytree(model, args.model, dirs_exist_ok=True)
            model = args.model
        # float32 throughout: the async trainer computes as the vLLM server does (its importance ratio needs it).
        sync = {lat: multi_turn(model, args, lat, tmp / f"sync-{lat}", bf16=False) for lat in latencies}
        for lat in latencies:
            measured(f"sync, env {lat} s", {"step": sync[lat][0], "tokens": sync[lat][1]})
        root, process = start_vllm_server(model, tmp / "vllm.log")
        alone, trained, runs = {}, {}, {}
        common = dict(model=str(model), args=args, root=root, cpu_root=os.getpid())
        try:
            samples = None
            for lat in latencies:
                with ScriptedServer({"env": lambda body: RESPONSE}, latency=lat, record=False) as env:
                    alone[lat], got = rollout_alone(model, args, env.base_url, tmp / f"alone-{lat}", root)
                    measured(f"rollout alone, env {lat} s", alone[lat])
                    if args.no_headroom or args.before:  # those rows' own ceiling: the worker as they run it
                        alone[lat, "no headroom"], _ = rollout_alone(
                            model, args, env.base_url, tmp / f"alone-{lat}-nh", root, headroom=False
                        )
                        measured(f"rollout alone, env {lat} s, no headroom", alone[lat, "no headroom"])
                samples = samples or got
            with ScriptedServer({"env": lambda body: RESPONSE}, record=False) as env:
                for n in counts:
                    run = run_async(
                        n, tmp / f"ranks-train-{n}", **common, env_url=env.base_url,
                        out=str(tmp / f"train-alone-{n}"), replay=samples,
                    )  # fmt: skip
                    trained[n] = figures(run)
                    measured(f"training alone, {processes_label(n)}", trained[n])
                    _restore(root, model)
            for lat in latencies:
                with ScriptedServer({"env": lambda body: RESPONSE}, latency=lat, record=False) as env:
                    for n, variant in [(n, v) for n in counts for v in variants]:
                        run = run_async(
                            n, tmp / f"ranks-{lat}-{n}-{variant}", **common, env_url=env.base_url,
                            out=str(tmp / f"async-{lat}-{n}-{variant}"), variant=variant,
                        )  # fmt: skip
                        runs[lat, n, variant] = figures(run)
                        measured(
                            f"async, {processes_label(n)}, env {lat} s, {variant or 'now'}",
                            runs[lat, n, variant],
                        )
                        _restore(root, model)
        finally:
            stop_vllm_server(process)
        n_tokens = max(1, round(statistics.mean(t for _, t in sync.values())))
        base = single_turn(model, args, n_tokens, tmp / "single", bf16=False)
        measured("TRL single-turn", {"step": base})

    print_async(args, base, n_tokens, sync, alone, trained, runs)
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
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="async: also rows with the trainer across N processes (accelerate launch, training/accelerate/"
        "fsdp2.yaml; the episodes of a step split across them), beside the 1-process rows",
    )
    parser.add_argument(
        "--model",
        type=Path,
        help="async: keep the tiny agent in this folder (built there if it holds none, reused if it does)",
    )
    parser.add_argument(
        "--before",
        action="store_true",
        help="async: also each async row as it was before the overlap work (server paused for the whole weight "
        "sync, queued samples not counted against max_inflight, no headroom)",
    )
    parser.add_argument(
        "--reload-in-background",
        action="store_true",
        help="async: also each async row with the trainer training on while the server reloads its weights "
        "(FileWeightTransfer(reload_in_background=True))",
    )
    parser.add_argument(
        "--no-headroom",
        action="store_true",
        help="async: also each async row with the worker using all of max_inflight (no step's samples kept free)",
    )
    parser.add_argument(
        "--latencies",
        type=lambda text: tuple(float(x) for x in text.split(",")),
        default=(0.2, 1.0),
        help="async: environment latencies in seconds, comma-separated (default: 0.2,1)",
    )
    args = parser.parse_args()
    if args.processes < 1 or args.batch % args.processes:
        parser.error("--processes must be at least 1 and divide --batch (each process trains an equal share)")
    if args.processes > 1 and not args.async_grpo:
        parser.error("--processes runs the async trainer across processes: add --async")
    if args.steps < 3:
        parser.error("--steps must be at least 3 (the first step is not timed)")
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
