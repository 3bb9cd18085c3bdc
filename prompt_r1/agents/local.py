"""A local agent: a `transformers` causal LM loaded by path or hub id, generating from token ids.

Concurrent episodes each await `generate`; their requests are collected while the event loop runs the other
episodes' environment calls and are answered by one batched `model.generate` in a worker thread, so the loop
never blocks on the GPU/CPU and the model sees full batches. Each row stops on its own at a stop string or EOS;
its sampled ids and their log-probabilities under the sampling distribution are returned as they were sampled.

Memory: a generate call holds, for every row, the key/value cache of the padded prompt and the new tokens, and one
float32 vocabulary-wide score row per generated token (the log-probabilities are read from them). On CPU, where
that is the machine's RAM, a batch whose estimate of both exceeds `max_batch_bytes` runs as consecutive calls of
rows that fit. On an accelerator the default is no bound: a split costs a whole decoding pass, and the batches a
rollout makes fit its memory. `--agent-generate-memory-mb` (`AgentConfig.generate_memory_mb`) sets the bound.

Compiled decoding (`AgentConfig.compile_decode`: a static cache and a step replayed as CUDA graphs) is
`prompt_r1.agents.compiled_decoding`'s; this module pads the rows and falls back to eager decoding.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from transformers import LogitsProcessorList, StoppingCriteria, StopStringCriteria

from prompt_r1.agents import compiled_decoding
from prompt_r1.agents.attention import use_grouped_attention
from prompt_r1.agents.base import AgentOutput
from prompt_r1.agents.batching import BatchingBackend, PendingRequest
from prompt_r1.agents.model_source import check_model_source
from prompt_r1.core.config import AgentConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.protocol import STOP_SEQUENCES

__all__ = [
    "CPU_BATCH_BYTES",
    "StopRecorder",
    "TransformersAgent",
    "generate_bytes_per_token",
    "load_transformers_model",
]

# The CPU default of `max_batch_bytes`. The estimate leaves out the forward pass's passing activations, which
# roughly double it: the built-in model, 400-token prompts and 64 new tokens (34 MB a row), ran 64 rows at once
# (2.2 GB estimated) at 3.5 GB above the model's memory.
CPU_BATCH_BYTES = 1 << 30


def generate_bytes_per_token(model: Any) -> tuple[int, int]:
    """(bytes of key/value cache per token of a row, bytes of the score row kept per generated token) for
    `model`, from its config; for a config that does not say, the cache of full attention at its hidden size."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = getattr(config, "num_hidden_layers", 0) or 0
    heads = getattr(config, "num_attention_heads", 0) or 0
    hidden = getattr(config, "hidden_size", 0) or 0
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if heads else 0)
    element = torch.finfo(model.dtype).bits // 8 if model.dtype.is_floating_point else 4
    vocab = getattr(config, "vocab_size", 0) or 0
    return 2 * layers * kv_heads * head_dim * element, 4 * vocab


