"""What the async overlap benchmark measures, and what it changed (`evals/bench/grpo_step.py --async`).

The rollout worker's idle clock (no group generating, or the server paused), and the file weight transfer pausing
the vLLM server only for the reload: the weights gathered and written while it still samples. The transfer is
checked against a real HTTP server on 127.0.0.1 that answers the server's control routes and records, for each,
whether the weights file was already on disk. The benchmark's argument checks run its real command line.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import ROOT

from prompt_r1.training.asynchronous.weight_transfer import FileWeightTransfer, WeightSyncError
from prompt_r1.training.asynchronous.worker import IdleClock


def test_the_idle_clock_counts_time_with_no_group_generating_or_the_server_paused():
    clock = IdleClock()
    time.sleep(0.1)  # nothing started: idle
    clock.busy(+1)
    time.sleep(0.1)  # a group generating: busy
    clock.paused(True)
    time.sleep(0.1)  # the server paused under it: idle
    clock.paused(False)
    clock.busy(+1)
    clock.busy(-1)
    time.sleep(0.1)  # one group still generating: busy
    clock.busy(-1)
    idle = clock.idle_s()
    assert 0.19 <= idle < 0.3, idle
    time.sleep(0.05)
    assert clock.idle_s() >= idle + 0.05  # idle again: the open interval counts when read


class _ControlServer(ThreadingHTTPServer):
    """The vLLM server's control routes the transfer calls, each recorded with whether `weights` existed;
    `reload_s`: how long a reload takes; `fail`: the reload answers 500."""

    def __init__(self, weights: Path, reload_s: float = 0.0, fail: bool = False) -> None:
        self.weights, self.calls, self.reload_s, self.fail = weights, [], reload_s, fail
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                outer.calls.append((self.path, outer.weights.is_file()))
                reload = self.path == "/collective_rpc"
                if reload:
                    time.sleep(outer.reload_s)
                body = {"results": [True]} if reload else {}
                raw = json.dumps(body).encode()
                self.send_response(500 if reload and outer.fail else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.mark.parametrize("write_before_pause", [True, False])
@pytest.mark.parametrize("in_background", [True, False])
def test_the_file_transfer_pauses_the_server_only_for_the_reload(tmp_path, write_before_pause, in_background):
    import torch

    folder = tmp_path / "vllm_weights"
    server = _ControlServer(folder / "weights.safetensors", reload_s=0.3)  # resumed only after the reload
    try:
        transfer = FileWeightTransfer(
            server.url, folder, write_before_pause=write_before_pause, reload_in_background=in_background
        )
        said = []
        transfer.on_pause = said.append
        # TRL's order: pause, send, resume (twice: the first sync is always waited for); destroy at the end.
        for value in (1.0, 2.0):
            transfer.pause()
            transfer.send_weights(iter([("w", torch.full((3,), value))]))
            time.sleep(
                0.2
            )  # the trainer's own work between the send and its resume (a barrier, LoRA unmerged)
            transfer.resume()
        transfer.destroy()
    finally:
        server.shutdown()
    routes = [route for route, _ in server.calls]
    assert routes == ["/pause?mode=keep", "/collective_rpc", "/reset_prefix_cache", "/resume"] * 2
    # Written before the pause (the server sampled meanwhile), or paused first (the whole sync, TRL's own order).
    assert server.calls[0][1] is write_before_pause
    assert said == [True, False] * 2 and transfer.paused_s > 0 and not transfer.paused
    assert transfer.syncs == 2


def test_the_trainer_goes_on_while_the_server_reloads_and_the_worker_names_the_new_policy_once_paused(
    tmp_path,
):
    """`reload_in_background=True`: after the first sync (waited for: nothing is sampled yet), `send_weights` returns
    once the file is written; the rollout worker's version moves on once the server is paused for the reload
    (every token from then on is the new policy's), before the reload is done; the next sync waits for the reload,
    and a failed reload is raised there, not lost."""
    import torch

    folder = tmp_path / "vllm_weights"
    server = _ControlServer(folder / "weights.safetensors", reload_s=0.6)

    def sync(value: float) -> float:
        started = time.monotonic()
        transfer.pause()
        transfer.send_weights(iter([("w", torch.full((3,), value))]))
        transfer.resume()
        return time.monotonic() - started

    try:
        transfer = FileWeightTransfer(server.url, folder, reload_in_background=True)
        assert sync(1.0) >= 0.6 and transfer.syncs == 1 and not transfer.paused  # the first: waited for
        assert sync(2.0) < 0.5  # the trainer goes on while the server reloads
        seen = []
        transfer.when_new_weights(lambda: seen.append((transfer.paused, transfer.syncs)))
        started = time.monotonic()
        transfer.pause()  # the next sync: waits for the reload, which resumes the server
        assert seen == [(True, 1)]  # named once paused, before the reload was done
        assert time.monotonic() - started > 0.1 and transfer.syncs == 2 and not transfer.paused
        transfer.send_weights(iter([("w", torch.zeros(3))]))
        transfer.resume()
        transfer.destroy()  # the end of training: the server holds the last weights
        assert [route for route, _ in server.calls].count("/collective_rpc") == 3 and transfer.syncs == 3
        transfer.when_new_weights(lambda: seen.append("now"))  # nothing pending: at once
        assert seen[-1] == "now"

        server.fail = True
        assert sync(3.0) < 0.5  # returns: the failure comes back at the next sync
        with pytest.raises(WeightSyncError, match="refused /collective_rpc"):
            transfer.pause()
        assert not transfer.paused and transfer.syncs == 3  # the server resumed all the same
    finally:
        server.shutdown()


def _bench(script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "evals/bench" / script), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )


class _FakeProcess:
    """A `psutil.Process` whose CPU readings the test sets: {pid: (user, system, children_user, children_system)},
    the children each process has now, and the pids that end between the listing and the reading."""

    times: dict[int, tuple[float, float, float, float]] = {}
    tree: dict[int, list[int]] = {}
    gone: set[int] = set()

    def __init__(self, pid: int) -> None:
        if pid not in self.times:
            raise _NoSuchProcess(pid)
        self.pid = pid

    def children(self, recursive: bool = False) -> list[_FakeProcess]:
        found = [_FakeProcess(pid) for pid in self.tree.get(self.pid, [])]
        return [g for c in found for g in [c, *c.children(recursive=True)]] if recursive else found

    def cpu_times(self):
        if self.pid in self.gone:
            raise _NoSuchProcess(self.pid)
        user, system, children_user, children_system = self.times[self.pid]
        return types.SimpleNamespace(
            user=user, system=system, children_user=children_user, children_system=children_system
        )


class _NoSuchProcess(Exception):
    pass


def test_the_cpu_bound_counts_every_process_of_the_benchmark_and_the_cores_they_share(monkeypatch):
    """`vs CPU bound` (`async_measure.py`): a child's CPU time is the benchmark's (counted live, and after it
    ends), and where rollouts and training need the same cores the bound is their CPU seconds over the cores.
    The CPU readings are the test's own (a fake `psutil`): a measured figure depends on what else the machine
    runs, and belongs to the benchmarks."""
    sys.path.insert(0, str(ROOT / "evals/bench"))
    import async_measure

    fake = types.SimpleNamespace(
        Process=_FakeProcess, NoSuchProcess=_NoSuchProcess, AccessDenied=PermissionError
    )
    monkeypatch.setitem(sys.modules, "psutil", fake)
    monkeypatch.setattr(_FakeProcess, "gone", set())
    # The benchmark (pid 1) with a trainer rank (2) whose own child (3) is a vLLM engine, and a worker (4).
    monkeypatch.setattr(_FakeProcess, "tree", {1: [2, 4], 2: [3]})
    monkeypatch.setattr(
        _FakeProcess,
        "times",
        {
            1: (1.0, 0.25, 0.0, 0.0),
            2: (2.0, 0.5, 0.0, 0.0),
            3: (0.75, 0.25, 0.0, 0.0),
            4: (0.5, 0.0, 0.0, 0.0),
        },
    )
    before = async_measure.tree_cpu(1)
    assert before == 5.25  # every process of the tree, user and system
    assert async_measure.tree_cpu(3) == 1.0  # a subtree counts only its own
    # The engine burns 0.6 s more while it lives: counted live.
    _FakeProcess.times[3] = (1.25, 0.35, 0.0, 0.0)
    live = async_measure.tree_cpu(1) - before
    assert live == pytest.approx(0.6)
    # It ends and its parent waits for it: its seconds move into the parent's children_* and stay counted.
    del _FakeProcess.times[3]
    _FakeProcess.tree[2] = []
    _FakeProcess.times[2] = (2.0, 0.5, 1.25, 0.35)
    assert async_measure.tree_cpu(1) - before == pytest.approx(live)
    # A process that ends between the listing and the reading is skipped, not an error; a root that is gone: nan.
    _FakeProcess.gone.add(4)
    assert async_measure.tree_cpu(1) == pytest.approx(5.85 - 0.5)
    assert math.isnan(async_measure.tree_cpu(99))

    monkeypatch.setattr(async_measure, "cores", lambda: 2)
    rollout, training = {"step": 1.0, "cpu": 1.6}, {"step": 0.5, "cpu": 1.0}
    assert async_measure.cpu_bound(rollout, training) == pytest.approx(1.3)  # (1.6 + 1.0) / 2 cores
    monkeypatch.setattr(async_measure, "cores", lambda: 8)
    assert async_measure.cpu_bound(rollout, training) == 1.0  # cores to spare: the longer side alone
    run = {
        "step_s": [2.0, 3.0, 4.0], "wait_s": [0.0, 0.5, 0.5], "sync_s": [0.1], "tokens": [], "staleness": [],
        "marks": [(10.0, 1.0, 5.0), (12.0, 1.5, 8.0), (14.0, 2.0, 12.0)],
    }  # fmt: skip
    got = async_measure.figures(run)
    assert got["cpu"] == 3.5 and got["worker_idle"] == 0.25 and got["step"] == 3.0


def test_the_benchmarks_refuse_processes_that_do_not_split_the_step_or_the_sync_trainer():
    uneven = _bench("grpo_step.py", "--async", "--processes", "3", "--batch", "8")
    assert uneven.returncode == 2 and "--processes must be at least 1 and divide --batch" in uneven.stderr
    sync_only = _bench("grpo_step.py", "--processes", "2")
    assert sync_only.returncode == 2 and "add --async" in sync_only.stderr
    sync_learning = _bench("learning.py", "--processes", "2")
    assert sync_learning.returncode == 2 and "add --async" in sync_learning.stderr
    uneven = _bench("learning.py", "--async", "--processes", "3")  # 32 episodes a step
    assert uneven.returncode == 2 and "--batch must be a multiple of --processes" in uneven.stderr


def test_the_gpu_script_prints_its_plan_without_loading_anything():
    """What a GPU machine will run, in order (`grpo_gpu.py --dry-run`, the first thing `gpu_async.sh` prints)."""
    plan = _bench("grpo_gpu.py", "--async", "--skip-eager", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    assert lines[0].startswith("1. build: a Qwen2-shaped model (hidden 1024, 28 layers")
    assert [line.split(". ", 1)[1].split(":")[0] for line in lines[1:]] == [
        "sync two-turn, env 0.2 s",
        "vllm serve of the model on the last GPU (NCCL weight transfer when there are 2 or more GPUs, else through "
        "a file)",
        "async two-turn, env 0.2 s",
        "async two-turn, env 1.0 s",
        "sync two-turn, env 1.0 s",
        "TRL single-turn GRPO",
    ]
    script = (ROOT / "evals/bench/gpu_async.sh").read_text()
    assert "--dry-run" in script and "timeout" in script and " 570 " in script


def test_a_server_start_cut_short_leaves_no_server_behind(tmp_path, monkeypatch):
    """A test's timeout (pytest-timeout's signal) or Ctrl-C while `start_vllm_server` waits: the server, and any
    engine it started, stopped, not left running (about 2 GB each) for the rest of the suite."""
    import signal

    from prompt_r1.testing import vllm_process

    started = []
    popen = subprocess.Popen

    def keep(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    class CutShort(Exception):
        pass

    def cut(signum, frame):
        raise CutShort

    monkeypatch.setattr(vllm_process.subprocess, "Popen", keep)
    previous = signal.signal(signal.SIGALRM, cut)
    signal.alarm(3)  # while vLLM still imports: no model is needed to be cut short
    try:
        with pytest.raises(CutShort):
            vllm_process.start_vllm_server(tmp_path / "no-model", tmp_path / "server.log", timeout=120)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    (process,) = started
    assert process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # nothing left in its process group


def test_a_torn_compile_cache_entry_is_found_from_the_failed_start_s_log(tmp_path):
    """A server killed while vLLM compiled leaves an empty shared object in the compile cache that every later
    start of that model shape reads; `start_vllm_server` removes the entry the failed start names, then starts
    once more. The line is vLLM's own, from such a start."""
    from prompt_r1.testing.vllm_process import torn_compile

    entry = tmp_path / "vllm/torch_compile_cache/torch_aot_compile/43d569"
    torn = entry / "inductor_cache/ae/cae6nf3r.main.so"
    line = (
        "(Worker pid=12231) ERROR 11-27 18:22:36 [multiproc_executor.py:1058] torch._inductor.exc.InductorError: "
        f"ImportError: {torn}: file too short\n"
    )
    assert (
        torn_compile("Loading weights\n" + line + "RuntimeError: Engine core initialization failed") == entry
    )
    assert torn_compile("RuntimeError: Engine core initialization failed. See root cause above.") is None
    assert (
        torn_compile(f"ImportError: {tmp_path}/elsewhere/lib.so: file too short") is None
    )  # not vLLM's cache


def test_the_worker_keeps_one_steps_samples_free_only_when_trl_sizes_the_bound(tmp_path):
    """`worker_headroom`: one step's samples (per device x accumulation x processes) of `max_inflight_tasks` when
    it is left to TRL (-1), none when the user set it."""
    from helpers import tiny_grpo_config

    from prompt_r1.training.asynchronous.trainer import worker_headroom

    def config(**overrides):
        settings = dict(per_device_train_batch_size=8, num_generations=8, bf16=False, async_grpo=True)
        return tiny_grpo_config(tmp_path / "out", **{**settings, **overrides})

    assert worker_headroom(config()) == 8
    assert worker_headroom(config(gradient_accumulation_steps=2)) == 16
    assert worker_headroom(config(max_inflight_tasks=24)) == 0
