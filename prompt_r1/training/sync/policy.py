"""The trainer's own policy as the agent backend of GRPO rollouts.

Three ways to generate, chosen from the trainer's settings:

- `generate` on the trainer's model (no vLLM): the model is unwrapped for generation once per rollout call
  (under ZeRO-3 its parameters are gathered once, so generation itself makes no collective call and ranks whose
  episodes take different numbers of turns never wait on each other).
- TRL's colocated vLLM engine (`vllm_mode="colocate"`, tensor parallel size 1): each rank's own engine.
- TRL's vLLM server (`vllm_mode="server"`): TRL's own `VLLMClient.generate` gathers prompts from every rank and
  broadcasts the results, a collective that deadlocks when ranks call it a different number of times. Here every
  rank posts its own requests to the server's `/generate/` endpoint through a client of its own, so no rank waits
  on another; the server batches what arrives. Weights are still synced by TRL (main process) before each rollout.

In each case concurrent episodes' requests are batched into one call per step of the event loop
(`BatchingBackend`), and the sampled ids and their logprobs are returned as sampled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prompt_r1.agents.base import AgentOutput
from prompt_r1.agents.batching import BatchingBackend, PendingRequest, derive_seed
from prompt_r1.core.config import AgentConfig
from prompt_r1.core.errors import ConfigError

__all__ = [
    "VLLMColocatePolicy",
    "VLLMServerPolicy",
    "drop_orphan_input_grad_hooks",
    "on_trainer_thread",
    "trainer_policy",
]


def _sampling(args: Any) -> dict[str, Any]:
    """The trainer's sampling settings as vLLM SamplingParams fields."""
    return {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k if args.top_k is not None else 0,
        "min_p": 0.0 if args.min_p is None else args.min_p,
        "repetition_penalty": args.repetition_penalty,
    }


def _generate_sampling(args: Any) -> dict[str, Any]:
    """The trainer's sampling settings as `generate` arguments, as TRL's own generation uses them (top_k 0 turns
    off the model's default top-k instead of silently truncating the distribution the logprobs describe)."""
    # synced_gpus off: under ZeRO-3 `generate` would otherwise all-reduce a "finished" flag at every decoding step,
    # a collective that ranks generating different numbers of turns never match. The parameters are gathered for
    # the whole rollout, so each rank's generation is its own.
    if args.temperature <= 0:
        return {"do_sample": False, "synced_gpus": False}
    sampling = {
        "synced_gpus": False,
        "do_sample": True,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": getattr(args, "top_k", 0) or 0,
        "min_p": getattr(args, "min_p", None),
        "repetition_penalty": getattr(args, "repetition_penalty", 1.0),
    }
    sampling.update(getattr(args, "generation_kwargs", None) or {})
    return sampling


def _finish(ids: list[int], max_new: int, stopped: bool) -> str:
    return "length" if not stopped and len(ids) >= max_new else "stop"


def _outputs_from_vllm(batch, completions, logprobs, tokenizer) -> list[AgentOutput]:
    results = []
    for item, ids, lps in zip(batch, completions, logprobs, strict=True):
        ids = list(ids)
        flat = [
            float("nan") if lp is None else float(lp[0] if isinstance(lp, list | tuple) else lp) for lp in lps
        ]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        stopped = any(text.endswith(s) for s in item.stop) or (ids and ids[-1] == tokenizer.eos_token_id)
        results.append(
            AgentOutput(
                text=text,
                token_ids=ids,
                logprobs=flat,
                finish_reason=_finish(ids, item.max_new_tokens, stopped),
                prompt_tokens=len(item.prompt_ids),
                completion_tokens=len(ids),
            )
        )
    return results


class VLLMColocatePolicy(BatchingBackend):
    """Generation on the rank's own colocated vLLM engine (TRL's `vllm_generation.llm`)."""

    def __init__(self, llm: Any, tokenizer: Any, sampling: dict[str, Any], *, max_new_tokens: int) -> None:
        super().__init__()
        self.llm, self.tokenizer, self.sampling = llm, tokenizer, sampling
        self.default_max_new_tokens = max_new_tokens
        self.max_batch_size = 1 << 16  # the engine schedules by itself

    def _generate_locked(self, batch: list[PendingRequest]) -> list[AgentOutput]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=1,
                max_tokens=item.max_new_tokens,
                stop=list(item.stop),
                include_stop_str_in_output=True,
                logprobs=0,
                seed=self._request_seed(item),
                **self.sampling,
            )
            for item in batch
        ]
        outputs = self.llm.generate(
            [{"prompt_token_ids": item.prompt_ids} for item in batch], sampling_params=params, use_tqdm=False
        )
        completions = [out.outputs[0].token_ids for out in outputs]
        logprobs = [
            [
                step[token].logprob
                for step, token in zip(out.outputs[0].logprobs or [], out.outputs[0].token_ids, strict=False)
            ]
            for out in outputs
        ]
        return _outputs_from_vllm(batch, completions, logprobs, self.tokenizer)

    def _request_seed(self, item: PendingRequest) -> int | None:
        """A seed of the request's own (the step's seed, its episode and turn): vLLM then samples it alike in any
        batch. None (the engine's own generator) when the rollout is not reproducible or the request has no key."""
        if self.sampling_seed is None or item.key is None:
            return None
        return derive_seed(self.sampling_seed, *item.key)


