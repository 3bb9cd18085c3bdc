"""Weight transfer from the async trainer to the vLLM server that serves the rollout worker's agent.

TRL's `AsyncGRPOTrainer` takes a `weight_transfer` object (`WeightTransferProtocol`: `init_weight_transfer`,
`pause`, `send_weights(iterator)`, `resume`, `destroy`) and calls it after every `weight_sync_steps` optimizer
steps. Two implementations, picked by `weight_transfer_for`:

- **CUDA: TRL's own `WeightTransferClient`** (`weight_transfer_for` returns None and the trainer builds it). It
  streams the parameters over NCCL into a server started as
  `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend":"nccl"}'` on its own GPU.
- **CPU: `FileWeightTransfer`.** NCCL needs CUDA, and vLLM's CPU build prepacks its linear weights, so a
  parameter cannot be written in place. The trainer writes the parameters to one safetensors file (a `.part`
  file, then `os.replace`). It then asks the server to reload that file through the dev-mode `/collective_rpc`,
  served by the project's worker extension `prompt_r1.training.shared.vllm_reload.FileWeightReload`: vLLM's layerwise
  reload, then the prepacked embedding copies refreshed. This is the route server-mode GRPO already uses on CPU.
  The server is started as
  `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --dtype float32 --logprobs-mode processed_logprobs
  --worker-extension-cls prompt_r1.training.shared.vllm_reload.FileWeightReload`, and must read the trainer's output folder
  at the same absolute path.

Both pause the server with `/pause?mode=keep` before the swap: requests in flight are frozen, not aborted, and go
on with the new weights after `/resume`. TRL's pauses it for the whole sync; `FileWeightTransfer` only for the
reload (`write_before_pause`): the parameters are gathered and the file written while the server still samples
with the old weights, which is what it would sample with anyway until the reload. Their tokens sampled before the sync keep the log-probabilities of the
policy that sampled them, and the trainer's importance ratio accounts for them. A server that does not answer
fails the sync with a `WeightSyncError` that names it, never a hang: every request has a timeout.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prompt_r1.core.errors import ConfigError, PromptR1Error
from prompt_r1.training.shared.vllm_reload import PROBE, RELOAD, server_start_command

__all__ = ["FileWeightTransfer", "WeightSyncError", "weight_transfer_for"]


class WeightSyncError(PromptR1Error, RuntimeError):
    """The vLLM server did not take the trainer's weights (gone, or without the file route)."""


def _request(url: str, body: dict | None, timeout: float, method: str = "POST") -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read()
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        return {}


