"""Compiled decoding of the local agent (prompt_r1.agents.compiled_decoding): a static cache and a compiled step
give the eager tokens, pad rows to a power of two and drop the pads, compile once for the calls of a shape, keep
their caches within a budget, and fall back to eager decoding when the compiler fails. On CPU the compiler's
backend here is dynamo's `eager` (the graph is traced and guarded as on a GPU, then run without code generation);
the GPU benchmark (evals/bench/grpo_gpu.py) runs inductor with CUDA graphs."""

from __future__ import annotations

import asyncio
import types
import warnings

import pytest
import torch
from conftest import TINY_QUESTION, TINY_TURN_1
from torch._dynamo.utils import counters

from prompt_r1.agents import AgentRequest
from prompt_r1.agents import compiled_decoding as decoding
from prompt_r1.agents.local import StopRecorder, TransformersAgent
from prompt_r1.core.config import AgentConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.prompts import question_message
from prompt_r1.core.tokens import initial_prompt_ids

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
    graphs = [_graphs()]
    # Three rows (padded to four), then four rows of other prompt lengths and caps: the same shapes once padded.
    first = _requests(QUESTIONS[:3])
    second = _requests(QUESTIONS[:1], max_new_tokens=8) + _requests(QUESTIONS[:0:-1])
    for requests in (first, second):
        want, got = await _generate(eager, requests), await _generate(compiled, requests)
        for a, b in zip(want, got, strict=True):
            assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason and b.text == a.text
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        graphs.append(_graphs())
    # A row cut at its own cap beside rows that ran to their stop string.
    assert [o.finish_reason for o in got] == ["length", "stop", "stop", "stop"] and len(got[0].token_ids) == 8
    assert got[-1].text == TINY_TURN_1
    # The step was compiled for the first batch and replayed for the second, on the model's one kept cache.
    assert graphs[1] > graphs[0] and graphs[2] == graphs[1]
    kept = decoding.kept_caches(compiled.model)
    assert list(kept) == [4] and kept[4] % decoding.CACHE_STEP == 0


async def test_a_first_cache_made_for_the_trajectory_serves_its_longer_turns(trained_tiny_model_path):
    """With a trajectory's budget as headroom (the trainer's max_total_tokens), the first cache is made that long:
    a later turn, its prompt a few hundred tokens longer, replays the same compiled step on it. Without, it needs a longer
    cache (a new shape: a recompile on a GPU)."""
    torch._dynamo.reset()
    short = _requests(QUESTIONS[:2], turn=0)  # an episode's first turn: its cache is made with the headroom
    longer = _requests([TINY_QUESTION + " word" * 60] * 2, turn=1)
    plain, ahead = _agent(trained_tiny_model_path, "on"), _agent(trained_tiny_model_path, "on")
    plain.cache_budget = ahead.cache_budget = 1 << 30  # as under auto (under `on`, never longer than needed)
    grown = len(initial_prompt_ids(plain.tokenizer, longer[0].messages)) - max(
        len(initial_prompt_ids(plain.tokenizer, r.messages)) for r in short
    )
    assert grown > decoding.CACHE_STEP  # past any cache the short turn alone would need
    ahead.cache_headroom = grown + 24  # the turn's 24 new tokens on top
    for agent in (plain, ahead):
        await _generate(agent, short)
    first = [decoding.kept_caches(agent.model)[2] for agent in (plain, ahead)]
    graphs = _graphs()
    await _generate(ahead, longer)
    assert (
        decoding.kept_caches(ahead.model) == {2: first[1]} and _graphs() == graphs
    )  # the same cache, replayed
    await _generate(plain, longer)
    assert decoding.kept_caches(plain.model)[2] > first[0]  # a longer cache had to be made
    assert first[1] > first[0]


def test_padding_rows_stop_at_once_and_each_row_keeps_its_first_stop():
    recorder = StopRecorder(None, (), {0}, prompt_len=2, rows=4, real=2)
    ids = torch.tensor([[5, 5, 7], [5, 5, 0], [5, 5, 7], [5, 5, 7]])  # row 1 wrote EOS (0); rows 2-3 are pads
    assert recorder(ids, None).tolist() == [False, True, True, True]
    ids = torch.cat([ids, torch.tensor([[0], [0], [0], [0]])], dim=1)
    assert recorder(ids, None).tolist() == [True, True, True, True]
    assert recorder.lengths() == [2, 1, 1, 1]  # each row's first stop; the pads' at their first token
    assert StopRecorder(None, (), set(), 2, rows=2).lengths() == [None, None]  # no pads, none stopped


