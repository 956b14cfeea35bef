"""The P-EAGLE draft (Parallel EAGLE): EAGLE-3's first layer, plain Llama layers after it, and a learned mask.

One forward drafts every depth (vLLM 0.26: Eagle3LlamaForCausalLM with speculative_config.parallel_drafting):
  row at position t (committed)   token x_{t+1}, hidden fc(aux_t)             -> predicts x_{t+2}  (depth 0)
  mask row at position p+j        token mask_token_id, hidden fc(mask_hidden)  -> predicts x_{p+2+j} (depth j)
all causal over positions. Layer 0 is eyas.draft.model.DecoderLayer (q/k/v over cat(embedding, hidden));
layers 1.. are Llama layers over the residual stream (vLLM: input_layernorm(hidden + residual)):
  x      = pre of the layer before
  r      = x + o_proj(attn(input_layernorm(x)))      q/k/v take H
  pre    = mlp(post_attention_layernorm(r)) + r
mask_hidden [k * Ht] lives in the aux space (vLLM projects it through the same fc). The published recipe trains
the token embedding (the mask token's row with it), so P-EAGLE's embedding is not frozen.
"""

from __future__ import annotations

import torch
from torch import nn

from eyas.draft.model import MLP, Attention, DraftConfig, Eagle3Draft, RMSNorm


class PlainLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        H = cfg.hidden_size
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, in_features=H)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, past, mask, slots=None):
        # x [B, T, H] (the previous layer's pre-norm output) -> this layer's [B, T, H], this call's (k, v)
        a, kv = self.self_attn(self.input_layernorm(x), cos, sin, past, mask, slots)
        r = x + a
        return self.mlp(self.post_attention_layernorm(r)) + r, kv


class PEagleDraft(Eagle3Draft):
    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        self.layers.extend(PlainLayer(cfg) for _ in range(cfg.num_layers - 1))
        self.mask_hidden = nn.Parameter(torch.randn(cfg.num_aux * cfg.target_hidden_size))
        self.embed_tokens.weight.requires_grad_(True)

    def mask_state(self) -> torch.Tensor:
        """The hidden input of every mask row [H]: fc of the learned aux-space mask."""
        return self.combine(self.mask_hidden)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                mask=None, past: list | None = None, cache_slots: torch.Tensor | None = None):
        """input_ids/position_ids [B, T]; hidden [B, T, H] (combine(aux) or mask_state()); mask as Eagle3Draft's;
        past: one (k, v) per layer or None; cache_slots [T]: `past` holds static caches written in place.
        Returns pre-norm hidden [B, T, H] and one (k, v) per layer."""
        emb = self.embed_tokens(input_ids).to(hidden.dtype)
        cos, sin = self.rope(position_ids, hidden.dtype)
        if mask is None and past is None:
            T = input_ids.shape[1]
            mask = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()[None, None]
        x, kv = self.layers[0](emb, hidden, cos, sin, past[0] if past else None, mask, cache_slots)
        kvs = [kv]
        for i, layer in enumerate(self.layers[1:], start=1):
            x, kv = layer(x, cos, sin, past[i] if past else None, mask, cache_slots)
            kvs.append(kv)
        return x, kvs
