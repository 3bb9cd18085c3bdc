"""What the async rows of `grpo_step.py --async` measure, and their table.

- `ReplayWorker`: training alone, the trainer fed without end samples a real worker produced, none stale.
- `step_clock`: a trainer callback keeping, at every step's end, the time, the rollout worker's idle seconds and
  the CPU seconds the whole benchmark has used so far (`tree_cpu`).
- `figures` of one run and `print_async`, the table, and where the async steps' seconds went (`step_parts`).

The CPU seconds are what the ceiling needs on a machine with few cores. Overlapping rollouts with training hides at
best the shorter of the two, `max(rollout alone, training alone)`, but only when each has cores of its own: where
both need the same cores, a step cannot take less than the CPU seconds of both over the cores there are. So the
rollout alone and the training alone are also measured in CPU seconds per step (every process of the benchmark
counted: the trainer's ranks, the rollout worker, the vLLM server's engine and the scripted environment), and
each async row is shown against `max(rollout alone, training alone, (CPU of both) / cores)` as well (`vs CPU
bound`). Other programs on the machine are not counted: they slow the steps, not the bound. It is an estimate:
the CPU seconds of a run alone include spinning (vLLM's OpenMP threads) and idle work an overlapped run need not
repeat, so a row can come in under it.
"""

from __future__ import annotations

import math
import os
import queue
import statistics
import sys
import time

__all__ = [
    "ReplayWorker",
    "figures",
    "measured",
    "print_async",
    "processes_label",
    "step_clock",
    "step_parts",
    "tree_cpu",
]


def tree_cpu(root: int) -> float:
    """CPU seconds (user and system) used so far by process `root` and all its descendants, the ones they have
    waited for included (a difference of two readings is the tree's use in between)."""
    import psutil

    try:
        top = psutil.Process(root)
        tree = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return math.nan
    total = 0.0
    for process in tree:
        try:
            t = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended between the listing and the reading: its parent counts it once it is waited for
        total += t.user + t.system + t.children_user + t.children_system
    return total


def cores() -> int:
    """The cores this benchmark may run on."""
    return len(os.sched_getaffinity(0))


