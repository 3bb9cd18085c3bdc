"""What `AsyncGRPOTrainer` assumes of a GPU, replaced so that it trains on CPU.

Two things in TRL 1.16's async trainer need CUDA outside its weight transfer (which is
`prompt_r1.training.asynchronous.weight_transfer`'s job): the tree attention's kernel, and the device-name lookup behind its
MFU metric (`torch.cuda.get_device_name`, called in the constructor). `cpu_trainer` builds the trainer with that
lookup answering "unknown" (TRL then logs no MFU, its documented case), and `install` puts a torch tree attention
in place of the kernel.

The tree attention:

`AsyncGRPOTrainer` loads the model with attention "tree_fa3" and folds a step's samples into a prefix trie
(`trl.experimental.async_grpo.packing.TreeRow`): a token shared by several samples (a group's prompt, and a
multi-turn episode's earlier turns) is forwarded once. Each segment of the trie attends to the keys and values
of its root-to-segment path. TRL computes this with flash-attention 3's varlen kernel, fetched from the hub at
first use: GPU only, and not reachable offline.

`tree_attention` is the same computation in plain torch: for each segment, its queries attend causally to its
path's keys, aligned bottom-right (the segment is the end of its path), as flash-attention's varlen kernel does
with `causal=True`. `install` registers it under TRL's attention name where there is no CUDA. It loops over
segments, which is slow for long rows and fine for the small models CPU training runs. Sliding windows and
soft-capping are refused rather than ignored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["cpu_trainer", "install", "tree_attention", "varlen_attention"]


@contextlib.contextmanager
def cpu_trainer(device: Any) -> Iterator[None]:
    """While an `AsyncGRPOTrainer` is built for a `device` that is not CUDA: no peak-FLOPs lookup (no MFU), and
    FSDP2 across CPU processes when `accelerate launch` asks for it (`fsdp_on_cpu`)."""
    import torch
    import trl.experimental.async_grpo.async_grpo_trainer as trainer_module

    if torch.device(device).type == "cuda":
        yield
        return
    original = trainer_module.get_peak_flops_per_device
    trainer_module.get_peak_flops_per_device = lambda accelerator, dtype: None
    fsdp_on_cpu()
    try:
        yield
    finally:
        trainer_module.get_peak_flops_per_device = original


def fsdp_on_cpu() -> bool:
    """Let accelerate shard with FSDP across CPU processes (gloo). Returns whether it was asked for.

    `accelerate launch` with an FSDP config sets ACCELERATE_USE_FSDP, but accelerate enables FSDP only for GPU-like
    devices: on CPU it builds plain data parallelism (DDP) and ignores the config. torch's `fully_shard` runs on CPU
    with gloo all the same, so an accelerate state of CPU processes that holds the FSDP plugin accelerate made from
    the launch's settings becomes FSDP. Every `AcceleratorState()` copies the process state's type again (CPU), so
    the hook stays for the process's life (a training process). Nothing changes outside `accelerate launch` with an
    FSDP config."""
    import os

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return False
    from accelerate import state as accelerate_state
    from accelerate.utils import DistributedType

    original = accelerate_state.AcceleratorState.__init__
    if getattr(original, "fsdp_on_cpu", False):
        return True

    def init(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        plugin = getattr(self, "fsdp_plugin", None) or fsdp_plugin
        if self.distributed_type == DistributedType.MULTI_CPU and plugin is not None:
            if getattr(self, "fsdp_plugin", None) is None and self._mixed_precision != "no":
                plugin.set_mixed_precision(self._mixed_precision)  # as accelerate does on GPUs
            self.distributed_type, self.fsdp_plugin = DistributedType.FSDP, plugin

    init.fsdp_on_cpu = True
    accelerate_state.AcceleratorState.__init__ = init
    return True


def varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k, *, scale: float | None = None):
    """flash_attn_varlen_func(causal=True) in torch: query (Nq, H, D), key/value (Nk, Hkv, D) → (Nq, H, D)."""
    import torch
    import torch.nn.functional as F

    heads, kv_heads = query.shape[1], key.shape[1]
    outputs = []
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(bounds_q) - 1):
        q = query[bounds_q[i] : bounds_q[i + 1]]
        k = key[bounds_k[i] : bounds_k[i + 1]]
        v = value[bounds_k[i] : bounds_k[i + 1]]
        if kv_heads != heads:  # grouped-query attention
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
        len_q, len_k = q.shape[0], k.shape[0]
        # Query j sees key t when t <= len_k - len_q + j (bottom-right causal alignment).
        allowed = torch.arange(len_k, device=q.device)[None, :] <= (
            torch.arange(len_q, device=q.device)[:, None] + (len_k - len_q)
        )
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed, scale=scale
        )
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs, dim=0)


def tree_attention(
    module: Any,
    query,
    key,
    value,
    attention_mask,
    *,
    tree_kv_index,
    tree_cu_seqlens_q,
    tree_cu_seqlens_k,
    tree_max_seqlen_q=None,
    tree_max_seqlen_k=None,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
):
    """TRL's `packing.tree_attention` with `varlen_attention` in place of the flash-attention 3 kernel."""
    if sliding_window or softcap:
        raise NotImplementedError(
            "tree attention on CPU supports neither sliding windows nor soft-capping; train this model on a GPU"
        )
    query, key, value = (x.transpose(1, 2)[0] for x in (query, key, value))  # (N, heads, dim)
    out = varlen_attention(
        query,
        key.index_select(0, tree_kv_index),
        value.index_select(0, tree_kv_index),
        tree_cu_seqlens_q,
        tree_cu_seqlens_k,
        scale=scaling,
    )
    return out.unsqueeze(0), None


def install(device: Any) -> bool:
    """Register `tree_attention` under TRL's tree attention name when `device` is not CUDA, or when the kernel
    cannot be had there (a GPU machine without hub access: said on stderr). Call it after the trainer is built:
    the trainer registers its own on construction. Returns whether it did."""
    import sys

    import torch
    from transformers import AttentionInterface
    from trl.experimental.async_grpo import packing

    if torch.device(device).type == "cuda":
        try:
            packing._flash_attn()  # fetched from the hub once, then cached
            return False
        except Exception as exc:  # noqa: BLE001 (offline, no `kernels` package, an unsupported GPU: all the same)
            print(
                f"the async trainer's flash-attention kernel is not available ({type(exc).__name__}: {exc}); "
                "training with the torch tree attention instead (slower)",
                file=sys.stderr,
            )
    AttentionInterface.register(packing.TREE_ATTENTION, tree_attention)
    return True
