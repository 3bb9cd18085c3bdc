"""Weight sync from the trained model to TRL's colocated vLLM engine when vLLM runs on CPU.

TRL's colocate sync calls `model.load_weights([(name, tensor)])` on vLLM's model. On CPU that fails: after
loading, vLLM prepacks every unquantized linear weight for its CPU kernels (oneDNN or the SGL kernel,
`layers/utils.py: dispatch_cpu_unquantized_gemm(..., remove_weight=True)`) and leaves an empty parameter with no
`weight_loader` in its place, so a second load raises `AttributeError: 'Parameter' object has no attribute
'weight_loader'`. vLLM's own `model_runner.reload_weights(weights_iterator=...)` restores the layers, loads and
repacks them (its layerwise reload), and is what is used here instead.

One more step is needed: the embedding and the LM head (`VocabParallelEmbedding`, `ParallelLMHead`) keep their
weight and a prepacked copy of it (`remove_weight=False`), and the reload updates the weight but not the copy. With
tied embeddings (Qwen3-4B, the paper's agent, ties them) the LM head then still computes logits from the old
weights. So after the reload each of those layers is processed again, which repacks it from the new weight.
`tests/test_vllm_serve.py` checks, after every sync, that the engine's log-probabilities of a fixed
continuation equal the trained model's.

On GPU TRL's own sync is used.

TRL's server mode (`vllm_mode: server`) syncs over vLLM's NCCL weight-transfer engine, which needs CUDA
(`VLLMClient.init_communicator` refuses any other device). Without CUDA the trainer writes the weights to a
safetensors file and asks the server to reload them through its dev-mode `/collective_rpc`, served by the worker
extension `FileWeightReload` (the same reload and embedding refresh as above). The server is started as
`VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --worker-extension-cls prompt_r1.training.shared.vllm_reload.FileWeightReload`
and must see the trainer's output folder (the same machine, or a shared file system).

The engine also has to compute in the trained model's dtype for its log-probabilities to be those of the model:
TRL builds the colocated `LLM` without a dtype, and vLLM's "auto" picks bfloat16 on a CPU that has it, even for a
float32 checkpoint (the engine then disagrees with the trained model by ~1e-1 in log-probability after a step).
`same_dtype_engine` passes the trainer's dtype to that constructor.

On CPU it also gives the engine an explicit KV cache and a context capped to what the loop uses
(`agents/vllm_engine.cpu_engine_defaults`, unless `VLLM_CPU_KVCACHE_SPACE` or the call says otherwise): vLLM would
size the cache as `gpu_memory_utilization` x the machine's memory minus everything the process already holds (the
trained model, the optimizer), which in a training process is easily negative.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prompt_r1.training.shared.vllm_reload import (
    RELOAD,
    SERVER_EXTENSION,
    post_json,
    probe_file_route,
    refresh_prepacked_embeddings,
    vllm_on_cpu,
)

__all__ = ["file_weight_route", "install_cpu_weight_sync", "install_sync_check", "same_dtype_engine"]


def _check_file_route(base_url: str) -> None:
    from prompt_r1.core.errors import ConfigError

    answer = probe_file_route(base_url)
    if (answer.get("results") or [None])[0] != "file":
        raise ConfigError(
            f"the vLLM server at {base_url} cannot take weights without CUDA ({answer.get('error', answer)}): "
            f"start it as VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --worker-extension-cls {SERVER_EXTENSION}"
        )


@contextlib.contextmanager
def file_weight_route() -> Iterator[None]:
    """While TRL builds a server-mode trainer on a device without CUDA, its client checks that the server has the
    file route (see the module docstring) instead of joining an NCCL group; on CUDA nothing changes."""
    try:
        from trl.generation.vllm_client import VLLMClient
    except ImportError:  # no vLLM: nothing to build
        yield
        return
    original = VLLMClient.init_communicator

    def init_communicator(self: Any, device: Any = 0) -> None:
        import torch

        where = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if where.type == "cuda":
            return original(self, device)
        _check_file_route(self.base_url)
        self.communicator = None
        return None

    VLLMClient.init_communicator = init_communicator
    try:
        yield
    finally:
        VLLMClient.init_communicator = original


def _file_sync(generation: Any, folder: Any) -> None:
    """Server mode without CUDA: every rank takes part in gathering the parameters (ZeRO-3), the main process
    writes them to one file and has the server reload it; all ranks wait, so none samples from old weights."""
    import os

    from safetensors.torch import save_file

    accelerator = generation.accelerator
    tensors = {}
    for name, param in generation._iter_named_params():
        if accelerator.is_main_process:
            tensors[name] = param.detach().to("cpu", copy=True).contiguous()
    if accelerator.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        path, part = folder / "weights.safetensors", folder / f"weights.{os.getpid()}.part"
        save_file(tensors, str(part))
        os.replace(part, path)
        client = generation.vllm_client
        try:
            answer = post_json(
                f"{client.base_url}/collective_rpc", {"method": RELOAD, "args": [str(path)]}, timeout=600
            )
        except OSError as exc:  # the server's own error is in its log
            answer = {"error": str(exc)}
        if not answer.get("results"):
            raise RuntimeError(
                f"the vLLM server at {client.base_url} did not reload the weights from {path} "
                f"({answer.get('error', answer)}): it must read that file at that same absolute path (the same "
                "machine or a shared file system mounted alike); its log says more"
            )
        client.reset_prefix_cache()
    accelerator.wait_for_everyone()


def _cpu_sync(generation: Any) -> None:
    """TRL's `VLLMGeneration.sync_weights` for colocate mode on CPU (see the module docstring)."""
    if generation.enable_sleep_mode:  # as TRL's own sync: the weights must be mapped before they are written
        generation.llm.wake_up(tags=["weights"])
        generation._llm_weights_sleeping = False
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    # TRL's iterator gathers each parameter (DeepSpeed ZeRO-3, FSDP), merges PEFT adapters and renames to vLLM's
    # names; the reload consumes it parameter by parameter.
    runner.reload_weights(weights_iterator=generation._iter_named_params())
    refresh_prepacked_embeddings(runner.get_model())
    generation.llm.reset_prefix_cache()


