"""The draft vocabulary: the most frequent target tokens over loss-masked positions.

vLLM and speculators read `d2t` as int64 offsets (target_id = draft_id + d2t[draft_id]) and `t2d` as a bool
mask over the target vocabulary. The offsets assume draft ids are the selected target ids in ascending order,
so selection is by frequency but numbering is by target id.
"""

from __future__ import annotations

import torch


def build_draft_vocab(freq: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(d2t int64 [Vd], t2d bool [V], coverage) for the top-`size` tokens of `freq` [V] (size capped at V).

    Ties (including never-seen tokens, which fill the vocabulary when fewer than `size` tokens occur) go to
    the lower target id, so the result is deterministic. coverage = share of counted tokens inside the draft
    vocabulary (0.0 when nothing was counted).
    """
    freq = torch.as_tensor(freq).to(torch.int64).flatten()
    V = freq.numel()
    if V == 0:
        raise ValueError("build_draft_vocab: empty frequency table")
    if size < 1:
        raise ValueError(f"build_draft_vocab: draft vocabulary size must be >= 1, got {size}")
    size = min(int(size), V)
    # stable sort on the negated counts: highest frequency first, lower id first among equals
    order = torch.sort(-freq, stable=True).indices[:size]
    chosen = torch.sort(order).values
    d2t = chosen - torch.arange(size, dtype=torch.int64)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[chosen] = True
    total = int(freq.sum())
    coverage = float(freq[chosen].sum()) / total if total else 0.0
    return d2t, t2d, coverage


def check_draft_vocab(d2t: torch.Tensor, t2d: torch.Tensor) -> list[str]:
    """Problems with a (d2t, t2d) pair as vLLM would read it; empty when consistent."""
    problems = []
    if d2t.dtype != torch.int64:
        problems.append(f"d2t dtype is {d2t.dtype}, expected int64")
    if t2d.dtype != torch.bool:
        problems.append(f"t2d dtype is {t2d.dtype}, expected bool")
    target = d2t + torch.arange(d2t.numel(), dtype=d2t.dtype)
    if d2t.numel() and (target.min() < 0 or target.max() >= t2d.numel()):
        problems.append("d2t maps a draft id outside the target vocabulary")
        return problems
    if int(t2d.sum()) != d2t.numel():
        problems.append(f"t2d marks {int(t2d.sum())} tokens but d2t has {d2t.numel()}")
    elif not bool(t2d[target].all()):
        problems.append("d2t and t2d disagree on which target ids are in the draft vocabulary")
    if d2t.numel() > 1 and not bool((target[1:] > target[:-1]).all()):
        problems.append("draft ids are not in ascending target-id order")
    return problems
