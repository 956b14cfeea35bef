"""One target forward over arbitrary tokens at arbitrary KV slots, for any HF causal LM.

The target runs through its own transformers forward (so every architecture works: Llama, MoE,
multimodal wrappers), with two substitutions that make tree verification and CUDA graphs possible:

* `SlotCache` — a StaticCache subclass whose `update` writes this call's keys/values at explicit
  slots (`cache.slots`, [T]) of preallocated [1, nkv, capacity, d] buffers (views of one tensor for
  all layers when their shapes agree) and returns views of their first `cache.kv_len` slots. Tree
  nodes therefore live at scratch slots after the context, and accepting a path is a copy of a few
  slots (`compact`). Overriding `update` (whose signature is stable across transformers 5.x, unlike
  the StaticLayer internals) keeps us independent of cache bookkeeping.
* an explicit additive 4-D mask [1, 1, T, kv_len] (transformers returns 4-D masks as-is): a query
  sees the committed context (slots < ctx_len) plus its tree ancestors. Models with both full and
  sliding-window layers (Gemma 2/3) get the {layer_type: mask} mapping they accept, with the window
  applied to the sliding one. Other sliding-window models see full attention (exact while
  sequences stay inside their window, which is 4k+ for the models that use it this way).
* KV buckets: a step attends over only the first `kv_len` slots, kv_len from a few static sizes
  (`runner.bucket(n)`: powers of two from `min_bucket`, then `capacity`). The masked-out tail would
  be pure waste: attention kernels walk every KV tile, so a step's cost grows with kv_len, not
  with the real context. Each bucket is one more static shape (compile / CUDA graph).
* a turn's first prefill chunk (slots from 0, no context) on an "sdpa" model runs SDPA's causal kernel over
  its own keys instead of the mask (`causal=True`): the same attention, but SDPA can pick flash attention,
  which takes no mask (the masked kernel was ≈ 20 % of a 1.5B's graphed 1k-token prefill).

Aux states (the draft's input) come from `eyas.target.capture` hooks that stay registered for the
runner's lifetime, so the same function can be handed to torch.compile (the hook writes are
traced as side effects) and replayed as a CUDA graph with static shapes.
"""

from __future__ import annotations

import inspect
from bisect import bisect_left
from contextlib import ExitStack

import torch
from torch import nn

from eyas import env
from eyas.data.attention import DELEGATED_KWARGS, SDPA_LIKE, attention_implementation, grouped_sdpa
from eyas.devices import varying_shape_attention
from eyas.target.capture import capture
from eyas.target.layers import Layout


CAUSAL = "eyas_causal_sdpa"


def causal_chunk_attention(module, query, key, value, attention_mask, **kwargs):
    """sdpa over the query's own keys with SDPA's causal flag, the mask ignored: exact for rows at slots 0..T-1
    with no context before them (row i sees slots 0..i), which is what that mask says there."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    T = query.shape[2]
    causal = kwargs.get("is_causal", getattr(module, "is_causal", True)) is not False   # not an encoder's layer
    if T == 1 or not causal or any(kwargs.get(k) is not None for k in DELEGATED_KWARGS):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key[:, :, :T], value[:, :, :T], None, **kwargs)


def _register(name: str, fn) -> None:
    """`fn` (sdpa's contract) as transformers attention implementation `name`, its masks built as sdpa's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, sdpa_mask)


GROUPED = "eyas_grouped_step_sdpa"
GROUPED_ROWS = 1024   # query rows a KV group up to which a step runs grouped (a 61-node tree, 6 heads a group: 366)


def grouped_step_attention(module, query, key, value, attention_mask, **kwargs):
    """A decode or verify step's attention with its mask, the query heads of a KV group sharing it (`grouped_sdpa`):
    transformers' sdpa repeats K and V to every query head over the whole KV bucket when a mask is given."""
    return grouped_sdpa(module, query, key, value, attention_mask, max_rows=GROUPED_ROWS, **kwargs)


# registered at import: a runner made while another has switched the model still sees an sdpa model
_register(GROUPED, grouped_step_attention)
SDPA_LIKE.add(GROUPED)


