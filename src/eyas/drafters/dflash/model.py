"""The DFlash draft (block diffusion): a block of mask tokens filled in one non-causal pass, the target's hidden
states injected into every draft layer as extra keys/values.

Numerics follow vLLM 0.26's DFlashQwen3ForCausalLM (vllm/model_executor/models/qwen3_dflash.py):
  c        = hidden_norm(fc(cat(aux_1..aux_k)))            context: one row per committed position
  ctx k/v  = k_norm(k_proj(c)) (RoPE at its position), v_proj(c)      per layer; no input_layernorm on c
  x        = embed(block tokens)                           block: [anchor = last committed token, mask x K]
  layer    : h = input_layernorm(x); q = q_norm(q_proj(h)), k = k_norm(k_proj(h)), v = v_proj(h) (RoPE q, k)
             a = o_proj(attn(q over ctx k/v ++ block k/v)); r = x + a; x = mlp(post_attention_layernorm(r)) + r
  logits   = lm_head(norm(x)) over the draft vocab; block row i (i >= 1) predicts the token at its own position.
q_norm/k_norm are RMSNorms over head_dim (Qwen3 layers, whatever the target's architecture). The recipe keeps the
target's token embedding and LM head (the draft-vocab rows of it) frozen: the mask token is a target id whose
(frozen) embedding the layers learn to read.
"""

from __future__ import annotations

import torch
from torch import nn

from eyas.draft.model import MLP, DraftBase, DraftConfig, RMSNorm, attend, grouped_sdpa, rope_cos_sin, rotate
from eyas.vocab import target_ids


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        H, d = cfg.hidden_size, cfg.head_dim
        self.nh, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(H, self.nh * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(H, self.nkv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(H, self.nkv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.nh * d, H, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def kv(self, x, cos, sin):
        # x [B, S, H] -> k, v [B, nkv, S, d] (k normed per head, then rotated). Under autocast the projections are
        # bf16 and the norm/rotation promote to fp32: k comes back in v's dtype, as attention needs one.
        B, S, _ = x.shape
        v = self.v_proj(x).view(B, S, self.nkv, self.d).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, S, self.nkv, self.d)).transpose(1, 2)
        return rotate(k, cos, sin).to(v.dtype), v

    def forward(self, x, cos, sin, ctx, mask, cache=None, slots=None):
        """x [B, T, H] (normed block hidden); ctx (k, v) [B, nkv, S, d] of the context, or None; mask bool
        [B|1, 1, T, S+T] or a BlockMask. Decoding: cache = this layer's static (k, v) [1, nkv, size, d], the
        block's k/v written at `slots`, attention over the cache alone (mask [1, 1, T, size])."""
        B, T, _ = x.shape
        k, v = self.kv(x, cos, sin)
        q = self.q_norm(self.q_proj(x).view(B, T, self.nh, self.d)).transpose(1, 2)
        q = rotate(q, cos, sin).to(v.dtype)
        if slots is not None:
            cache[0].index_copy_(2, slots, k)
            cache[1].index_copy_(2, slots, v)
            o = grouped_sdpa(q, cache[0], cache[1], mask)
        else:
            if ctx is not None:
                k, v = torch.cat([ctx[0], k], dim=2), torch.cat([ctx[1], v], dim=2)
            o = attend(q, k, v, mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.d))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        H = cfg.hidden_size
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, ctx, mask, cache=None, slots=None):
        r = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx, mask, cache, slots)
        return self.mlp(self.post_attention_layernorm(r)) + r


class DFlashDraft(DraftBase):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        H = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen (the recipe)
        self.fc = nn.Linear(cfg.num_aux * cfg.target_hidden_size, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(False)         # the target's head rows (init_from_target), frozen
        self.register_buffers(cfg)

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """Target aux states [..., k, Ht] or [..., k*Ht] -> fc output [..., H] (vLLM's combine_hidden_states)."""
        return self.fc(self.flat_aux(aux).to(self.fc.weight.dtype))

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """Aux states -> the normed context rows c [..., H] every layer reads keys/values from."""
        return self.hidden_norm(self.combine(aux))

    def context_kv(self, c: torch.Tensor, position_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """c [B, S, H], position_ids [B, S] -> per layer (k, v) [B, nkv, S, d]."""
        cos, sin = rope_cos_sin(self.inv_freq, position_ids, c.dtype, self.rope_mscale)
        return [layer.self_attn.kv(c, cos, sin) for layer in self.layers]

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, context=None, context_positions=None,
                mask=None, caches: list | None = None, slots: torch.Tensor | None = None) -> torch.Tensor:
        """Block rows input_ids/position_ids [B, T] -> pre-norm hidden [B, T, H].

        Training: context [B, S, H] (from `context`) at context_positions [B, S]; mask bool [B|1, 1, T, S+T]
        (keys: context then block) or a BlockMask. Decoding: caches = one static (k, v) per layer already
        holding the context, slots [T] where the block's k/v go, mask bool [1, 1, T, size]."""
        x = self.embed_tokens(input_ids).to(self.fc.weight.dtype)
        cos, sin = rope_cos_sin(self.inv_freq, position_ids, x.dtype, self.rope_mscale)
        ctx = self.context_kv(context.to(x.dtype), context_positions) if context is not None else None
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, ctx[i] if ctx is not None else None, mask,
                      caches[i] if caches is not None else None, slots)
        return x

    def logits(self, pre: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(pre))

    @torch.no_grad()
    def init_from_target(self, embed: torch.Tensor, lm_head: torch.Tensor | None = None,
                         final_norm: torch.Tensor | None = None) -> None:
        """The target's embedding and (the recipe) its LM head rows for the draft vocab, both frozen; without the
        target's head (--no-init-head) the draft's own is trained. The final norm is seeded and trained."""
        self.embed_tokens.weight.copy_(embed)
        if lm_head is not None:
            self.lm_head.weight.copy_(lm_head[target_ids(self.d2t).to(lm_head.device)])
        self.lm_head.weight.requires_grad_(lm_head is None)
        if final_norm is not None:
            self.norm.weight.copy_(final_norm)
