"""Run one benchmark function across N trainer processes: `accelerate launch` with training/accelerate/fsdp2.yaml.

    result = launch_ranks("grpo_step.async_rank", {"model": ...}, processes=2, folder=tmp)

The async trainer across processes is a launch, not a call: `launch_ranks` pickles the keywords to a file, starts
`accelerate launch --config_file training/accelerate/fsdp2.yaml --num_processes N evals/bench/async_ranks.py SPEC`
and returns what the function returned on the main process (rank 0, where the rollout worker runs). Every rank
calls `module.function(**keywords)`; the function is a benchmark's own (`grpo_step.py`, `learning.py`), found beside
this file. On CPU each process gets one thread (2 processes on 2 cores), as the project's FSDP2 test runs them.
A launch that fails raises RuntimeError with the end of its log.
"""

from __future__ import annotations

import importlib
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from prompt_r1.training.run import leave_process_group

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FSDP2 = ROOT / "training" / "accelerate" / "fsdp2.yaml"


def launch_ranks(
    call: str, keywords: dict[str, Any], *, processes: int, folder: Path, timeout: float = 7200
) -> Any:
    """`module.function(**keywords)` on `processes` FSDP2 ranks (see the module docstring); its main process's
    return value. The spec, the result and the launch's log (`ranks.log`) are kept in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    spec, result, log = folder / "spec.pkl", folder / "result.pkl", folder / "ranks.log"
    result.unlink(missing_ok=True)
    spec.write_bytes(pickle.dumps({"call": call, "keywords": keywords, "result": str(result)}))
    with socket.socket() as sock:  # not accelerate's fixed 29500, which another launch may hold
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    accelerate = Path(sys.executable).parent / "accelerate"
    command = [
        str(accelerate), "launch", "--config_file", str(FSDP2), "--num_processes", str(processes),
        "--main_process_port", str(port), str(Path(__file__).resolve()), str(spec),
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    with log.open("w") as handle:
        code = subprocess.run(
            command, stdout=handle, stderr=subprocess.STDOUT, env=env, timeout=timeout
        ).returncode
    if code != 0 or not result.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{call} on {processes} processes failed (exit {code}), its log {log}:\n{tail}")
    return pickle.loads(result.read_bytes())


def main(spec_path: str) -> int:
    spec = pickle.loads(Path(spec_path).read_bytes())
    sys.path.insert(0, str(HERE))  # the benchmarks' modules
    module, function = spec["call"].rsplit(".", 1)
    value = getattr(importlib.import_module(module), function)(**spec["keywords"])
    if int(os.environ.get("RANK", "0")) == 0:
        Path(spec["result"]).write_bytes(pickle.dumps(value))
    # As `prompt-r1 train` does: a rank done while rank 0 still worked once aborted at exit and failed the launch.
    leave_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
