"""Agent backends: one async protocol, three implementations.

- `ServedAgent`: an OpenAI-compatible endpoint (what `vllm serve` of a trained checkpoint provides); token ids on a
  vLLM server with a tokenizer at hand, chat messages elsewhere.
- `TransformersAgent`: a local `transformers` model; batches concurrent episodes; token ids and logprobs.
- `VLLMAgent`: an in-process vLLM engine (the `vllm` extra); token ids and logprobs.

`load_agent(config)` picks one from an `AgentConfig`; `model_source` checks, in seconds, that a local agent's model
folder or hub id can be loaded here.

May import: clients, data, scoring, core.
"""

from __future__ import annotations

from prompt_r1.agents.base import AgentBackend, AgentOutput, AgentRequest
from prompt_r1.core.config import AgentConfig

__all__ = ["AgentBackend", "AgentOutput", "AgentRequest", "load_agent"]


def load_agent(config: AgentConfig) -> AgentBackend:
    """Build the backend the config asks for. Heavy imports happen only for the chosen backend."""
    backend = config.resolved_backend
    if backend == "served":
        from prompt_r1.agents.served import ServedAgent

        return ServedAgent(config)
    if backend == "vllm":
        from prompt_r1.agents.vllm_engine import VLLMAgent

        return VLLMAgent(config)
    from prompt_r1.agents.local import TransformersAgent

    return TransformersAgent(config)