class VLLMServerPolicy(BatchingBackend):
    """Generation on TRL's vLLM server (`trl vllm-serve`), each rank posting its own requests."""

    def __init__(self, client: Any, tokenizer: Any, sampling: dict[str, Any], *, max_new_tokens: int) -> None:
        super().__init__()
        self.client, self.tokenizer, self.sampling = client, tokenizer, sampling
        self.default_max_new_tokens = max_new_tokens
        self.max_batch_size = 1 << 16

    def _generate_locked(self, batch: list[PendingRequest]) -> list[AgentOutput]:
        # One request per budget: the server applies one max_tokens to all prompts of a call.
        by_budget: dict[int, list[int]] = {}
        for row, item in enumerate(batch):
            by_budget.setdefault(item.max_new_tokens, []).append(row)
        completions: list[Any] = [None] * len(batch)
        logprobs: list[Any] = [None] * len(batch)
        for budget, rows in by_budget.items():
            out = self.client.generate(
                prompts=[batch[r].prompt_ids for r in rows],
                n=1,
                max_tokens=budget,
                logprobs=0,
                generation_kwargs={"stop": list(batch[rows[0]].stop), "include_stop_str_in_output": True},
                **self.sampling,
            )
            for r, ids, lps in zip(rows, out["completion_ids"], out["logprobs"], strict=True):
                completions[r], logprobs[r] = ids, lps
        return _outputs_from_vllm(batch, completions, logprobs, self.tokenizer)


_server_clients: dict[str, Any] = {}


def _rank_client(trainer: Any) -> Any:
    """This rank's client of the vLLM server: the trainer's own on the main process, a generate-only one elsewhere."""
    generation = trainer.vllm_generation
    client = getattr(generation, "vllm_client", None)
    if client is not None:
        return client
    base_url = generation.server_base_url or f"http://{generation.server_host}:{generation.server_port}"
    if base_url not in _server_clients:
        from trl.generation.vllm_client import VLLMClient

        _server_clients[base_url] = VLLMClient(
            base_url=base_url, connection_timeout=generation.server_timeout
        )
    return _server_clients[base_url]


def on_trainer_thread(trainer: Any, agent: BatchingBackend) -> BatchingBackend:
    """`agent`, generating on the trainer's one generate thread. A rollout makes a backend per step, and a thread
    of its own per step would hand each step's tensors a fresh allocator arena (`prompt_r1.agents.batching`)."""
    thread = getattr(trainer, "_prompt_r1_generate_thread", None)
    if thread is None:
        trainer._prompt_r1_generate_thread = agent._generate_thread
    else:
        agent._generate_thread = thread
    return agent


def drop_orphan_input_grad_hooks(model: Any) -> int:
    """Remove the input-embedding hooks that transformers' `gradient_checkpointing_enable` left behind; returns how
    many. Unwrapping for generation turns gradient checkpointing off and on again around every rollout, and each
    `enable` adds a forward hook on the input embeddings (`enable_input_require_grads`) that `disable` removes only
    for an adapter loaded through transformers: without this an embedding carries one more hook per unwrapping
    (a Python call each per forward, and a new shape for a compiled decoding step's guards, so a recompile per
    step). The hooks the model still names (`_require_grads_hooks`) are kept."""
    kept = set()
    for m in model.modules():  # the list (transformers 5), or the one hook (transformers 4)
        handles = getattr(m, "_require_grads_hooks", None) or [getattr(m, "_require_grads_hook", None)]
        kept.update(handle.id for handle in handles if handle is not None)
    dropped = 0
    for module in model.modules():
        for key, hook in list(module._forward_hooks.items()):
            if getattr(hook, "__name__", "") == "make_inputs_require_grads" and key not in kept:
                del module._forward_hooks[key]
                dropped += 1
    return dropped


@contextlib.contextmanager
def trainer_policy(trainer: Any, *, max_new_tokens: int) -> Iterator[BatchingBackend]:
    """The agent backend for one rollout call, generating with the trainer's current policy."""
    tokenizer = trainer.processing_class
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
    args = trainer.args
    if getattr(trainer, "use_vllm", False):
        generation = trainer.vllm_generation
        if generation.mode == "server":
            yield on_trainer_thread(
                trainer,
                VLLMServerPolicy(
                    _rank_client(trainer), tokenizer, _sampling(args), max_new_tokens=max_new_tokens
                ),
            )
            return
        if generation.tensor_parallel_size > 1:
            raise ConfigError(
                "multi-turn rollouts with colocated vLLM need vllm_tensor_parallel_size 1: a tensor-parallel group "
                "generates collectively, and its ranks' episodes take different numbers of turns; use server mode"
            )
        if generation.enable_sleep_mode:
            if generation._llm_weights_sleeping:
                generation.sync_weights()
            generation.llm.wake_up(tags=["kv_cache"])
        try:
            yield on_trainer_thread(
                trainer,
                VLLMColocatePolicy(generation.llm, tokenizer, _sampling(args), max_new_tokens=max_new_tokens),
            )
        finally:
            if generation.enable_sleep_mode:
                generation.llm.sleep(level=2)
                generation._llm_weights_sleeping = True
        return

    from trl.models import unwrap_model_for_generation

    from prompt_r1.agents.attention import grouped_attention_while
    from prompt_r1.agents.local import TransformersAgent

    summon = getattr(getattr(trainer, "_dist", None), "summon_full_params", None)
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        ) as model,
        summon(trainer.model_wrapped, recurse=False) if summon else contextlib.nullcontext(),
        grouped_attention_while(
            model
        ),  # on CPU, the rollout's padded batches without copied key/value groups
    ):
        drop_orphan_input_grad_hooks(model)
        config = AgentConfig(
            model=str(getattr(model.config, "_name_or_path", "policy")),
            temperature=args.temperature,
            top_p=args.top_p,
            max_new_tokens=max_new_tokens,
            compile_decode=args.agent_compile_decode,
        )
        agent = TransformersAgent(
            config, model=model, tokenizer=tokenizer, sampling=_generate_sampling(args),
            cache_headroom=args.max_total_tokens,
        )  # fmt: skip
        yield on_trainer_thread(trainer, agent)
