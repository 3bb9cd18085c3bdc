"""An in-process vLLM engine as the agent (the `vllm` extra; GPU machines only). vLLM is imported lazily.

vLLM's async engine batches concurrent requests itself (continuous batching), so each episode simply awaits its
own request. Generation starts from token ids, so trajectories are token-exact as with the local backend.
"""

from __future__ import annotations

import uuid
from typing import Any

from prompt_r1.agents.base import AgentOutput, AgentRequest
from prompt_r1.config import AgentConfig
from prompt_r1.errors import BackendUnavailable
from prompt_r1.tokens import initial_prompt_ids

__all__ = ["VLLMAgent"]


def _import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise BackendUnavailable(
            "the vllm agent backend needs the vllm extra (GPU machines only): pip install 'prompt-r1[vllm]'; "
            "or serve the agent with `vllm serve MODEL` and pass --agent-base-url"
        ) from exc
    return vllm


class VLLMAgent:
    def __init__(
        self, config: AgentConfig, *, engine: Any = None, tokenizer: Any = None, **engine_kwargs: Any
    ) -> None:
        vllm = _import_vllm()
        self.config = config
        if engine is None:
            args = vllm.AsyncEngineArgs(model=config.model, seed=config.seed or 0, **engine_kwargs)
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