class FileWeightTransfer:
    """`WeightTransferProtocol` through a safetensors file and the server's `/collective_rpc` (CPU; see the module
    docstring). `folder`: where the weights file is written (the trainer's OUTPUT_DIR/vllm_weights)."""

    def __init__(
        self,
        base_url: str,
        folder: str | Path,
        *,
        timeout: float = 600.0,
        control_timeout: float = 60.0,
        write_before_pause: bool = True,
    ):
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.folder = Path(folder).resolve()
        self.timeout, self.control_timeout = timeout, control_timeout
        # The server is paused only for the reload: the gather and the file's writing happen while it samples
        # (False: paused from the trainer's `pause`, as TRL's NCCL transfer is, for the whole sync).
        self.write_before_pause = write_before_pause
        self._pause_due = self.paused = False
        self.syncs = 0
        self.last_sync_s: float | None = None
        self.paused_s = 0.0  # seconds the server was paused, all syncs
        self._paused_at = 0.0
        self.on_pause: Any = None  # called with True when the server is paused, False when it resumes

    def _post(self, route: str, body: dict | None = None, *, timeout: float | None = None) -> dict[str, Any]:
        url = f"{self.base_url}{route}"
        try:
            return _request(url, body, timeout or self.control_timeout)
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise WeightSyncError(
                f"the vLLM server at {self.base_url} refused {route} ({exc.code}): {detail}"
            ) from None
        except OSError as exc:  # refused, reset, timed out: the server is gone or stuck
            raise WeightSyncError(
                f"the vLLM server at {self.base_url} did not answer {route} ({exc}): is it still running?"
            ) from None

    def init_weight_transfer(self) -> None:
        """Check, once at start, that the server can reload weights from a file, and samples with the
        log-probabilities the trainer compares against."""
        try:
            answer = self._post("/collective_rpc", {"method": PROBE})
        except WeightSyncError as exc:
            answer = {"error": str(exc)}
        if (answer.get("results") or [None])[0] != "file":
            raise ConfigError(
                f"the vLLM server at {self.base_url} cannot take the trainer's weights without CUDA "
                f"({answer.get('error', answer)}): start it as {server_start_command()}"
            )
        mode = _logprobs_mode(self.base_url, self.control_timeout)
        if mode is not None and mode != "processed_logprobs":
            raise ConfigError(
                f"the vLLM server at {self.base_url} returns {mode}: the importance ratio needs the log-probabilities "
                "of the distribution it sampled from (after temperature); start it with --logprobs-mode "
                "processed_logprobs"
            )

    def pause(self) -> None:
        if self.write_before_pause:
            self._pause_due = True  # paused in send_weights, once the file is written
        else:
            self._pause_now()

    def _pause_now(self) -> None:
        # `keep`: requests in flight wait, then finish with the new weights (TRL's own choice for async GRPO).
        self._post("/pause?mode=keep")
        self.paused, self._pause_due, self._paused_at = True, False, time.monotonic()
        if self.on_pause is not None:
            self.on_pause(True)

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        from safetensors.torch import save_file

        started = time.monotonic()
        tensors = {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in iterator}
        self.folder.mkdir(parents=True, exist_ok=True)
        path, part = self.folder / "weights.safetensors", self.folder / f"weights.{os.getpid()}.part"
        save_file(tensors, str(part))
        os.replace(part, path)
        if self._pause_due:
            self._pause_now()
        answer = self._post("/collective_rpc", {"method": RELOAD, "args": [str(path)]}, timeout=self.timeout)
        if not answer.get("results"):
            raise WeightSyncError(
                f"the vLLM server at {self.base_url} did not reload the weights from {path} "
                f"({answer.get('error', answer)}): it must read that file at that same absolute path"
            )
        self._post("/reset_prefix_cache")  # cached prefixes were computed by the old weights
        self.syncs += 1
        self.last_sync_s = time.monotonic() - started

    def resume(self) -> None:
        self._pause_due = False
        if self.paused:
            self._post("/resume")
            self.paused = False
            self.paused_s += time.monotonic() - self._paused_at
            if self.on_pause is not None:
                self.on_pause(False)

    def destroy(self) -> None:
        """Nothing to release: no process group, and the file is the last synced policy (kept for inspection)."""


def _logprobs_mode(base_url: str, timeout: float) -> str | None:
    """The server's `logprobs_mode` from its dev-mode `/server_info`, or None when it does not say."""
    try:
        with urllib.request.urlopen(
            f"{base_url}/server_info?config_format=json", timeout=timeout
        ) as response:
            info = json.loads(response.read())
    except (OSError, ValueError):
        return None
    model = ((info or {}).get("vllm_config") or {}).get("model_config") or {}
    mode = model.get("logprobs_mode")
    return mode if isinstance(mode, str) else None


def weight_transfer_for(
    trainer_device: Any, base_url: str, output_dir: str | Path, *, file: bool = False
) -> FileWeightTransfer | None:
    """The weight transfer for a trainer on `trainer_device`: None on CUDA (the trainer then builds TRL's NCCL
    `WeightTransferClient` itself, and with a LoRA adapter and a server started with `--enable-lora` syncs the
    adapter alone), else, or with `file` (a server sharing the trainer's only GPU: NCCL cannot join two
    processes on one device), a `FileWeightTransfer` writing to OUTPUT_DIR/vllm_weights."""
    import torch

    if torch.device(trainer_device).type == "cuda" and not file:
        return None
    return FileWeightTransfer(base_url, Path(output_dir) / "vllm_weights")
