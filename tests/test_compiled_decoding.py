"""Compiled decoding of the local agent (AgentConfig.compile_decode): a static cache and a compiled step give the
eager tokens, pad rows to a power of two and drop the pads, compile once for the calls of a shape, and fall back to
eager decoding when the compiler fails. On CPU the compiler's backend here is dynamo's `eager` (the graph is traced
and guarded as on a GPU, then run without code generation); the GPU benchmark (evals/bench/grpo_gpu.py) runs
inductor with CUDA graphs."""

from __future__ import annotations

import asyncio

import pytest
import torch
from conftest import TINY_QUESTION, TINY_TURN_1
from torch._dynamo.utils import counters

from prompt_r1.agents import AgentRequest
from prompt_r1.agents.local import TransformersAgent, compiles_decoding
from prompt_r1.core.config import AgentConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.prompts import question_message

QUESTIONS = (
    TINY_QUESTION,
    "Who was Grace Hopper?",
    "Name the item.",
    "Which city holds the bridge, and why?",
)


def _agent(path, setting: str, backend: str = "eager") -> TransformersAgent:
    agent = TransformersAgent(
        AgentConfig(model=str(path), temperature=0.0, max_new_tokens=24, compile_decode=setting)
    )
    if agent.compile_config is not None:
        agent.compile_config.backend = backend
    return agent


def _requests(questions, **kw) -> list[AgentRequest]:
    return [
        AgentRequest(messages=[{"role": "user", "content": question_message(q)}], **kw) for q in questions
    ]


async def _generate(agent, requests):
    return await asyncio.gather(*(agent.generate(r) for r in requests))


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


async def test_compiled_decoding_gives_the_eager_tokens_and_compiles_once_per_shape(trained_tiny_model_path):
    torch._dynamo.reset()
    eager, compiled = _agent(trained_tiny_model_path, "off"), _agent(trained_tiny_model_path, "on")
    assert eager.compile_config is None and compiled.compile_config is not None
    # Three rows (padded to four) of different prompt lengths, and rows that stop at once beside rows that run on.
    graphs = []
    # Three rows (padded to four), then four rows of other prompt lengths and caps: the same shapes once padded.
    for requests in (
        _requests(QUESTIONS[:3]),
        _requests(QUESTIONS[:1], max_new_tokens=8) + _requests(QUESTIONS[:0:-1]),
    ):
        want, got = await _generate(eager, requests), await _generate(compiled, requests)
        for a, b in zip(want, got, strict=True):
            assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason and b.text == a.text
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        graphs.append(_graphs())
    # A row cut at its own cap beside rows that ran to their stop string.
    assert [o.finish_reason for o in got] == ["length", "stop", "stop", "stop"] and len(got[0].token_ids) == 8
    assert got[-1].text == TINY_TURN_1
    # The step was compiled for the first batch and replayed for the second.
    assert graphs[0] >= 1 and graphs[1] == graphs[0]


def test_compiled_decoding_is_off_for_inference_and_auto_only_on_cuda(tiny_model_path):
    agent = TransformersAgent(AgentConfig(model=str(tiny_model_path)))
    assert AgentConfig().compile_decode == "off" and agent.compile_config is None
    assert compiles_decoding(agent.model, "auto") is False  # the trainer's default: on CUDA only
    assert compiles_decoding(agent.model, "on") and not compiles_decoding(agent.model, "off")
    with pytest.raises(ConfigError, match="compile_decode must be auto, on or off, got 'yes'"):
        AgentConfig(compile_decode="yes")
    from prompt_r1.training.sync.config import PromptR1GRPOConfig

    assert PromptR1GRPOConfig(output_dir="unused", use_cpu=True, report_to=[]).agent_compile_decode == "auto"
    with pytest.raises(ConfigError, match="agent_compile_decode must be auto, on or off, got 'always'"):
        PromptR1GRPOConfig(output_dir="unused", use_cpu=True, report_to=[], agent_compile_decode="always")


async def test_a_compiler_failure_falls_back_to_eager_decoding(trained_tiny_model_path):
    torch._dynamo.reset()
    broken = _agent(trained_tiny_model_path, "on", backend="no-such-backend")
    eager = _agent(trained_tiny_model_path, "off")
    requests = _requests(QUESTIONS[:2])
    with pytest.warns(UserWarning, match="compiled decoding failed, decoding eagerly from now on"):
        got = await _generate(broken, requests)
    assert broken.compile_config is None
    # The model stays eager: the next agent made on it (a trainer makes one every step) does not try again.
    assert (
        TransformersAgent(broken.config, model=broken.model, tokenizer=broken.tokenizer).compile_config
        is None
    )
    assert [o.token_ids for o in got] == [o.token_ids for o in await _generate(eager, requests)]


def test_the_rollouts_unwrapping_leaves_one_input_grad_hook(tiny_model_path):
    """Unwrapping for generation turns gradient checkpointing off and on around every rollout; transformers adds an
    input-embedding hook at each `enable` that `disable` keeps. Without the sweep the hooks pile up (and a compiled
    decoding step, whose guards count them, recompiles every step)."""
    from transformers import AutoModelForCausalLM

    from prompt_r1.training.sync.policy import drop_orphan_input_grad_hooks

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    model.gradient_checkpointing_enable()
    embeddings = model.get_input_embeddings()
    for _ in range(3):  # three rollouts, as TRL's unwrap_model_for_generation does them
        model.gradient_checkpointing_disable()
        model.gradient_checkpointing_enable()
    assert len(embeddings._forward_hooks) == 4
    assert drop_orphan_input_grad_hooks(model) == 3
    assert list(embeddings._forward_hooks) == [model._require_grads_hooks[0].id]
    assert drop_orphan_input_grad_hooks(model) == 0
