"""Exact top-k over short-and-wide rows (the draft's vocabulary top-k inside the round graphs).

torch.topk runs one CUDA block per row (a radix select): ten rows of a 16k vocabulary are ten
blocks streaming 16k values each, about 85 us on an H200. Two stages spread the same work: a
top-k inside each chunk of the row (many short rows, many blocks), then a top-k over the chunk
winners. Exact by construction: each of the row's k largest is among its chunk's k largest.
"""

from __future__ import annotations

import math

import torch

WIDE = 4096  # rows narrower than this stay one torch.topk (one block is then already cheap)


def _chunk(width: int, k: int) -> int | None:
    """Chunk length for a two-stage top-k, or None for plain torch.topk. About sqrt(width * k)
    (a power of two) balances stage 1 (chunk long) against stage 2 (width / chunk * k long)."""
    if width < WIDE:
        return None
    chunk = 1 << round(math.log2(math.sqrt(width * k)))
    return chunk if 4 * k <= chunk <= width // 2 else None


def topk_rows(x: torch.Tensor, k: int, *, sorted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(x, k, dim=-1, sorted=sorted): the same values exactly, and the same indices except
    among equal values. Static shapes, no host reads: traceable and CUDA-graph capturable."""
    width = x.shape[-1]
    if k == 1:  # a reduction, no selection kernel at all
        return x.max(dim=-1, keepdim=True)
    chunk = _chunk(width, k)
    if chunk is None:
        return x.topk(k, dim=-1, sorted=sorted)
    lead, rows = x.shape[:-1], x.reshape(-1, width)
    n = width // chunk
    val, idx = rows[:, :n * chunk].view(-1, n, chunk).topk(k, dim=-1, sorted=False)      # [R, n, k] per chunk
    val, idx = val.flatten(1), idx.flatten(1)
    if n * chunk < width:  # the tail (shorter than a chunk) joins the candidates as it is: no padding
        val = torch.cat([val, rows[:, n * chunk:]], dim=1)
        idx = torch.cat([idx, torch.arange(width - n * chunk, device=x.device).expand(rows.shape[0], -1)], dim=1)
    top, pick = val.topk(k, dim=-1, sorted=sorted)
    # candidate j is chunk j // k's (the tail counts as chunk n): offsets after the gather, one fused kernel
    idx = idx.gather(1, pick) + (pick // k).clamp(max=n) * chunk
    return top.view(*lead, k), idx.view(*lead, k)