def install_cpu_weight_sync(trainer: Any) -> bool:
    """Give a GRPO trainer the sync it needs without CUDA: a colocated engine on CPU reloads in place, a server
    reloads from a file. Returns whether one was installed (False with no vLLM or on CUDA)."""
    from pathlib import Path

    generation = getattr(trainer, "vllm_generation", None)
    if not getattr(trainer, "use_vllm", False) or generation is None:
        return False
    if generation.mode == "server":
        if trainer.accelerator.device.type == "cuda":
            return False
        folder = Path(trainer.args.output_dir).resolve() / "vllm_weights"
        generation.sync_weights = lambda: _file_sync(generation, folder)
        return True
    if generation.mode != "colocate" or not vllm_on_cpu():
        return False
    generation.sync_weights = lambda: _cpu_sync(generation)
    return True


@contextlib.contextmanager
def same_dtype_engine(dtype: str | None) -> Iterator[None]:
    """While TRL builds its colocated engine, give its `LLM(...)` call `dtype` (the dtype the agent is trained in;
    None or "auto": the model's own `torch_dtype`) unless it names one itself."""
    try:
        import trl.generation.vllm_generation as trl_vllm
    except ImportError:  # no vLLM: nothing to build
        yield
        return
    original = getattr(trl_vllm, "LLM", None)
    if original is None:
        yield
        return

    from prompt_r1.agents.vllm_engine import checkpoint_dtype, cpu_engine_defaults

    def build(*args: Any, **kwargs: Any) -> Any:
        if vllm_on_cpu():
            # TRL passes max_model_len=None when vllm_max_model_length is unset: None counts as unset here.
            for key, value in cpu_engine_defaults(kwargs.get("model") or args[0]).items():
                if kwargs.get(key) is None:
                    kwargs[key] = value
        if dtype and dtype != "auto":
            kwargs.setdefault("dtype", dtype)
        else:
            kwargs.setdefault("dtype", checkpoint_dtype(kwargs.get("model") or args[0]))
        return original(*args, **kwargs)

    trl_vllm.LLM = build
    try:
        yield
    finally:
        trl_vllm.LLM = original


