"""TTT attention masks: step k's T queries against (k+1)·T keys (the past steps' K/V concatenated).

Keys [0, T) are step 0's: query q sees s <= q of its own document. Keys [jT, (j+1)T) for j = 1..k are step j's:
query q sees only its own key jT + q (the chain's earlier drafted tokens at q).

One mask, three forms:
  ttt_dense_mask            bool [B, 1, T, (k+1)T]; the dense attention path (CPU, tests)
  TTTBlockMasks             FlexAttention BlockMasks built on the block grid from the document layout, one
                            analysis shared by the K steps; the training path
  ttt_block_mask_reference  create_block_mask over the token grid; what TTTBlockMasks is tested against
"""

from __future__ import annotations

import torch

try:
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask
except ImportError:  # pragma: no cover - torch < 2.5
    BlockMask, create_block_mask = None, None


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] -> [B, T] int ids, non-decreasing along a row; a new document starts wherever the position id
    does not continue."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return torch.cumsum(starts.long(), dim=1)


def ttt_dense_mask(doc: torch.Tensor, k: int) -> torch.Tensor:
    """bool [B, 1, T, (k+1)T], True = attend. Key blocks: step 0 (document-causal), steps 1..k (diagonal)."""
    B, T = doc.shape
    causal = torch.ones(T, T, dtype=torch.bool, device=doc.device).tril()
    prefix = (doc[:, :, None] == doc[:, None, :]) & causal          # [B, T, T]
    eye = torch.eye(T, dtype=torch.bool, device=doc.device).expand(B, T, T)
    return torch.cat([prefix] + [eye] * k, dim=-1)[:, None]


def ttt_mask_mod(doc: torch.Tensor):
    """The mask as a FlexAttention mask_mod (any step: the step is kv // T)."""
    T = doc.shape[1]

    def mask_mod(b, h, q, kv):
        step, s = kv // T, kv % T
        prefix = (doc[b, s] == doc[b, q]) & (s <= q)
        return torch.where(step == 0, prefix, s == q)
    return mask_mod


def ttt_block_mask_reference(doc: torch.Tensor, k: int, block_size: int = 128, compile_mask: bool | None = None):
    """Step k's BlockMask by create_block_mask, which evaluates mask_mod on every (query, key) pair."""
    if create_block_mask is None:
        raise RuntimeError("FlexAttention needs torch >= 2.5; use attention='dense'")
    B, T = doc.shape
    # Eagerly, create_block_mask evaluates mask_mod on the whole [T, (k+1)T] grid with int64 temporaries
    # (16k tokens, k=6: ~15 GB each); compiled, it never materialises the grid. Short rows stay eager (no compile).
    big = T * (k + 1) * T > 2 ** 28 if compile_mask is None else compile_mask
    return create_block_mask(ttt_mask_mod(doc), B, None, T, (k + 1) * T, device=doc.device, BLOCK_SIZE=block_size,
                             _compile=big)


class TTTBlockMasks:
    """Step k's BlockMask (`masks(k)`), built on the block grid: [B, nQ, nKV] tiles of block_size² pairs, no
    token-grid tensor, and the document analysis done once for all K steps of an optimizer step.

    doc must be non-decreasing along each row (document_ids is a cumsum), so the documents a block touches run
    from its first token's id to its last's. For query block i and key block c:
      step-0 keys (c < nQ): c > i empty; c == i partial (q sees q, not q+1); c < i non-empty iff the key block's
        last doc is the query block's first, full iff the key block's first doc is the query block's last and
        the query block lies inside the row (a block with positions >= T is never full, as in create_block_mask)
      step j >= 1: query block i meets keys jT + [i·bs, min((i+1)·bs, T)): one or two key blocks (two when T is
        not a multiple of bs), always partial (one key per query)
    Equal to create_block_mask's classification, tested in tests/train/test_ttt_masks.py.
    """

    def __init__(self, doc: torch.Tensor, block_size: int = 128):
        if BlockMask is None:
            raise RuntimeError("FlexAttention needs torch >= 2.5; use attention='dense'")
        if block_size < 2:
            raise ValueError(f"block_size must be >= 2 (a diagonal block is then never full), got {block_size}")
        self.B, self.T = doc.shape
        self.bs, self.nQ = block_size, -(-self.T // block_size)
        self.mask_mod = ttt_mask_mod(doc)
        dev = doc.device
        self.starts = torch.arange(self.nQ, device=dev) * block_size                # first token of each block
        self.ends = (self.starts + block_size).clamp(max=self.T) - 1                # last token inside the row
        first, last = doc[:, self.starts], doc[:, self.ends]                         # [B, nQ]
        i = torch.arange(self.nQ, device=dev)[:, None]
        c = torch.arange(self.nQ, device=dev)[None, :]
        # [B, nQ (query block i), nQ (key block c)]
        self.any0 = (c == i) | ((c < i) & (last[:, None, :] == first[:, :, None]))
        inside = (self.starts + block_size <= self.T)[:, None]
        self.full0 = (c < i) & inside & (first[:, None, :] == last[:, :, None])

    def __call__(self, k: int):
        B, T, bs, nQ = self.B, self.T, self.bs, self.nQ
        nKV = -(-(k + 1) * T // bs)
        blocks = self.any0.new_zeros(B, nQ, nKV)
        full = self.any0.new_zeros(B, nQ, nKV)
        blocks[..., :nQ] = self.any0
        full[..., :nQ] = self.full0
        if k:
            j = torch.arange(1, k + 1, device=self.starts.device)[:, None] * T     # [k, 1] step j's key offset
            rows = torch.arange(nQ, device=j.device).expand(k, nQ)
            blocks[:, rows, (j + self.starts) // bs] = True
            blocks[:, rows, (j + self.ends) // bs] = True
        kv_num, kv_idx = _ordered(blocks & ~full)
        full_num, full_idx = _ordered(full)
        return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=bs, mask_mod=self.mask_mod,
                                        seq_lengths=(T, (k + 1) * T))


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [B, nQ, nKV] -> (num_blocks [B, 1, nQ], indices [B, 1, nQ, nKV]) int32, the listed blocks first in
    ascending order: the layout create_block_mask produces."""
    x = blocks[:, None].to(torch.int32)
    return x.sum(-1).to(torch.int32), torch.argsort(x, dim=-1, descending=True, stable=True).to(torch.int32)



def block_mask_of(mask_mod, B: int, q_len: int, kv_len: int, device, block_size: int = 128):
    """A BlockMask for a mask_mod (the parallel drafters' training masks): create_block_mask, compiled on a GPU
    (static shapes: one compile serves every step) or once the token grid is so big that eager evaluation would
    materialise it (as in ttt_block_mask_reference)."""
    if create_block_mask is None:
        raise RuntimeError("FlexAttention needs torch >= 2.5; use attention='dense'")
    return create_block_mask(mask_mod, B, None, q_len, kv_len, device=device, BLOCK_SIZE=block_size,
                             _compile=torch.device(device).type == "cuda" or q_len * kv_len > 2 ** 28)
