"""Grouped-query attention for the native generator's one-token decode step, without repeating K/V.

transformers' sdpa path (`sdpa_attention_forward`, 5.17 as on our GPU image) only uses SDPA's native GQA when
there is no attention mask; with the generator's explicit [B, 1, 1, L] mask it calls `repeat_kv`, which
materialises K and V repeated to every query head over the whole cache, per layer and step (SmolLM2-135M at
batch 256, L 1024: 2 x 302 MB per layer, ~40 GB of traffic per step). For a single query token the heads of
one KV group can instead share the KV head as SDPA's query rows: q [B, H, 1, d] -> [B, Hkv, g, d] against
k, v [B, Hkv, L, d] (transformers >= 5.24 does the same as `pack_gqa`, but not under torch.compile).

`grouped_attention(model)` switches the model to this function for the generator's own forward calls and
restores its previous implementation afterwards; only models on "sdpa" are switched. (eyas.data.flex_decode
switches the decode step to FlexAttention the same way, through `attention_implementation`.)
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "eyas_grouped_sdpa"
# kwargs that change the attention itself; sdpa ignores sliding_window (the mask carries the window)
DELEGATED_KWARGS = ("softcap", "s_aux", "sinks", "position_bias")


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 max_rows: int = 1, **kwargs) -> tuple[torch.Tensor, None]:
    """sdpa's contract (returns [B, T, H, dv], None). Up to `max_rows` query rows a KV group (T x heads a group)
    run grouped: q [B, H, T, d] -> [B, Hkv, g*T, d] (rows ordered head, then position), the mask's T rows repeated
    for each head of a group — g*T*L mask entries instead of K and V repeated over the whole cache. Anything else
    (no mask at T > 1: sdpa's causal flag would span the groups; per-head or odd masks past T = 1) goes to sdpa."""
    B, H, T, d = query.shape
    Hkv = key.shape[1]
    mask = attention_mask
    g = H // Hkv if Hkv and H % Hkv == 0 else 0
    if (g < 2 or g * T > max_rows or dropout or query.shape[0] != key.shape[0]
            or any(kwargs.get(k) is not None for k in DELEGATED_KWARGS)
            or (mask is None and T > 1)
            or (mask is not None and (mask.dim() != 4 or mask.shape[1] not in (1, H) or mask.shape[2] != T
                                      or (T > 1 and mask.shape[1] != 1)))):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    q = query.reshape(B, Hkv, g * T, d)  # head h = kv * g + j, as in repeat_kv; row j * T + t
    if mask is not None and mask.shape[1] == H:  # T = 1: a per-head mask follows its heads into the groups
        mask = mask.reshape(mask.shape[0], Hkv, g, mask.shape[-1])
    elif mask is not None and T > 1:
        mask = mask[:, :, None].expand(mask.shape[0], 1, g, T, mask.shape[-1]).reshape(mask.shape[0], 1, g * T, -1)
    # SDPA keeps fp32 scores and softmax inside its kernels; the g query rows of a group read its K/V once
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(B, H, T, value.shape[-1]).transpose(1, 2).contiguous(), None


def grouped_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             **kwargs) -> tuple[torch.Tensor, None]:
    """The generator's: q_len 1 runs grouped (`grouped_sdpa`), anything else goes to sdpa unchanged."""
    return grouped_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        max_rows=query.shape[1] // max(1, key.shape[1]), **kwargs)


AttentionInterface.register(NAME, grouped_decode_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # masks built by the model itself: as for sdpa
# implementations that `attention_implementation` may switch: sdpa and eyas's own functions of its contract
SDPA_LIKE = {"sdpa", NAME}


def _configs(config) -> Iterator:
    """The config and its sub-configs, parents first."""
    yield config
    for key in getattr(config, "sub_configs", None) or {}:
        if (sub := getattr(config, key, None)) is not None:
            yield from _configs(sub)


@contextmanager
def attention_implementation(model, name: str) -> Iterator[None]:
    """Within: configs on "sdpa" (or on one of eyas's functions of sdpa's contract, `SDPA_LIKE`) use the registered
    function `name`; afterwards every config has its own value back. Only those switch: the functions here fall
    back to sdpa's contract, not eager's."""
    configs = list(_configs(model.config))  # parents first: a parent's setter also sets its sub-configs
    before = [c._attn_implementation for c in configs]
    for c, impl in zip(configs, before):
        c._attn_implementation = name if impl in SDPA_LIKE else impl
    try:
        yield
    finally:
        for c, impl in zip(configs, before):
            c._attn_implementation = impl


def grouped_attention(model):
    """Within: configs on "sdpa" use `grouped_decode_attention`; afterwards every config has its own value back."""
    return attention_implementation(model, NAME)