def engine_logprobs(llm: Any, prompt_ids: list[int], continuation_ids: list[int]) -> list[float]:
    """The engine's log-probability of each token of `continuation_ids` after `prompt_ids` (prompt_logprobs)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    (output,) = llm.generate({"prompt_token_ids": prompt_ids + continuation_ids}, params, use_tqdm=False)
    steps = output.prompt_logprobs[len(prompt_ids) :]
    return [step[token].logprob for step, token in zip(steps, continuation_ids, strict=True)]


def model_logprobs(model: Any, prompt_ids: list[int], continuation_ids: list[int]) -> list[float]:
    """The trained model's log-probability of each continuation token, computed as the engine computes it."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + continuation_ids], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    picked = logits.log_softmax(-1).gather(-1, torch.tensor(continuation_ids, device=device)[:, None])
    return picked[:, 0].tolist()


def server_logprobs(base_url: str, prompt_ids: list[int], continuation_ids: list[int]) -> list[float]:
    """`engine_logprobs` for a vLLM server at `base_url` (its root), through its completions API."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=30) as response:
        model = json.loads(response.read())["data"][0]["id"]
    body = {
        "model": model,
        "prompt": prompt_ids + continuation_ids,
        "max_tokens": 1,
        "temperature": 1.0,
        "prompt_logprobs": 0,
    }
    steps = post_json(f"{base_url}/v1/completions", body, timeout=120)["choices"][0]["prompt_logprobs"]
    steps = steps[len(prompt_ids) :]
    return [step[str(token)]["logprob"] for step, token in zip(steps, continuation_ids, strict=True)]


def install_sync_check(trainer: Any, prompt_ids: list[int], continuation_ids: list[int]) -> bool:
    """After every sync of a vLLM engine (colocated or a server; CPU or GPU), measure the largest gap between the
    engine's and the trained model's log-probabilities of `continuation_ids` after `prompt_ids`: logged as
    vllm/sync_logprob_gap and appended to OUTPUT_DIR/vllm_sync.jsonl with the step, the rank and both sums (a
    server is checked by the main process only). Returns whether installed."""
    import json
    from pathlib import Path

    generation = getattr(trainer, "vllm_generation", None)
    if not getattr(trainer, "use_vllm", False) or generation is None:
        return False
    server = generation.mode == "server"
    sync = generation.sync_weights
    record = Path(trainer.args.output_dir) / "vllm_sync.jsonl"

    def checked_sync() -> None:
        sync()
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            mine = model_logprobs(
                model, prompt_ids, continuation_ids
            )  # every rank: a ZeRO-3 forward is collective
        finally:
            model.train(was_training)
        if server and not trainer.accelerator.is_main_process:
            return
        if server:
            theirs = server_logprobs(generation.vllm_client.base_url, prompt_ids, continuation_ids)
        else:
            theirs = engine_logprobs(generation.llm, prompt_ids, continuation_ids)
        gap = max(abs(a - b) for a, b in zip(mine, theirs, strict=True))
        trainer._metrics["train"]["vllm/sync_logprob_gap"].append(gap)
        row = {
            "step": trainer.state.global_step,
            "rank": trainer.accelerator.process_index,
            "gap": gap,
            "model_logprob_sum": sum(mine),
            "engine_logprob_sum": sum(theirs),
        }
        record.parent.mkdir(parents=True, exist_ok=True)
        with record.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")

    generation.sync_weights = checked_sync
    return True