def test_rows_pad_to_a_power_of_two_within_the_limit_and_caches_keep_within_the_budget(tiny_model_path):
    assert [decoding.padded_rows(n, 64) for n in (1, 3, 4, 33, 64)] == [1, 4, 4, 64, 64]
    assert decoding.padded_rows(40, 48) == 48 and decoding.padded_rows(50, 48) == 50  # never below the batch
    assert [decoding.cache_length(n) for n in (1, 256, 257)] == [256, 256, 512]
    model = TransformersAgent(AgentConfig(model=str(tiny_model_path))).model
    token, budget = 10, 27_000  # bytes of a token of a row, and the kept caches' budget

    def cache(rows, length, budget=budget):
        return decoding.static_cache(model, rows, length, row_token_bytes=token, budget=budget)

    def kept():
        return decoding.kept_caches(model)

    with decoding.model_lock(model):
        small = cache(4, 256)
        assert cache(4, 256) is small  # reused
        longer = cache(4, 512)  # a longer call replaces it; a shorter one then reuses the longer
        assert longer is not small and cache(4, 256, budget=None) is longer and kept() == {4: 512}
        cache(1, 256), cache(4, 256)  # 4 x 512 and 1 x 256 kept (23,040 bytes); rows 4 used last
        assert kept() == {1: 256, 4: 512}
        # 2 x 256 more (5,120) passes 27,000: the least recently used (rows 1) goes, not the one used last.
        cache(2, 256)
        assert kept() == {4: 512, 2: 256}
        # A cache over the budget by itself: none (that call decodes eagerly), and the kept ones all stay, the
        # shorter one of its own row count too.
        assert cache(64, 512) is None and cache(2, 4096) is None and kept() == {4: 512, 2: 256}
        # A first cache made longer than its call needs (`make`) where the budget has room beside the others
        # (4 x 512 + 2 x 256 = 25,600 kept): under 30,000, 1 x 768 would not fit beside them, so 1 x 256 is made
        # (and nothing dropped); alone it fits.
        decoding.static_cache(model, 1, 256, make=768, row_token_bytes=token, budget=30_000)
        assert kept() == {4: 512, 2: 256, 1: 256}
    alone = TransformersAgent(AgentConfig(model=str(tiny_model_path))).model
    with decoding.model_lock(alone):
        decoding.static_cache(alone, 1, 256, make=768, row_token_bytes=token, budget=budget)
        # Without a budget (`on`), never longer than the call needs.
        decoding.static_cache(alone, 2, 256, make=768, row_token_bytes=token, budget=None)
    assert decoding.kept_caches(alone) == {1: 768, 2: 256}
    lock = decoding.model_lock(model)
    with lock:
        decoding.record_failure(model)
    assert decoding.model_lock(model) is lock and kept() == {}  # the lock stays for a call waiting on it
    assert decoding.static_cache(model, 1, 256, row_token_bytes=token, budget=None) is None


def test_the_budget_is_an_eighth_of_a_cuda_devices_memory_under_auto_only(monkeypatch, tiny_model_path):
    model = TransformersAgent(AgentConfig(model=str(tiny_model_path))).model
    assert decoding.cache_budget(model, "auto") is None and decoding.cache_budget(model, "on") is None  # CPU
    on_cuda = types.SimpleNamespace(device=torch.device("cuda", 0))
    memory = types.SimpleNamespace(total_memory=80 << 30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: memory)
    assert decoding.cache_budget(on_cuda, "auto") == 10 << 30 and decoding.cache_budget(on_cuda, "on") is None