def step_clock(worker, cpu_root: int):
    """A trainer callback keeping, at every step's end, the time, the rollout worker's idle seconds and the CPU
    seconds of process `cpu_root`'s tree (`marks`)."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[tuple[float, float, float]] = []

        def on_step_end(self, args, state, control, **kwargs):
            clock = getattr(worker, "idle", None)
            idle = clock.idle_s() if clock is not None else 0.0
            self.marks.append((time.monotonic(), idle, tree_cpu(cpu_root)))

    return StepClock()


class _Replay:
    """The queue of `ReplayWorker`: never empty, each sample stamped with the policy version of the moment."""

    def __init__(self, samples: list, version) -> None:
        self._samples, self._version, self._next = samples, version, 0
        self.queue: list = []  # what a look into a queue.Queue finds (nothing waiting: samples are made on demand)

    def get(self, timeout: float | None = None):
        import dataclasses

        sample = self._samples[self._next % len(self._samples)]
        self._next += 1
        return dataclasses.replace(sample, model_version=self._version(), enqueued_at=time.time())

    def qsize(self) -> int:
        return 0


class ReplayWorker:
    """Training alone: in the rollout worker's place, one that hands the trainer, at once and without end, the
    samples a real worker produced (`rollout_alone`), none of them stale. The trainer's step is then its own work:
    forward, backward, optimizer and the weight sync to the server."""

    def __init__(self, samples: list) -> None:
        self.model_version = 0
        self.rollout_buffer = _Replay(samples, lambda: self.model_version)
        self.metrics_queue = queue.Queue()

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def drain(self, timeout: float = 0.0) -> None: ...

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None: ...


def figures(run: dict) -> dict:
    """s/step (median), the trainer's idle share (its wait for samples over the steps' time), the worker's idle
    share and the CPU seconds per step (both between the first and the last step's end), the median weight sync,
    tokens and staleness."""
    (t0, idle0, cpu0), (t1, idle1, cpu1) = run["marks"][0], run["marks"][-1]
    steps = len(run["marks"]) - 1
    return {
        "step": statistics.median(run["step_s"]),
        "trainer_idle": sum(run["wait_s"]) / sum(run["step_s"]),
        "worker_idle": (idle1 - idle0) / (t1 - t0) if t1 > t0 else math.nan,
        "cpu": (cpu1 - cpu0) / steps if steps else math.nan,
        "sync": statistics.median(run["sync_s"]),
        "tokens": statistics.mean(run["tokens"]) if run["tokens"] else math.nan,
        "staleness": statistics.mean(run["staleness"]) if run["staleness"] else math.nan,
        "dropped": run.get("dropped", 0),
        "parts": step_parts(run.get("times", [])),
    }


def step_parts(times: list[dict]) -> dict:
    """Each part of a step the async trainer logged (`time/*_s` of `times`, one dict per step: the step's own parts
    and its groups'), its mean over the steps after the first, by part name. Means, not medians: they add up."""
    later = times[1:] if len(times) > 1 else times
    keys = sorted({key for row in later for key in row})
    return {
        key.removeprefix("time/").removesuffix("_s"): statistics.mean(row[key] for row in later if key in row)
        for key in keys
    }


def measured(what: str, figures: dict) -> None:
    """A row's figures on stderr as soon as they are measured (a run cut short keeps what it measured)."""
    shown = ", ".join(f"{k} {v:.3f}" for k, v in figures.items() if isinstance(v, float | int))
    print(f"measured: {what}: {shown}", file=sys.stderr, flush=True)


def processes_label(n: int) -> str:
    return f"{n} process" + ("es" if n > 1 else "")


def cpu_bound(alone: dict, trained: dict) -> float:
    """An estimate of the least a step can take when the rollouts and the training share this machine's cores:
    the longer of the two alone, or the CPU seconds of both over the cores, whichever is more. An estimate, not a
    bound: the CPU seconds alone include spinning and idle work that overlapped runs need not repeat."""
    return max(alone["step"], trained["step"], (alone["cpu"] + trained["cpu"]) / cores())


def print_async(args, base: float, n_tokens: int, sync: dict, alone: dict, trained: dict, runs: dict) -> None:
    """The async table: `sync` {latency: (s/step, tokens)}, `alone` {latency or (latency, variant): {"step",
    "cpu"}}, `trained` {processes: figures}, `runs` {(latency, processes, variant): figures} (`figures`; variant
    "" as it is, "reload in background", "no headroom" or "before")."""
    latencies = sorted(lat for lat in alone if not isinstance(lat, tuple))  # (lat, variant): a variant's own
    counts = sorted(trained)
    variants = [
        v for v in ("before", "no headroom", "", "reload in background") if any(key[2] == v for key in runs)
    ]
    print(
        f"\nGRPO step time, sync vs async, {args.batch} episodes per step, median of steps 2..{args.steps} "
        f"(CPU, {cores()} cores; async: max_staleness {args.max_staleness}). overlap = async s/step / "
        "max(rollout alone, training alone): 1.00 is perfect; vs CPU bound = async s/step / max(rollout alone, "
        "training alone, CPU s of both / cores)"
    )
    print(
        f"{'run':72} {'s/step':>7} {'vs single':>9} {'async/sync':>10} {'overlap':>7} {'vs CPU bound':>12} "
        f"{'CPU s':>6} {'trainer idle':>12} {'worker idle':>11} {'sync s':>6} {'staleness':>9} {'dropped':>7}"
    )

    def row(label: str, step: float, *rest: str) -> None:
        print(f"{label:72} {step:7.3f} {step / base:9.2f} " + " ".join(rest))

    blank = f"{'':>10} {'':>7} {'':>12}"
    row(f"TRL single-turn GRPO (generate), {n_tokens} tokens per completion", base)
    for lat in latencies:
        row(f"Prompt-R1 two-turn, sync (generate), env {lat:.1f} s", sync[lat][0])
    for lat in latencies:
        for key, what in ((lat, ""), ((lat, "no headroom"), ", no headroom")):
            if key in alone:
                row(
                    f"rollout alone (worker, vLLM server), env {lat:.1f} s{what}",
                    alone[key]["step"],
                    f"{blank} {alone[key]['cpu']:6.2f}",
                )
    for n in counts:
        t = trained[n]
        row(
            f"training alone (replayed samples), {processes_label(n)}",
            t["step"],
            f"{blank} {t['cpu']:6.2f} {t['trainer_idle']:12.0%} {'':>11} {t['sync']:6.2f}",
        )
    for lat, n, variant in [(lat, n, v) for lat in latencies for n in counts for v in variants]:
        r = runs[lat, n, variant]
        # The rows whose worker keeps no headroom are set against the rollout alone measured the same way.
        ceiling = (
            alone.get((lat, "no headroom"), alone[lat])
            if variant in ("before", "no headroom")
            else alone[lat]
        )
        overlap = r["step"] / max(ceiling["step"], trained[n]["step"])
        bound = r["step"] / cpu_bound(ceiling, trained[n])
        what = f", {variant}" if variant else ""
        row(
            f"Prompt-R1 two-turn, async, {processes_label(n)}, env {lat:.1f} s{what}",
            r["step"],
            f"{sync[lat][0] / r['step']:10.2f} {overlap:7.2f} {bound:12.2f} {r['cpu']:6.2f} "
            f"{r['trainer_idle']:12.0%} {r['worker_idle']:11.0%} {r['sync']:6.2f} {r['staleness']:9.2f} "
            f"{r['dropped']:7.0f}",
        )
    print(
        "CPU s: CPU seconds per step of every process of the benchmark (trainer ranks, rollout worker, vLLM "
        "server, scripted environment)"
    )
    if "reload in background" in variants:
        print(
            "reload in background: the trainer training its next step while the server reloads the weights; the "
            "other rows wait for the reload"
        )
    if "no headroom" in variants:
        print(
            "no headroom: the worker keeping max_inflight_tasks samples in flight or queued; the other rows keep one "
            "step's samples of it free"
        )
    if "before" in variants:
        print(
            "before: as it was before the overlap work: the server paused for the whole weight sync (the weights "
            "file written while paused) and the worker starting groups whatever the samples queued, with no headroom; "
            "the other async rows pause it only for the reload, and count queued samples against max_inflight"
        )
    breakdown = [
        (f"training alone (replayed samples), {processes_label(n)}", trained[n], False) for n in counts
    ]
    breakdown += [
        (f"async, {processes_label(n)}, env {lat:.1f} s{f', {v}' if v else ''}", runs[lat, n, v], True)
        for lat in latencies
        for n in counts
        for v in variants
    ]
    print_breakdown(args, breakdown)


def print_breakdown(args, rows: list[tuple[str, dict, bool]]) -> None:
    """Where the async steps' seconds went, a row per (label, `figures`, whether its groups' seconds are its own:
    not for replayed samples, whose groups ran in the rollout alone)."""
    print(
        f"\nwhere an async step's seconds went, means over steps 2..{args.steps}: the step (wait for samples, "
        "training, weight sync, other; named = the share of the step the first three cover), then a group's "
        "seconds in the rollout worker, averaged over the groups a step trained on"
    )
    step_cols = ("step", "wait", "training", "weight_sync", "other")
    group_cols = ("rollout", "generate", "environment", "loop", "scoring")
    print(
        f"{'run':48} {'step s':>6} {'wait':>6} {'train':>6} {'sync':>6} {'other':>6} {'named':>6} | "
        f"{'group':>6} {'gen':>6} {'env':>6} {'loop':>6} {'score':>6}"
    )
    for label, figures, own in rows:
        parts = figures.get("parts", {})
        if "step" not in parts:
            continue
        step = " ".join(f"{parts.get(c, math.nan):6.2f}" for c in step_cols)
        named = 1 - parts.get("other", math.nan) / parts["step"]
        group = " ".join(f"{parts.get(c, math.nan):6.2f}" if own else f"{'-':>6}" for c in group_cols)
        print(f"{label:48} {step} {named:6.0%} | {group}")
