"""FlexAttention for the native generator's one-token decode step: each row's work follows its own length.

The SDPA decode step attends every row over all L cache columns (the additive mask only zeroes the tail), so a
batch whose rows average ~350 tokens in a 1024-column cache pays for 1024. Here the step runs
`flex_attention` with a BlockMask over KV blocks: row b visits ceil((pos[b] + 1) / block) blocks, those
entirely below pos[b] as "full" blocks (no mask evaluated) and the block holding pos[b] as the one partial
block, where mask_mod `kv <= pos[b]` applies.

CUDA graphs: `DecodeBlockMask` owns persistent tensors (kv_num_blocks, kv_indices, full counts/indices) and one
BlockMask object built on them; `refresh()` rewrites their contents in place from the generator's device `pos`
inside the decode step, so a captured step replays with the right blocks, no host read, no new addresses.

Layout: the g query heads of each KV head run as g query rows of one KV head (q [B, H, 1, d] -> [B, Hkv, g, d]),
as in `grouped_decode_attention`. flex_attention then sees Hq == Hkv: inductor's decode kernel (query length
< 128) takes it for any g, whereas with enable_gqa it needs g a power of two (SmolLM2-135M has g = 3) and
otherwise falls back to the prefill kernel, or fails in some torch versions. mask_mod ignores the query index,
so the packed rows see what their heads would.

Block size (KV): 128 where it divides L, else 64 where it does (NativeBackend's L is a multiple of 64), else 128
with a short last block: full blocks lie below pos[b] < L and the partial block is masked by mask_mod, so the
tail past L is never read as full. The Q block is 128 (flex's default): one Q block holds the g query rows.

On CUDA the call is `torch.compile(flex_attention)` (one compiled function per process, created on first use;
eager flex materialises the full score matrix and ignores the block tables, a slow reference). On CPU it runs
eager (correct, slow). Inside an already-compiled step (graph="compile") plain flex_attention is traced.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from eyas.data.attention import DELEGATED_KWARGS, attention_implementation, grouped_decode_attention

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # pragma: no cover - torch < 2.5
    BlockMask, flex_attention = None, None

NAME = "eyas_flex_decode"
Q_BLOCK = 128
_compiled = None   # torch.compile(flex_attention), created on the first CUDA call
_active: DecodeBlockMask | None = None  # the generator's mask during its decode forwards (`flex_decode`)


def kv_block_size(capacity: int) -> int:
    """128 where it divides the cache length, else 64 where it does, else 128 (a short last block)."""
    return 64 if capacity % 128 and not capacity % 64 else 128


class DecodeBlockMask:
    """BlockMasks for one-token steps over a [B, L] cache, rows b seeing columns <= pos[b].

    The tensors are allocated once; `refresh()` (inside the decode step) rewrites them from `pos`:
      kv_num_blocks [B, 1, 1] = 1, kv_indices[..., 0] = pos // block  (the partial block holding pos)
      full_kv_num_blocks [B, 1, 1] = pos // block, full_kv_indices = 0, 1, 2, ... (blocks below it)
    `block_mask(q_len)` gives the BlockMask over these tensors for q_len query rows (one per KV group size).
    """

    def __init__(self, pos: torch.Tensor, capacity: int, block: int | None = None):
        if BlockMask is None:
            raise RuntimeError("decode_attention='flex' needs torch >= 2.5 (FlexAttention)")
        self.pos, self.L = pos, capacity
        self.B, self.block = pos.shape[0], block or kv_block_size(capacity)
        n, dev, i32 = -(-capacity // self.block), pos.device, torch.int32
        self.kv_num_blocks = torch.ones(self.B, 1, 1, dtype=i32, device=dev)
        self.kv_indices = torch.zeros(self.B, 1, 1, n, dtype=i32, device=dev)
        self.full_kv_num_blocks = torch.zeros(self.B, 1, 1, dtype=i32, device=dev)
        # the full blocks of row b are 0 .. pos[b] // block - 1: a constant list, only its count changes
        self.full_kv_indices = torch.arange(n, dtype=i32, device=dev).expand(self.B, 1, 1, n).contiguous()
        self.kv_indices[..., 1:] = torch.arange(1, n, dtype=i32, device=dev)  # unused slots: a valid order
        self._masks: dict[int, BlockMask] = {}
        self.refresh()

        def mask_mod(b, h, q_idx, kv_idx):  # a closure, not a method: compiled code guards on pos, not on self
            return kv_idx <= pos[b]

        self.mask_mod = mask_mod

    def refresh(self) -> None:
        """The block tables from the current `pos`, written in place (part of the captured decode step)."""
        cur = (self.pos // self.block).to(torch.int32).view(self.B, 1, 1)
        self.kv_indices[..., 0].copy_(cur)
        self.full_kv_num_blocks.copy_(cur)

    def block_mask(self, q_len: int) -> BlockMask:
        """The BlockMask for q_len query rows, built once on the persistent tensors (mask_mod bound to pos).
        Its q-side tables (backward only) are derived once here and not kept current: inference only."""
        if q_len not in self._masks:
            self._masks[q_len] = BlockMask.from_kv_blocks(
                self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks, self.full_kv_indices,
                BLOCK_SIZE=(Q_BLOCK, self.block), mask_mod=self.mask_mod, seq_lengths=(q_len, self.L))
        return self._masks[q_len]

    def tensors(self) -> list[torch.Tensor]:
        return [self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks, self.full_kv_indices]


def _flex(device: torch.device):
    global _compiled
    if device.type != "cuda" or torch.compiler.is_compiling():
        return flex_attention
    if _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


def flex_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          **kwargs) -> tuple[torch.Tensor, None]:
    """sdpa's contract (returns [B, T, H, dv], None). A one-token step over the active generator's cache runs
    flex with its BlockMask (the additive mask is not read: the BlockMask says the same); anything else goes
    to `grouped_decode_attention`, which passes what it cannot do on to transformers' sdpa. So do heads under
    16 wide: flex's Triton kernels need head_dim >= 16."""
    m = _active
    B, H, T, d = query.shape
    Hkv = key.shape[1]
    if (m is None or T != 1 or dropout or H % Hkv or d < 16 or B != m.B or key.shape[0] != B or key.shape[2] != m.L
            or any(kwargs.get(k) is not None for k in DELEGATED_KWARGS + ("sliding_window",))):
        return grouped_decode_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
    g = H // Hkv
    q = query.reshape(B, Hkv, g, d)  # head h = kv * g + j, as in repeat_kv
    out = _flex(query.device)(q, key, value, block_mask=m.block_mask(g), scale=scaling)
    return out.reshape(B, H, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, flex_decode_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # masks built by the model itself: as for sdpa


@contextmanager
def flex_decode(model, mask: DecodeBlockMask) -> Iterator[None]:
    """Within: the model's "sdpa" configs use `flex_decode_attention` with `mask`; afterwards all is as before."""
    global _active
    before, _active = _active, mask
    try:
        with attention_implementation(model, NAME):
            yield
    finally:
        _active = before
