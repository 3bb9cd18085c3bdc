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
with the old weights, which is what it would sample with anyway until the reload. Their tokens sampled before the
sync keep the log-probabilities of the policy that sampled them, and the trainer's importance ratio accounts for
them. A server that does not answer fails the sync with a `WeightSyncError` that names it, never a hang: every
request has a timeout.

The reload can go on in the background (`reload_in_background=True`; off by default): once the file is written the
trainer trains its next step while the server pauses, reloads and resumes, so the trainer waits for the gather and
the write, not for the server. The policy version the rollout worker stamps on its episodes moves on only once the
server is paused for the reload (`when_new_weights`: every token sampled from then on is the new policy's; until
then it is the old one's), and the next sync first waits for the last reload, whose failure it raises. The first
sync, before anything is sampled, is waited for. Where the server and the trainer share cores it does not pay: on 2
CPU cores it made the async step slower in 7 of 8 rows measured (`evals/bench/grpo_step.py --async
--reload-in-background`, docs/async-grpo.md), the trainer's next step and the server's reload taking the same cores.
It is for a server with resources of its own; it has not been measured on one.
"""

from __future__ import annotations

import json
import os
import threading
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
    docstring). `folder`: where the weights file is written (the trainer's OUTPUT_DIR/vllm_weights);
    `write_before_pause`: pause the server only for the reload (else from `pause`, for the whole sync);
    `reload_in_background`: the trainer goes on once the file is written (by default it waits for the reload)."""

    def __init__(
        self,
        base_url: str,
        folder: str | Path,
        *,
        timeout: float = 600.0,
        control_timeout: float = 60.0,
        write_before_pause: bool = True,
        reload_in_background: bool = False,
    ):
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.folder = Path(folder).resolve()
        self.timeout, self.control_timeout = timeout, control_timeout
        # The server is paused only for the reload: the gather and the file's writing happen while it samples
        # (False: paused from the trainer's `pause`, as TRL's NCCL transfer is, for the whole sync).
        self.write_before_pause = write_before_pause
        self.reload_in_background = reload_in_background
        self._pause_due = self.paused = False
        self.syncs = 0
        # The trainer's share of the last sync (gather and write, or all of it), and the server's (pause, reload
        # and resume).
        self.last_sync_s: float | None = None
        self.last_reload_s: float | None = None
        self._lock = threading.Lock()
        self._reloading = False  # a reload in the background whose server is not paused for it yet
        self._reload: threading.Thread | None = None
        self._reload_error: BaseException | None = None
        self._after: list[Any] = []  # called once the server samples with the weights last sent
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
        self.wait()  # the last sync's reload first: it resumes the server when it is done
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

        self.wait()
        started = time.monotonic()
        tensors = {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in iterator}
        self.folder.mkdir(parents=True, exist_ok=True)
        path, part = self.folder / "weights.safetensors", self.folder / f"weights.{os.getpid()}.part"
        save_file(tensors, str(part))
        os.replace(part, path)
        pause_due, self._pause_due = self._pause_due, False
        if not self.reload_in_background or self.syncs == 0:  # the first: nothing sampled yet to overlap with
            self._reload_from(path, pause_due)
        else:
            self._reloading, self._reload_error = True, None
            self._reload = threading.Thread(
                target=self._reload_then_resume,
                args=(path, pause_due),
                name="vllm-weight-reload",
                daemon=True,
            )
            self._reload.start()
        self.last_sync_s = time.monotonic() - started

    def _reload_from(self, path: Path, pause_due: bool) -> None:
        started = time.monotonic()
        if pause_due:
            self._pause_now()
        # Requests wait for the new weights from here: what is sampled now is the new policy's.
        if self.paused:
            self._new_weights_live()
        answer = self._post("/collective_rpc", {"method": RELOAD, "args": [str(path)]}, timeout=self.timeout)
        if not answer.get("results"):
            raise WeightSyncError(
                f"the vLLM server at {self.base_url} did not reload the weights from {path} "
                f"({answer.get('error', answer)}): it must read that file at that same absolute path"
            )
        self._post("/reset_prefix_cache")  # cached prefixes were computed by the old weights
        self.syncs += 1
        self.last_reload_s = time.monotonic() - started

    def _reload_then_resume(self, path: Path, pause_due: bool) -> None:
        try:
            try:
                self._reload_from(path, pause_due)
            except Exception as exc:  # raised to the trainer by the next sync, or at the end
                self._reload_error = exc
            try:
                self._resume_now()  # this thread alone resumes the server it paused (`resume` leaves it)
            except Exception as exc:
                self._reload_error = self._reload_error or exc
            if self._reload_error is None:
                self._new_weights_live()  # not paused for it (never asked to pause): the reload is done
        finally:
            with self._lock:
                self._reloading, self._after = False, []  # a failed reload's calls are dropped with it

    def _new_weights_live(self) -> None:
        with self._lock:
            self._reloading, after = False, self._after
            self._after = []
        for call in after:
            call()

    def when_new_weights(self, call: Any) -> None:
        """`call()` once the server samples only with the weights last sent (paused for their reload, or
        holding them): now, or from the reload in the background (not at all if it fails before: the trainer
        hears of that at the next sync)."""
        with self._lock:
            if self._reloading:
                self._after.append(call)
                return
        call()

    def wait(self) -> None:
        """Wait for the reload in the background, if one is going on, and raise its failure."""
        if self._reload is not None:
            self._reload.join()
            self._reload = None
        error, self._reload_error = self._reload_error, None
        if error is not None:
            raise error

    def resume(self) -> None:
        self._pause_due = False
        if self._reload is not None:
            return  # a reload in the background: its thread resumes the server once the reload is done
        self._resume_now()

    def _resume_now(self) -> None:
        with self._lock:
            if not self.paused:
                return
            self.paused = False
        self._post("/resume")
        self.paused_s += time.monotonic() - self._paused_at
        if self.on_pause is not None:
            self.on_pause(False)

    def destroy(self) -> None:
        """Wait for the last reload (the server then holds the trained weights). Nothing else to release: no
        process group, and the file is the last synced policy (kept for inspection)."""
        self.wait()


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
