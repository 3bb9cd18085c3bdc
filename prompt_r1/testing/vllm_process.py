"""`vllm serve` of a local model on 127.0.0.1 as the async trainer's CPU route needs it (tests and benchmarks).

    root, process = start_vllm_server(model_folder, log_path)   # root: http://127.0.0.1:PORT (no /v1)

Dev mode (`/pause`, `/resume`, `/collective_rpc`), the project's worker extension (weights from a file),
float32 and processed log-probabilities (`prompt_r1.training.weight_transfer.CPU_SERVER_FLAGS`), and an explicit
KV cache: on CPU vLLM sizes it as a share of the machine's memory minus the process's own, which can come out
below zero. vLLM's CPU build starts in about a minute on two cores.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

__all__ = ["start_vllm_server"]


def start_vllm_server(
    model: str | Path,
    log: str | Path,
    *,
    served_name: str = "agent",
    max_model_len: int = 2048,
    timeout: float = 300,
    seed: int | None = None,
) -> tuple[str, subprocess.Popen]:
    """Start the server, wait until it answers `/health`, and return its root URL and process (the caller
    terminates it). `seed`: the server's sampling seed (`--seed`; requests sampled together still draw in
    arrival order). Raises RuntimeError with the log's tail when it exits or does not come up in `timeout` s."""
    from prompt_r1.training.weight_transfer import CPU_SERVER_FLAGS

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
        "--port", str(port), "--max-model-len", str(max_model_len), "--served-model-name", served_name,
        *shlex.split(CPU_SERVER_FLAGS), *(["--seed", str(seed)] if seed is not None else []),
    ]  # fmt: skip
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    with Path(log).open("w") as handle:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    root = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited: {Path(log).read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{root}/health", timeout=2):
                return root, process
        except OSError:
            time.sleep(1)
    process.kill()
    raise RuntimeError(f"vllm serve did not start in {timeout:.0f} s: {Path(log).read_text()[-3000:]}")
