"""The EAGLE-3 draft: pure torch, shape comments, no I/O (checkpoints live in eyas.draft.io).

Numerics follow vLLM's Eagle3 Llama draft (vllm/model_executor/models/llama_eagle3.py):
  g        = fc(input_norm?(cat(aux_1..aux_k)))        target aux states -> draft width H   (step 0 only)
  e        = input_layernorm(embed(token))
  h, res   = hidden_norm(g), hidden_norm(g)             norm_before_residual=True (vLLM's assumption)
             hidden_norm(g), g                           norm_before_residual=False
  a        = o_proj(attn(q,k,v over cat(e, h)))         q/k/v take 2H, RoPE, GQA
  res      = a + res ; m = mlp(post_attention_layernorm(res)) ; pre = m + res
  logits   = lm_head(norm(pre)) over the draft vocab; `pre` feeds the next draft step.
Token ids map draft -> target as target_id = draft_id + d2t[draft_id]; t2d marks target ids in the draft vocab.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from eyas.aux_layers import check_aux_layer_ids
from eyas.vocab import target_ids, vocab_from_target_ids

try:  # FlexAttention: the GPU path for training masks; the dense bool-mask path works everywhere.
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # pragma: no cover - torch < 2.5
    BlockMask, flex_attention = None, None

_flex = flex_attention  # swapped for a compiled version by compile_flex_attention() (GPU training)


def compile_flex_attention() -> None:
    """Eager flex_attention materialises the full score matrix; compiled, it runs as a fused sparse
    kernel. Process-wide, so every Eagle3Draft picks it up."""
    global _flex
    if flex_attention is not None:
        import torch._dynamo
        # One compiled kernel per (T, KV length, grad mode): 2 x TTT steps shapes, above the default limit of 8.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        _flex = torch.compile(flex_attention, dynamic=False)


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int                      # target vocab (embedding rows)
    draft_vocab_size: int                # lm_head rows
    target_hidden_size: int
    aux_layer_ids: list[int]
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    norm_before_residual: bool = True
    norm_before_fc: bool = False
    kind: str = "eagle3"                 # the drafter (eyas.draft.kinds): model, objective, proposer, export
    num_layers: int = 1                  # draft decoder layers
    parallel_tokens: int | None = None   # parallel kinds: tokens one draft forward proposes (as trained)
    mask_token_id: int | None = None     # parallel kinds: the target-vocab id of the mask slots
    extra: dict[str, Any] = field(default_factory=dict)  # provenance (target name, arch); not used by math

    def __post_init__(self):
        # The owner's rules (sorted, unique, non-negative): a draft that engines would misread is never built.
        self.aux_layer_ids = check_aux_layer_ids(self.aux_layer_ids, key="draft aux_layer_ids")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DraftConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise KeyError(f"unknown DraftConfig keys: {unknown}")
        return cls(**d)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype  # normalise in fp32, scale in the input dtype (as vLLM and HF do)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def _rope_kind(cfg: DraftConfig) -> tuple[str, dict[str, Any]]:
    rs = cfg.rope_scaling or {}
    return rs.get("rope_type", rs.get("type", "default")), rs


def rope_inv_freq(cfg: DraftConfig) -> torch.Tensor:
    """[head_dim/2] inverse frequencies; 'default', 'linear', 'llama3' and 'yarn' scaling (yarn as vLLM computes it
    for a Llama draft: the ramp between interpolated and extrapolated frequencies over the original context)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    kind, rs = _rope_kind(cfg)
    if kind == "yarn":
        factor, old = float(rs["factor"]), float(rs["original_max_position_embeddings"])
        dim_at = lambda rot: d * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))
        lo, hi = dim_at(float(rs.get("beta_fast", 32))), dim_at(float(rs.get("beta_slow", 1)))
        if rs.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, d - 1)
        ramp = ((torch.arange(d // 2, dtype=torch.float) - lo) / ((hi - lo) or 0.001)).clamp(0, 1)
        keep = (1 - ramp) * float(rs.get("extrapolation_factor", 1))     # 1 = extrapolate (high frequencies)
        inv = inv / factor * (1 - keep) + inv * keep
    elif kind == "linear":
        inv = inv / float(rs["factor"])
    elif kind == "llama3":
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif kind not in ("default", None):
        raise ValueError(f"rope scaling {kind!r} is not supported by the eyas draft")
    return inv


def rope_mscale(cfg: DraftConfig) -> float:
    """Factor on cos and sin: yarn's attention scaling as vLLM applies it (0.1 ln(factor) + 1, times attn_factor;
    DeepSeek's mscale keys belong to its own rope class and are not read for a Llama draft); else 1."""
    kind, rs = _rope_kind(cfg)
    if kind != "yarn":
        return 1.0
    factor, attn = float(rs["factor"]), float(rs.get("attn_factor", 1.0))
    if not rs.get("apply_yarn_scaling", True):
        return attn
    return (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0) * attn


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style RoPE (the Llama convention). x [B, h, T, d]; cos/sin [B, 1, T, d]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig, in_features: int | None = None):
        """in_features: 2H for an EAGLE-3 first layer (embedding ++ hidden), H for a plain decoder layer."""
        super().__init__()
        H, d = cfg.hidden_size, cfg.head_dim
        x = 2 * H if in_features is None else in_features
        self.nh, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(x, self.nh * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(x, self.nkv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(x, self.nkv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.nh * d, H, bias=False)

    def forward(self, x, cos, sin, past: tuple[torch.Tensor, torch.Tensor] | None, mask, slots=None):
        # x [B, T, 2H or H] -> q [B, nh, T, d], k/v [B, nkv, T, d]
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        new = (k, v)
        if slots is not None:  # past is a static cache [B, nkv, S, d]: write this call in place, attend over it
            past[0].index_copy_(2, slots, k)
            past[1].index_copy_(2, slots, v)
            o = self._grouped_sdpa(q, past[0], past[1], mask)
            return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.d)), new
        if past is not None:  # keys/values of earlier positions or earlier TTT steps: [B, nkv, S, d]
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        o = attend(q, k, v, mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.d)), new

    def _grouped_sdpa(self, q, k, v, mask):
        return grouped_sdpa(q, k, v, mask)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """q [B, nh, T, d], k/v [B, nkv, S, d]; mask bool [B|1, 1, T, S] (True = attend) or a FlexAttention
    BlockMask -> [B, nh, T, d]. GQA by repeating K/V (the training path's shapes)."""
    nh, nkv = q.shape[1], k.shape[1]
    if BlockMask is not None and isinstance(mask, BlockMask):
        return _flex(q, k, v, block_mask=mask, enable_gqa=nh != nkv)
    if nh != nkv:
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def grouped_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The decoding path over a static cache: q [B, nh, T, d], k/v [B, nkv, S, d], mask bool [B|1, 1, T, S]
    -> [B, nh, T, d]. GQA without repeating K/V per query head (which copies the whole cache, x nh/nkv, on every
    call): the rep query heads of KV head g become rep*T query rows of one head; row r*T + t is query t of head
    g*rep + r."""
    B, nh, T, d = q.shape
    nkv = k.shape[1]
    rep = nh // nkv
    qg = q.reshape(B, nkv, rep * T, d)
    mg = mask.repeat(1, 1, rep, 1) if rep > 1 else mask
    return F.scaled_dot_product_attention(qg, k, v, attn_mask=mg).reshape(B, nh, T, d)


def rope_cos_sin(inv_freq: torch.Tensor, position_ids: torch.Tensor, dtype: torch.dtype, mscale: float = 1.0):
    """position_ids [B, T] -> cos, sin [B, 1, T, d] (angles in fp32); mscale: YaRN's attention scaling."""
    ang = position_ids.float()[..., None] * inv_freq.float()
    emb = torch.cat([ang, ang], dim=-1)[:, None]
    if mscale != 1.0:
        return (emb.cos() * mscale).to(dtype), (emb.sin() * mscale).to(dtype)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        if cfg.hidden_act not in ("silu", "swish"):
            raise ValueError(f"hidden_act {cfg.hidden_act!r}: the eyas draft implements SwiGLU (silu)")
        H, I = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(H, I, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(H, I, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(I, H, bias=cfg.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        H = cfg.hidden_size
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, emb, hidden, cos, sin, past, mask, slots=None):
        # emb, hidden [B, T, H] -> pre-norm output [B, T, H], this call's (k, v)
        e = self.input_layernorm(emb)
        if self.norm_before_residual:
            h = self.hidden_norm(hidden)
            res = h
        else:
            res = hidden
            h = self.hidden_norm(hidden)
        a, kv = self.self_attn(torch.cat([e, h], dim=-1), cos, sin, past, mask, slots)
        res = a + res
        return self.mlp(self.post_attention_layernorm(res)) + res, kv


class DraftBase(nn.Module):
    """What every drafter kind shares around its layers: the vocabulary map (d2t/t2d buffers, draft ids ->
    target ids), the RoPE frequencies, the aux layout fc reads."""

    config: DraftConfig

    def register_buffers(self, cfg: DraftConfig) -> None:
        # Until set_vocab_map: the first draft_vocab_size target ids (a consistent map, the identity when full).
        d2t, t2d = vocab_from_target_ids(torch.arange(cfg.draft_vocab_size), cfg.vocab_size)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.rope_mscale = rope_mscale(cfg)

    def flat_aux(self, aux: torch.Tensor) -> torch.Tensor:
        """Aux states [..., k, Ht] (or already [..., k*Ht]) -> [..., k*Ht]."""
        if aux.dim() >= 3 and aux.shape[-2] == self.config.num_aux and aux.shape[-1] == self.config.target_hidden_size:
            return aux.flatten(-2)
        return aux

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocab token ids (e.g. sampled from `logits`) -> target-vocab ids."""
        return draft_ids + self.d2t[draft_ids]

    @torch.no_grad()
    def set_vocab_map(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        if d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise ValueError(f"vocab map shapes d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)} do not match "
                             f"the draft ({tuple(self.d2t.shape)} / {tuple(self.t2d.shape)})")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)


class Eagle3Draft(DraftBase):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        H = cfg.hidden_size
        fc_in = cfg.num_aux * cfg.target_hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)  # copied from the target and frozen
        self.input_norm = RMSNorm(fc_in, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc = nn.Linear(fc_in, H, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(cfg)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffers(cfg)

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """Target aux states [..., k, Ht] or [..., k*Ht] -> draft input hidden [..., H]."""
        aux = self.flat_aux(aux)
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        return self.fc(aux.to(self.fc.weight.dtype))

    def rope(self, position_ids: torch.Tensor, dtype: torch.dtype):
        # position_ids [B, T] -> cos, sin [B, 1, T, d] (angles in fp32)
        return rope_cos_sin(self.inv_freq, position_ids, dtype, self.rope_mscale)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                mask=None, past: tuple[torch.Tensor, torch.Tensor] | None = None,
                cache_slots: torch.Tensor | None = None):
        """One draft step over T positions.

        input_ids [B, T] target-vocab ids; hidden [B, T, H] (combine(aux) at step 0, else the previous
        step's pre-norm output); position_ids [B, T]; mask: bool [B|1, 1, T, S+T] (True = attend) or a
        FlexAttention BlockMask, or None for plain causal without `past`; past: (k, v) [B, nkv, S, d].
        cache_slots [T] (decoding): `past` is a static cache; this step's k/v are written into it at these
        slots and attention runs over the cache alone, mask bool [B|1, 1, T, S] (a row sees its own slot).
        Returns pre-norm hidden [B, T, H] and this step's (k, v) for the caller's cache.
        """
        emb = self.embed_tokens(input_ids).to(hidden.dtype)
        cos, sin = self.rope(position_ids, hidden.dtype)
        if mask is None and past is None:
            T = input_ids.shape[1]
            mask = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()[None, None]
        pre, kv = self.layers[0](emb, hidden, cos, sin, past, mask, cache_slots)
        return pre, kv

    def logits(self, pre: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits [..., Vd] from the pre-norm hidden."""
        return self.lm_head(self.norm(pre))

    @torch.no_grad()
    def init_from_target(self, embed: torch.Tensor, lm_head: torch.Tensor | None = None,
                         final_norm: torch.Tensor | None = None) -> None:
        """Copy the target's token embedding (frozen); optionally seed lm_head/norm from the target's
        head restricted to the draft vocab, which speeds early training a lot (same hidden space)."""
        self.embed_tokens.weight.copy_(embed)
        if lm_head is not None:
            self.lm_head.weight.copy_(lm_head[target_ids(self.d2t).to(lm_head.device)])
        if final_norm is not None:
            self.norm.weight.copy_(final_norm)


def draft_config_from_target(tcfg, *, aux_layer_ids: list[int], draft_vocab_size: int | None = None,
                             norm_before_residual: bool = True, norm_before_fc: bool = False,
                             num_key_value_heads: int | None = None) -> DraftConfig:
    """Draft shapes from a transformers config (duck-typed: this module imports no transformers).
    Multimodal wrappers keep the LM's numbers in `text_config`."""
    t = getattr(tcfg, "text_config", None) or tcfg
    get = lambda *names, default=None: next((getattr(t, n) for n in names if getattr(t, n, None) is not None), default)
    H = get("hidden_size", "n_embd")
    nh = get("num_attention_heads", "n_head")
    rope = get("rope_parameters", "rope_scaling") or {}
    theta = rope.get("rope_theta", None) or get("rope_theta", default=10000.0)
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"} or None
    if scaling and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    V = get("vocab_size")
    return DraftConfig(
        hidden_size=H, intermediate_size=get("intermediate_size", "n_inner", default=4 * H),
        num_attention_heads=nh, num_key_value_heads=num_key_value_heads or get("num_key_value_heads", default=nh),
        head_dim=get("head_dim", default=H // nh), vocab_size=V, draft_vocab_size=draft_vocab_size or V,
        target_hidden_size=H, aux_layer_ids=list(aux_layer_ids),
        rms_norm_eps=float(get("rms_norm_eps", "layer_norm_epsilon", default=1e-6)), rope_theta=float(theta),
        rope_scaling=scaling, max_position_embeddings=get("max_position_embeddings", "n_positions", default=4096),
        norm_before_residual=norm_before_residual, norm_before_fc=norm_before_fc,
        extra={"target_model_type": getattr(t, "model_type", None),
               "target_architectures": list(getattr(tcfg, "architectures", None) or [])})