def _static_cache_class():
    from transformers import StaticCache
    return StaticCache


def _static(t: torch.Tensor) -> torch.Tensor:
    torch._dynamo.mark_static_address(t)  # compiled graphs and captured CUDA graphs keep its address
    return t


def _kv_heads(config) -> tuple[int, int] | None:
    """(KV heads, head dim) that the config promises for every layer, or None if it does not say."""
    text = config.get_text_config(decoder=True)
    heads = getattr(text, "num_attention_heads", None)
    nkv = getattr(text, "num_key_value_heads", None) or heads
    dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else None)
    return (nkv, dim) if nkv and dim else None


class SlotCache(_static_cache_class()):  # type: ignore[misc]
    """KV buffers indexed by explicit slots; see the module docstring.

    When the layers' K/V shapes are those the config promises (the usual case), one tensor `kv`
    [n_layers, 2 (K, V), 1, nkv, capacity, d] holds every layer, so `compact` is one gather and one
    scatter instead of four kernels per layer. Slots stay the second-to-last dim, so each layer's
    kbuf/vbuf is a contiguous [1, nkv, capacity, d] view, just like a separate buffer. Layers get
    these views as their buffers (not kv[i] inside `update`): compiled steps then mutate disjoint
    static inputs in place, where writes through in-graph views of one input make inductor copy
    whole buffers. A layer of another shape, dtype or device (every layer with shared=False) gets
    buffers of its own."""

    def __init__(self, config, capacity: int, *, shared: bool = True):
        super().__init__(config=config, max_cache_len=capacity)
        self.capacity = capacity
        n = len(self.layers)
        self.kv: torch.Tensor | None = None
        self.in_kv = [False] * n
        self.kbuf: list[torch.Tensor | None] = [None] * n
        self.vbuf: list[torch.Tensor | None] = [None] * n
        self.slots: torch.Tensor | None = None
        self.kv_len = capacity  # update returns the first kv_len slots (every slot used is below it)
        self._promise = _kv_heads(config) if shared else None

    def _allocate(self, i: int, key: torch.Tensor, value: torch.Tensor) -> None:
        shape = (key.shape[0], key.shape[1], self.capacity, key.shape[3])
        same = key.shape == value.shape and key.dtype == value.dtype
        if self.kv is None and same and (key.shape[1], key.shape[3]) == self._promise:
            self.kv = _static(key.new_zeros((len(self.layers), 2) + shape))  # all layers, at the first one
        kv = self.kv
        if kv is not None and same and kv.shape[2:] == shape and (kv.dtype, kv.device) == (key.dtype, key.device):
            self.kbuf[i], self.vbuf[i] = _static(kv[i, 0]), _static(kv[i, 1])
            self.in_kv[i] = True
        else:  # its slice of `kv` (if any) stays unused
            self.kbuf[i] = _static(key.new_zeros(shape))
            self.vbuf[i] = _static(value.new_zeros(shape[:3] + value.shape[3:]))

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # key_states [1, nkv, T, d] -> views [1, nkv, kv_len, d] of the buffers after writing at `slots`
        if self.kbuf[layer_idx] is None:  # first (eager) call allocates; addresses never change after
            self._allocate(layer_idx, key_states, value_states)
        k, v = self.kbuf[layer_idx], self.vbuf[layer_idx]
        k.index_copy_(2, self.slots, key_states)
        v.index_copy_(2, self.slots, value_states)
        # views of the same storage: CUDA graphs keep their addresses
        return k[:, :, :self.kv_len], v[:, :, :self.kv_len]

    def get_seq_length(self, *args, **kwargs) -> int:
        return 0  # position ids and masks are always passed explicitly

    @torch.no_grad()
    def compact(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move the accepted tree nodes' entries (slots `src`) to their final slots `dst`."""
        if self.kv is not None:  # every shared layer's K and V at once
            self.kv.index_copy_(4, dst, self.kv.index_select(4, src))
        for k, v, shared in zip(self.kbuf, self.vbuf, self.in_kv):
            if k is not None and not shared:
                k.index_copy_(2, dst, k.index_select(2, src))
                v.index_copy_(2, dst, v.index_select(2, src))


def raise_recompile_limit(n: int = 64) -> None:
    """Each (runner/proposer instance, width, KV bucket) is its own graph, all from one code object;
    the default limit of 8 would silently send later ones back to eager."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), n))


def kv_buckets(capacity: int, min_bucket: int = 256) -> tuple[int, ...]:
    """Powers of two from min_bucket below capacity, then capacity itself: few static shapes, and a
    step attends over less than twice the slots it needs (or min_bucket). A power of two within 25 % of the
    capacity is left out: the capacity bucket costs at most 25 % more and saves a compile per step width."""
    out, b = [], min_bucket
    while b * 5 < capacity * 4:
        out.append(b)
        b *= 2
    return tuple(out) + (capacity,)


class TargetRunner:
    """Owns the target model, its SlotCache and the aux-state hooks; `step` is one forward."""

    def __init__(self, model: nn.Module, layout: Layout, aux_ids: list[int], capacity: int, min_bucket: int = 256):
        self.model, self.layout, self.aux_ids = model, layout, list(aux_ids)
        self.config = model.config
        self.device = layout.lm_head.weight.device
        self.dtype = layout.lm_head.weight.dtype
        self.capacity = capacity
        self.buckets = kv_buckets(capacity, min_bucket)
        params = inspect.signature(model.forward).parameters
        # transformers 5.17 calls it past_key_values, later 5.x releases `cache`.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._takes_cache_position = "cache_position" in params
        self._takes_logits_to_keep = "logits_to_keep" in params
        text = self.config.get_text_config(decoder=True) if hasattr(self.config, "get_text_config") else self.config
        types = list(getattr(text, "layer_types", None) or [])
        self._window = getattr(text, "sliding_window", None)
        self._mask_types = sorted(set(types)) if len(set(types)) > 1 else None
        # `causal` steps: only models on sdpa with one kind of layer (a sliding layer's mask is not causal)
        self._causal_ok = getattr(text, "_attn_implementation", None) in SDPA_LIKE and self._mask_types is None
        if self._causal_ok:
            _register(CAUSAL, causal_chunk_attention)
        self.cache = SlotCache(self.config, capacity)
        self._hooks = ExitStack()
        self._cap = self._hooks.enter_context(capture(layout, self.aux_ids, last=False))
        # EYAS_GROUPED_STEPS=1: the runner's sdpa layers attend grouped (`grouped_step_attention`) while it lives
        self.grouped = env.get("EYAS_GROUPED_STEPS") == "1" and getattr(text, "_attn_implementation", None) in SDPA_LIKE
        if self.grouped:
            self._hooks.enter_context(attention_implementation(model, GROUPED))
        self._compiled = None
        # prefills as CUDA graphs of padded chunks (decode/prefill.py); eager sessions turn it off
        self.graph_prefill = self.device.type == "cuda" and env.get("EYAS_PREFILL_GRAPHS") != "0"
        self.inner_step = self._step  # what the speculative decoder's own CUDA graphs capture
        self.inner_compiled = False

    def attached(self, kind: type):
        """The one `kind(self)` this runner keeps (its graphed AR, its graphed prefill): made on first ask."""
        made = self.__dict__.setdefault("_attached", {})
        if kind not in made:
            made[kind] = kind(self)
        return made[kind]

    def bucket(self, n: int) -> int:
        """The KV length a step whose slots are all < n attends over: the smallest bucket >= n."""
        if n > self.capacity:
            raise ValueError(f"{n} KV slots do not fit the capacity {self.capacity}")
        return self.buckets[bisect_left(self.buckets, n)]

    def _recompile_limit(self) -> None:
        # per runner: (AR step + a few tree widths) x buckets; calibration and sweeps add runners/widths
        raise_recompile_limit(max(64, 16 * len(self.buckets)))

    def compile_inner(self) -> None:
        """torch.compile `_step` without CUDA graphs (fused kernels); the decoder captures it itself."""
        self._recompile_limit()
        self.inner_step = torch.compile(self._step, dynamic=False)
        self.inner_compiled = True

    def close(self) -> None:
        self._hooks.close()

    def compile(self, mode: str = "reduce-overhead") -> None:
        """Compile `step` (static shapes per T and kv_len); prefill stays eager (HF's own advice for static caches)."""
        self._recompile_limit()
        self._compiled = torch.compile(self._step, mode=mode, fullgraph=False, dynamic=False)

    def _mask(self, positions, slots, ctx_len, anc, kv_len: int):
        # bool [T, kv_len]: committed context + this call's ancestors (incl. self)
        T = slots.shape[0]
        cols = torch.arange(kv_len, device=slots.device)
        extra = torch.zeros(T, kv_len, dtype=torch.bool, device=slots.device)
        extra.index_copy_(1, slots, anc)
        see = (cols[None, :] < ctx_len) | extra
        neg = torch.finfo(self.dtype).min
        full = torch.zeros(T, kv_len, dtype=self.dtype, device=slots.device).masked_fill(~see, neg)[None, None]
        if self._mask_types is None:
            return full
        # Key positions of each slot: context slots hold position == slot; tree slots carry their own.
        kpos = cols.clone()
        kpos.index_copy_(0, slots, positions)
        near = (positions[:, None] - kpos[None, :]) < int(self._window or self.capacity)
        slid = torch.zeros_like(full[0, 0]).masked_fill(~(see & near), neg)[None, None]
        return {t: (slid if "sliding" in t else full) for t in self._mask_types}

    def causal_from_start(self, width: int) -> bool:
        """Whether a chunk of `width` rows at slots 0.. (no context) may run as a `causal` step."""
        return self._causal_ok and (self._window is None or width <= self._window)

    def _step(self, tokens, positions, slots, ctx_len, anc, kv_len: int | None = None,
              keep: torch.Tensor | None = None, causal: bool = False):
        """causal: the rows sit at slots 0..T-1 with no context and see their predecessors (a turn's first
        prefill chunk, `causal_from_start`); attention then skips the mask (see `causal_chunk_attention`)."""
        kv_len = kv_len or self.capacity  # a static int: one specialization per bucket when compiled
        if causal:
            with attention_implementation(self.model, CAUSAL):
                return self._step(tokens, positions, slots, ctx_len, anc, kv_len, keep)
        self.cache.slots, self.cache.kv_len = slots, kv_len
        kw = {"input_ids": tokens[None], "position_ids": positions[None],
              "attention_mask": self._mask(positions, slots, ctx_len, anc, kv_len),
              self._cache_kw: self.cache, "use_cache": True}
        if self._takes_cache_position:
            kw["cache_position"] = slots
        logits = self.model(**kw, **self._keep(keep)).logits[0]
        if keep is not None and not self._takes_logits_to_keep:
            logits = logits.index_select(0, keep)
        return logits.float(), self._cap.aux[0]

    def _keep(self, keep: torch.Tensor | None) -> dict:
        # rows whose logits a prefill needs (an index tensor [r]): as an index, not the int 1, whose slice is a
        # strided view that sends the lm_head's matmul down its batched path, copying the whole [H, V] weight
        return {"logits_to_keep": keep} if keep is not None and self._takes_logits_to_keep else {}

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, ctx_len: torch.Tensor,
             anc: torch.Tensor, *, kv_len: int | None = None, eager: bool = False,
             last_only: bool = False, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens/positions/slots [T] long, ctx_len 0-d long, anc bool [T, T] (row i sees column j's slot);
        kv_len: attend over slots [0, kv_len) only (a `bucket`, above every slot used; default capacity).
        causal (eager only): see `_step`.
        Returns (logits [T, V] fp32 — [1, V], the last row's, with last_only (eager only) — aux [T, k, H]).
        Outputs of a compiled call are graph-owned: consume (or clone) them before the next call."""
        keep = torch.full((1,), tokens.shape[0] - 1, device=tokens.device) if last_only else None
        if eager or self._compiled is None:  # prefills: a new length per prompt (see varying_shape_attention)
            with varying_shape_attention():
                return self._step(tokens, positions, slots, ctx_len, anc, kv_len, keep, causal)
        torch.compiler.cudagraph_mark_step_begin()
        return self._compiled(tokens, positions, slots, ctx_len, anc, kv_len)
