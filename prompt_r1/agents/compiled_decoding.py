"""Compiled decoding for the local agent: a static key/value cache and a decoding step compiled by torch.compile,
replayed as CUDA graphs (`AgentConfig.compile_decode`; the synchronous trainer's `agent_compile_decode`, auto by
default, turns it on for a policy on CUDA).

Why: a small agent's decoding step is bound by launching its kernels one by one, not by its arithmetic (estimated
from the GPU benchmark's figures: about 20 ms a step for the 353 M-parameter model on an H200, whose arithmetic for
64 rows takes well under a millisecond), so a turn costs its longest row's tokens times that, whatever the batch. A
CUDA graph replays a whole step at once.

Shapes are kept few, so that the step compiles once (twice where a longer cache makes its length dynamic) and
then replays: rows are padded to a power of two (at most the batch's limit; the pads stop at once and are
dropped), the cache's length is a multiple of `CACHE_STEP`, and a model keeps one cache per row count, the
longest asked for, so that the turns of every training step replay the same graphs at the same addresses (each
new cache, a new row count or a longer length, compiles or records again; the trainer makes a first cache about
as long as a trajectory may grow, where the budget has room, so that its later turns need no longer one). The
kept caches stay in memory between calls: under `auto` they hold at most `CACHE_SHARE` of the device's memory,
the least recently used dropped to make room, and a call whose cache alone would not fit decodes eagerly (a 4 B
agent's 64 rows of 8,192 tokens would need 72 GiB); `on` keeps them whatever they take. A model the compiler
fails on (or any error in a compiled call) is decoded eagerly from then on, with a warning.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from transformers import StaticCache
from transformers.generation.configuration_utils import CompileConfig

__all__ = [
    "CACHE_SHARE",
    "CACHE_STEP",
    "cache_budget",
    "cache_length",
    "compile_failed",
    "compiles_decoding",
    "decoding_compile_config",
    "kept_caches",
    "model_lock",
    "padded_rows",
    "record_failure",
    "static_cache",
]

# A compiled decoder's cache length is a multiple of this: the turns of a rollout (each a little longer than the
# last) share one shape, and so one compiled step.
CACHE_STEP = 256
# Under `auto`, the most of its device's memory a model's kept static caches may hold: the training step beside
# them needs the rest (the benchmark's 353 M model at 64 rows of 1,280 tokens: 4.4 GiB of an H200's 140).
CACHE_SHARE = 1 / 8


class _ModelCaches:
    """One model's kept caches (row count -> (cache, its tokens), the most recently used last; the length is kept
    here, since transformers 4 caches do not say it) and the lock its compiled calls hold: the caches and the
    recorded graphs are the model's, whichever agent or thread decodes with it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.caches: dict[int, tuple[StaticCache, int]] = {}


_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_FAILED: weakref.WeakSet = weakref.WeakSet()  # models the compiler failed on
_GUARD = threading.Lock()  # for _MODELS itself


def _entry(model: Any) -> _ModelCaches:
    with _GUARD:
        entry = _MODELS.get(model)
        if entry is None:
            entry = _MODELS[model] = _ModelCaches()
        return entry


def decoding_compile_config() -> CompileConfig:
    config = CompileConfig(fullgraph=False, dynamic=None, mode="reduce-overhead")
    # Read by transformers' `_valid_auto_compile_criteria`, which otherwise compiles on accelerators only: `on`
    # compiles on CPU too (without CUDA graphs there); auto is CUDA only.
    config._compile_all_devices = True
    return config


def compiles_decoding(model: Any, setting: str) -> bool:
    """Whether `setting` (auto, on, off) decodes `model` compiled: auto is on for a CUDA model whose weights are
    whole (DeepSpeed ZeRO-3 gathers partitioned weights in hooks a compiled step would not run); never for a model
    the compiler failed on."""
    if setting == "off" or compile_failed(model):
        return False
    if setting == "on":
        return True
    partitioned = any(hasattr(p, "ds_id") for p in model.parameters())
    return torch.device(model.device).type == "cuda" and not partitioned


def compile_failed(model: Any) -> bool:
    return model in _FAILED


def record_failure(model: Any) -> None:
    """The compiler failed on `model`: decode it eagerly from now on, and let its caches go (the entry and its
    lock stay, so that a call waiting on the lock then finds no cache). Call it holding `model_lock(model)`."""
    _FAILED.add(model)
    _entry(model).caches.clear()


def kept_caches(model: Any) -> dict[int, int]:
    """The model's kept static caches as row count -> tokens, the least recently used first."""
    entry = _MODELS.get(model)
    return {} if entry is None else {rows: tokens for rows, (_, tokens) in entry.caches.items()}


def model_lock(model: Any) -> threading.Lock:
    return _entry(model).lock


def padded_rows(rows: int, most: int) -> int:
    """`rows` padded to a power of two, at most `most` (but never fewer than `rows`)."""
    return max(rows, min(1 << (rows - 1).bit_length(), most))


def cache_length(tokens: int) -> int:
    """`tokens` rounded up to a multiple of CACHE_STEP."""
    return -(-tokens // CACHE_STEP) * CACHE_STEP


def static_cache(
    model: Any, rows: int, length: int, *, row_token_bytes: int, budget: int | None, make: int = 0
) -> StaticCache | None:
    """The model's kept cache for `rows` rows, emptied, when it holds `length` tokens; else a new one in its place,
    `make` tokens long where the budget has room for it beside the other kept caches (else `length`; under no
    budget, always `length`). A longer cache than a call needs serves it: the turns of an episode, each longer
    than the last, then share one cache and one compiled shape, and a first cache made for about the whole
    trajectory (`make`) spares the recompile a longer one would cost. `budget`: the most bytes the model's kept
    caches may hold (`row_token_bytes` a token of a row); the least recently used others are dropped to make
    room, and None is returned (decode eagerly) when the cache alone would not fit. Call it holding
    `model_lock(model)`."""
    if compile_failed(model):
        return None
    caches = _entry(model).caches
    if rows in caches and caches[rows][1] >= length:
        cache, _ = caches[rows] = caches.pop(rows)  # the most recently used, last
        cache.reset()
        return cache

    def others() -> int:
        return sum(n * tokens for n, (_, tokens) in caches.items() if n != rows) * row_token_bytes

    if budget is None or rows * make * row_token_bytes + others() > budget:
        make = 0  # no speculative length without a budget, nor at the cost of another row count's cache
    length = max(length, make)
    size = rows * length * row_token_bytes
    if budget is not None and size > budget:
        return None  # this call decodes eagerly; the kept caches stay
    caches.pop(rows, None)
    if budget is not None:
        while caches and size + others() > budget:
            caches.pop(next(iter(caches)))
    cache = StaticCache(config=model.config, max_cache_len=length)
    caches[rows] = (cache, length)
    return cache


def cache_budget(model: Any, setting: str) -> int | None:
    """The bytes a model's kept caches may hold under `setting`: CACHE_SHARE of a CUDA device's memory under auto,
    no bound under on (or on a device whose memory torch does not report)."""
    device = torch.device(model.device)
    if setting != "auto" or device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory * CACHE_SHARE)
