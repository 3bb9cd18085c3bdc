"""`vllm serve` of a local model on 127.0.0.1 as the async trainer's CPU route needs it (tests and benchmarks).

    root, process = start_vllm_server(model_folder, log_path)   # root: http://127.0.0.1:PORT (no /v1)

Dev mode (`/pause`, `/resume`, `/collective_rpc`), the project's worker extension (weights from a file),
float32 and processed log-probabilities (`prompt_r1.training.shared.vllm_reload.CPU_SERVER_FLAGS`), and an explicit
KV cache: on CPU vLLM sizes it as a share of the machine's memory minus the process's own, which can come out
below zero. vLLM's CPU build starts in about a minute on two idle cores; up to 15 minutes are allowed (on a
loaded machine it has taken more than 5).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

__all__ = ["start_vllm_server", "stop_vllm_server"]


def start_vllm_server(
    model: str | Path,
    log: str | Path,
    *,
    served_name: str = "agent",
    max_model_len: int = 2048,
    timeout: float = 900,
    seed: int | None = None,
    flags: str | None = None,
) -> tuple[str, subprocess.Popen]:
    """Start the server, wait until it answers `/health`, and return its root URL and process (the caller
    terminates it). `seed`: the server's sampling seed (`--seed`; requests sampled together still draw in
    arrival order). `flags`: the server's own flags (by default the async trainer's, `CPU_SERVER_FLAGS`). Raises
    RuntimeError with the log's tail when it exits or does not come up in `timeout` s.

    A server that fails on a torn entry of vLLM's compile cache (`torn_compile`) is started once more with that
    entry removed."""
    from prompt_r1.training.shared.vllm_reload import CPU_SERVER_FLAGS

    start = functools.partial(
        _start_once,
        model,
        log,
        served_name,
        max_model_len,
        timeout,
        seed,
        CPU_SERVER_FLAGS if flags is None else flags,
    )
    try:
        return start()
    except RuntimeError:
        entry = torn_compile(Path(log).read_text(errors="replace"))
        if entry is None:
            raise
    shutil.rmtree(entry, ignore_errors=True)
    return start()


_TORN = re.compile(r"ImportError: (/\S+?\.so): file too short")


def torn_compile(log_text: str) -> Path | None:
    """The compile-cache entry a failed start names as torn, if any. vLLM compiles the model into a cache every
    later start of the same model shape reads (VLLM_CACHE_ROOT, by default ~/.cache/vllm); a server killed while
    it compiled leaves an empty shared object there, and every later start then fails with "file too short". The
    entry is the folder under `torch_compile_cache/<kind>/` that holds the file (the whole compile, rebuilt at the
    next start)."""
    found = _TORN.search(log_text)
    if found is None:
        return None
    path = Path(found.group(1))
    for parent in path.parents:
        if parent.parent.parent.name == "torch_compile_cache":
            return parent
    return None


def _start_once(
    model: str | Path,
    log: str | Path,
    served_name: str,
    max_model_len: int,
    timeout: float,
    seed: int | None,
    flags: str,
) -> tuple[str, subprocess.Popen]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
        "--port", str(port), "--max-model-len", str(max_model_len), "--served-model-name", served_name,
        *shlex.split(flags), *(["--seed", str(seed)] if seed is not None else []),
    ]  # fmt: skip
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    with Path(log).open("w") as handle:  # the child keeps its own copy of the descriptor
        # A session of its own: the server's engine and worker are processes of their own, which a signal to the
        # server alone leaves running (orphaned, about 2 GB each) when the server dies without shutting them down.
        process = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    root = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"vllm serve exited: {Path(log).read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{root}/health", timeout=2):
                    return root, process
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"vllm serve did not start in {timeout:.0f} s: {Path(log).read_text()[-3000:]}")
    except BaseException:
        # Whatever ends the wait (the server's exit, the timeout, a test's timeout or Ctrl-C), no server is left
        # behind: an engine it had started may still run, about 2 GB, and a start no one waits for is never stopped.
        stop_vllm_server(process, kill=True)
        raise


def stop_vllm_server(process: subprocess.Popen, *, kill: bool = False, timeout: float = 30) -> None:
    """Stop a `vllm serve` process with its engine and worker processes: SIGTERM to all of them (SIGKILL with
    `kill`, as a crash), then SIGKILL to whatever is left after `timeout` s. Its whole process group when it leads
    one (`start_vllm_server`'s do), else the server alone."""
    import contextlib
    import signal

    def send(signum: int) -> None:
        try:
            leader = os.getpgid(process.pid) == process.pid
        except ProcessLookupError:
            leader = True  # reaped already: the group it led may still hold the engine
        with contextlib.suppress(ProcessLookupError):
            (os.killpg if leader else os.kill)(process.pid, signum)

    send(signal.SIGKILL if kill else signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout)
    send(signal.SIGKILL)  # the engine may outlive the server it belonged to
    if process.poll() is None:
        process.wait(timeout)
