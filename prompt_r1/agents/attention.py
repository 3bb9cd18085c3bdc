"""Attention for a padded batch of a grouped-query model on CPU: the kernel's own key/value groups, not copies.

    use_grouped_attention(model)    # True: the model's SDPA attention now passes its groups to the kernel

A grouped-query model (SmolLM2-135M: 9 query heads sharing 3 key/value heads) hands its keys and values to
transformers' SDPA attention, which passes them to torch's kernel as they are (`enable_gqa`) only where no mask is
given. A padded batch, what every batched `generate` of episodes is, has a mask, so each layer first copies its
keys and values once per query head of a group (`repeat_kv`): at 32 rows of 400 tokens (the most one call holds on
CPU by default), about 1.8 GB a decoding step for SmolLM2-135M. torch's CPU kernel takes the mask and the groups
together and gives the same result to the bit (tests/test_agents.py), so on CPU the model's attention is
registered anew under `NAME`: SDPA with the groups passed through wherever there is a mask, transformers' own
SDPA attention elsewhere. On CUDA the fused kernels do not take a mask with groups (the call would fall back to
the slow math kernel), so there the model is left as it is.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = ["NAME", "grouped_attention_while", "grouped_sdpa_attention", "use_grouped_attention"]

NAME = "sdpa_grouped"
_lock = threading.Lock()
_registered: list[str] = []  # NAME, once registered
# `enable_gqa` came with torch 2.5; an older torch keeps transformers' attention.
_TORCH_HAS_GROUPS = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, but with a mask and grouped heads, the groups go to the kernel uncopied."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = kwargs.get("position_bias") is None and not kwargs.get("output_attentions", False)
    if not (grouped and plain and attention_mask is not None):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
            **kwargs,
        )  # fmt: skip
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def use_grouped_attention(model: Any) -> bool:
    """Give a model on CPU whose attention is SDPA the grouped form (module doc); whether it was given it."""
    config = getattr(model, "config", None)
    if not _TORCH_HAS_GROUPS or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if model.device.type != "cpu":
        return False
    heads = getattr(config, "num_attention_heads", None)
    if not heads or (getattr(config, "num_key_value_heads", None) or heads) == heads:
        return False  # no groups: nothing is copied
    with _lock:
        if not _registered:
            AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA takes
            AttentionInterface.register(NAME, grouped_sdpa_attention)
            _registered.append(NAME)
    model.set_attn_implementation(NAME)
    return True


@contextlib.contextmanager
def grouped_attention_while(model: Any) -> Iterator[None]:
    """The grouped form for the block only, the model's own attention after it: a policy generating its rollouts
    between training steps (the forward is the same to the bit; the backward sums the groups' gradients in another
    order, so the training step keeps the attention its figures were measured with)."""
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    switched = use_grouped_attention(model)
    try:
        yield
    finally:
        if switched:
            model.set_attn_implementation(before)