def load_transformers_model(name_or_path: str, *, device: str | None = None, dtype: str = "auto"):
    """(model, tokenizer) through the real `from_pretrained` path; a clear ConfigError when it cannot load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prompt_r1.agents.builtin import resolve_model

    check_model_source(
        name_or_path, "agent model (--agent-model)"
    )  # one line from any caller, not only the CLI
    name_or_path = resolve_model(name_or_path)  # a built-in model: its folder, made on first use
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype, None)
    if torch_dtype is None:
        raise ConfigError(f"agent dtype must be auto, bfloat16, float16 or float32, got {dtype!r}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot load agent model {name_or_path!r} (not a local model folder, and not downloadable from the "
            "hub here); pass --agent-model /path/to/model, or --agent-base-url URL for a served agent"
        ) from exc
    if tokenizer.chat_template is None:
        raise ConfigError(
            f"agent tokenizer of {name_or_path!r} has no chat template; use a chat/instruct model"
        )
    try:
        model.to(device).eval()
    except (AssertionError, RuntimeError) as exc:  # e.g. "Torch not compiled with CUDA enabled"
        raise ConfigError(
            f"cannot place the agent model on device {device!r}: {exc}; try --agent-device cpu"
        ) from exc
    use_grouped_attention(model)  # on CPU, a padded batch's grouped heads uncopied (agents/attention.py)
    return model, tokenizer


class StopRecorder(StoppingCriteria):
    """Stops each row at a stop string or EOS and records how many tokens that row generated. Rows from `real` on
    are padding: stopped from the first token. The lengths stay on the device until the end (`lengths`): reading
    them every step would wait for the device each time."""

    def __init__(self, tokenizer: Any, stops: tuple[str, ...], eos_ids: set[int], prompt_len: int, rows: int,
                 real: int | None = None):  # fmt: skip
        self.strings = StopStringCriteria(tokenizer=tokenizer, stop_strings=list(stops)) if stops else None
        self.eos = torch.tensor(sorted(eos_ids)) if eos_ids else None
        self.prompt_len = prompt_len
        self.padding = torch.arange(rows) >= (rows if real is None else real)
        self.stopped = torch.full((rows,), -1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        if self.padding.device != input_ids.device:  # once: a copy to the device every step would block it
            self.padding, self.stopped = self.padding.to(input_ids.device), self.stopped.to(input_ids.device)
            self.eos = None if self.eos is None else self.eos.to(input_ids.device)
        done = self.padding.clone()
        if self.strings is not None:
            done |= self.strings(input_ids, scores)
        if self.eos is not None:
            done |= torch.isin(input_ids[:, -1], self.eos)
        generated = input_ids.shape[1] - self.prompt_len
        self.stopped = torch.where(done & (self.stopped < 0), generated, self.stopped)
        return done

    def lengths(self) -> list[int | None]:
        """How many tokens each row generated up to and including its stop (None: it did not stop)."""
        return [None if n < 0 else n for n in self.stopped.tolist()]


class TransformersAgent(BatchingBackend):
    """Local agent backend. `model`/`tokenizer` may be given directly (e.g. the trainer's policy)."""

    def __init__(
        self,
        config: AgentConfig | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        max_batch_size: int = 64,
        max_batch_bytes: int | None = None,
        max_context: int | None = None,
        sampling: dict[str, Any] | None = None,
        cache_headroom: int = 0,
    ) -> None:
        """sampling: `generate` keyword arguments that replace the config's temperature/top_p (the trainer passes
        its own, so that no default of the model's generation_config, such as top_k, changes the distribution).
        max_batch_bytes: the most cache and score memory one `generate` call may hold, as estimated (module doc);
        a batch over it runs as consecutive calls. None: the config's `generate_memory_mb`, else `CPU_BATCH_BYTES`
        for a model on CPU and no bound on an accelerator.
        cache_headroom: compiled, the tokens a row may grow by past a prompt (a trajectory's budget): a new static
        cache is made that long, so that the episode's later, longer turns replay the same compiled step."""
        super().__init__()
        self.sampling = sampling
        self.config = config = config or AgentConfig()
        if model is None:
            model, tokenizer = load_transformers_model(config.model, device=config.device, dtype=config.dtype)
        if tokenizer is None:
            raise ConfigError("a TransformersAgent given a model also needs its tokenizer")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_size = max_batch_size
        if max_batch_bytes is not None and max_batch_bytes < 1:
            raise ConfigError(f"max_batch_bytes must be at least 1, got {max_batch_bytes}")
        on_cpu = torch.device(model.device).type == "cpu"
        if max_batch_bytes is None and config.generate_memory_mb is not None:
            max_batch_bytes = config.generate_memory_mb << 20
        self.max_batch_bytes = max_batch_bytes or (CPU_BATCH_BYTES if on_cpu else None)
        self.cache_bytes, self.score_bytes = generate_bytes_per_token(model)
        self.default_max_new_tokens = config.max_new_tokens
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", None)
        if config.seed is not None:
            torch.manual_seed(config.seed)  # once: reseeding per batch would replay the same samples
        eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids), 0)
        )
        self.compile_config, self.cache_budget, self.cache_headroom = None, None, cache_headroom
        if compiled_decoding.compiles_decoding(model, config.compile_decode):
            self.compile_config = compiled_decoding.decoding_compile_config()
            self.cache_budget = compiled_decoding.cache_budget(model, config.compile_decode)

    def _generate_locked(self, batch: list[PendingRequest]) -> list[AgentOutput]:
        return [out for rows in self._fitting(batch) for out in self._generate_rows(rows)]

    def _fitting(self, batch: list[PendingRequest]) -> list[list[PendingRequest]]:
        """`batch` in order, as consecutive runs of rows whose call is within `max_batch_bytes`: each row pays
        the cache of the run's longest prompt plus its most new tokens, and a score row per new token (a row over
        the bound alone runs by itself)."""
        if self.max_batch_bytes is None:
            return [batch]
        runs: list[list[PendingRequest]] = []
        run: list[PendingRequest] = []
        prompt = new = 0  # the run's longest prompt and most new tokens: a call pads every row to both
        for item in batch:
            longer, more = max(prompt, len(item.prompt_ids)), max(new, item.max_new_tokens)
            row = (longer + more) * self.cache_bytes + more * self.score_bytes
            if run and (len(run) + 1) * row > self.max_batch_bytes:
                runs.append(run)
                run, longer, more = [], len(item.prompt_ids), item.max_new_tokens
            run.append(item)
            prompt, new = longer, more
        return runs + [run]

    @torch.no_grad()
    def _generate_rows(self, batch: list[PendingRequest]) -> list[AgentOutput]:
        if self.compile_config is None or compiled_decoding.compile_failed(self.model):
            return self._decode(batch)
        # Compiled: the rows padded to a power of two, the model's kept static cache (none where its budget has no
        # room: this call is eager), the model's lock held, since the cache and the recorded graphs are its own.
        rows = compiled_decoding.padded_rows(len(batch), self.max_batch_size)
        tokens = max(len(item.prompt_ids) for item in batch) + max(item.max_new_tokens for item in batch)
        # A new cache for an episode's first turn is made as long as it may grow (cache_headroom): later turns'
        # prompts already hold earlier turns, and a headroom on top of them would overshoot.
        first = [len(item.prompt_ids) for item in batch if item.turn == 0]
        make = (
            compiled_decoding.cache_length(max(first) + self.cache_headroom)
            if first and self.cache_headroom
            else 0
        )
        failure = None
        with compiled_decoding.model_lock(self.model):
            try:
                static = compiled_decoding.static_cache(
                    self.model, rows, compiled_decoding.cache_length(tokens),
                    make=make,
                    row_token_bytes=self.cache_bytes, budget=self.cache_budget,
                )  # fmt: skip
                if static is not None:
                    return self._decode(batch, static, rows)
            except Exception as exc:  # kept as text: the exception holds the failed call's frames and tensors
                failure = f"{type(exc).__name__}: {exc}"
                # A model or a torch the compiler cannot take (any error in a compiled call counts): recorded under
                # the lock, so that no other call tries again, and the model's caches let go.
                compiled_decoding.record_failure(self.model)
            static = None  # the cache a failed call left in this frame: the eager call below needs its memory
        if failure is not None:  # eager decoding gives the same tokens
            self.compile_config = None
            warnings.warn(f"compiled decoding failed, decoding eagerly from now on: {failure}", stacklevel=2)
        return self._decode(batch)

    def _decode(self, batch: list[PendingRequest], static: Any = None, rows: int = 0) -> list[AgentOutput]:
        """One generate call for `batch`; with a static cache (`static`), compiled, over `rows` rows (the batch and
        copies of its last row, stopped at once and dropped)."""
        cfg = self.config
        device = self.model.device
        width = max(len(item.prompt_ids) for item in batch)
        rows = rows if static is not None else len(batch)
        input_ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((rows, width), dtype=torch.long)
        for row in range(rows):  # left padding: every row's next token sits in the last column
            prompt = batch[min(row, len(batch) - 1)].prompt_ids
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        recorder = StopRecorder(self.tokenizer, batch[0].stop, self.eos_ids, width, rows, real=len(batch))
        guide = []
        if cfg.guide_calls is not None and self.sampling is None and batch[0].stop == STOP_SEQUENCES:
            from prompt_r1.agents.guide import ProtocolGuide, guided_plan

            plans = [guided_plan(self.tokenizer, item.prompt_ids, cfg.guide_calls) for item in batch]
            # Room for both tags' words within the turn's budget (their own tokens take about 20).
            room = max(4, (min(item.max_new_tokens for item in batch) - 24) // 2)
            guide = LogitsProcessorList([ProtocolGuide(self.tokenizer, plans, width, think_tokens=min(48, room),
                                                       body_tokens=min(64, room))])  # fmt: skip
        if self.sampling is not None:
            sampling = self.sampling
        elif cfg.temperature > 0:
            sampling = dict(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p)
        else:
            sampling = dict(do_sample=False)
        compiled = {} if static is None else dict(past_key_values=static, compile_config=self.compile_config)
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max(item.max_new_tokens for item in batch),
            stopping_criteria=[recorder],
            logits_processor=guide or None,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_scores=True,
            **compiled,
            **sampling,
        )
        # Each sampled token's log-probability under the distribution it was drawn from, one step at a time: the
        # stacked form (`compute_transition_scores`) copies every step's scores twice at once.
        logprobs = torch.stack(
            [
                torch.log_softmax(step.float(), dim=-1)
                .gather(1, out.sequences[:, width + i, None])
                .squeeze(1)
                for i, step in enumerate(out.scores)
            ],
            dim=1,
        )
        results = []
        lengths = recorder.lengths()
        for row, item in enumerate(batch):
            stopped_at = lengths[row]
            n = min(stopped_at if stopped_at is not None else logprobs.shape[1], item.max_new_tokens)
            ids = out.sequences[row, width : width + n].tolist()
            lp = logprobs[row, :n].float().tolist()
            finish = "stop" if stopped_at is not None and stopped_at <= item.max_new_tokens else "length"
            results.append(
                AgentOutput(
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    token_ids=ids,
                    logprobs=lp,
                    finish_reason=finish,
                    prompt_tokens=len(item.prompt_ids),
                    completion_tokens=n,
                )
            )
        return results