async def test_a_call_over_the_budget_decodes_eagerly_and_keeps_compiling_later(trained_tiny_model_path):
    torch._dynamo.reset()
    compiled, eager = _agent(trained_tiny_model_path, "on"), _agent(trained_tiny_model_path, "off")
    compiled.cache_budget = 1  # no cache fits
    requests = _requests(QUESTIONS[:3])
    graphs = _graphs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a failure: no warning
        got = await _generate(compiled, requests)
    assert [o.token_ids for o in got] == [o.token_ids for o in await _generate(eager, requests)]
    assert _graphs() == graphs and compiled.compile_config is not None  # eager this call, still compiling
    assert not decoding.compile_failed(compiled.model)
    # An eager call does not hold the model's lock (other threads' compiled calls need not wait for it).
    held = []
    decode = compiled._decode
    compiled._decode = lambda batch, *a: (
        held.append(decoding.model_lock(compiled.model).locked()) or decode(batch, *a)
    )
    await _generate(compiled, requests)
    assert held == [False]


def test_compiled_decoding_is_off_for_inference_and_auto_only_on_cuda_with_whole_weights(tiny_model_path):
    agent = TransformersAgent(AgentConfig(model=str(tiny_model_path)))
    assert AgentConfig().compile_decode == "off" and agent.compile_config is None
    assert not decoding.compiles_decoding(agent.model, "auto")  # on CPU
    assert decoding.compiles_decoding(agent.model, "on") and not decoding.compiles_decoding(
        agent.model, "off"
    )
    whole = torch.nn.Parameter(torch.zeros(1))
    partitioned = torch.nn.Parameter(torch.zeros(1))
    partitioned.ds_id = 0  # as DeepSpeed ZeRO-3 marks the parameters it partitions
    on_cuda = types.SimpleNamespace(device=torch.device("cuda"), parameters=lambda: [whole])
    assert decoding.compiles_decoding(on_cuda, "auto")
    on_cuda.parameters = lambda: [whole, partitioned]
    assert not decoding.compiles_decoding(on_cuda, "auto") and decoding.compiles_decoding(on_cuda, "on")
    with pytest.raises(ConfigError, match="compile_decode must be auto, on or off, got 'yes'"):
        AgentConfig(compile_decode="yes")
    from prompt_r1.training.asynchronous.config import PromptR1AsyncGRPOConfig
    from prompt_r1.training.sync.config import PromptR1GRPOConfig

    assert PromptR1GRPOConfig(output_dir="unused", use_cpu=True, report_to=[]).agent_compile_decode == "auto"
    with pytest.raises(ConfigError, match="agent_compile_decode must be auto, on or off, got 'always'"):
        PromptR1GRPOConfig(output_dir="unused", use_cpu=True, report_to=[], agent_compile_decode="always")
    assert "agent_compile_decode" not in PromptR1AsyncGRPOConfig.__dataclass_fields__  # it decodes on vLLM


async def test_a_compiler_failure_falls_back_to_eager_decoding(trained_tiny_model_path):
    torch._dynamo.reset()
    broken = _agent(trained_tiny_model_path, "on", backend="no-such-backend")
    before = TransformersAgent(broken.config, model=broken.model, tokenizer=broken.tokenizer)
    eager = _agent(trained_tiny_model_path, "off")
    requests = _requests(QUESTIONS[:2])
    with pytest.warns(UserWarning, match="compiled decoding failed, decoding eagerly from now on"):
        got = await _generate(broken, requests)
    assert broken.compile_config is None and not decoding.kept_caches(broken.model)  # its caches let go
    assert [o.token_ids for o in got] == [o.token_ids for o in await _generate(eager, requests)]
    # The model stays eager: an agent made on it after the failure, or before it, does not try again (a second
    # try would fail and warn again).
    after = TransformersAgent(broken.config, model=broken.model, tokenizer=broken.tokenizer)
    assert after.compile_config is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [o.token_ids for o in await _generate(before, requests)] == [o.token_ids for o in got]
    assert not decoding.kept_caches(broken.model)


def test_the_rollouts_unwrapping_leaves_one_input_grad_hook(tiny_model_path):
    """Unwrapping for generation turns gradient checkpointing off and on around every rollout; transformers adds an
    input-embedding hook at each `enable` that `disable` keeps. Without the sweep the hooks pile up (and a compiled
    decoding step, whose guards count them, recompiles every step). The trainer's run is checked in
    tests/test_training_runs.py."""
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
