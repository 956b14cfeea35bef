"""Proposers for drafters that draft every depth in one forward (P-EAGLE, DFlash: eyas.draft.kinds).

One draft forward per round gives a distribution for each depth j = 1..D (the j-th token after the tree's root,
the last committed token). None of them can condition on what a shallower depth drafted, so the tree is the
EAGLE-2 beam over per-depth top-k lists: a kept level-j node's children are depth j+1's top-k, scored by the
sum of log-probs along the path, and keep_best keeps the `total` best (decode/tree.py). A chain is topk = 1.
Verification, acceptance and KV compaction are decode/speculative.py's, unchanged.

Protocol (as EagleProposer's): `observe(seq, aux, start)` (prefill and the host path), `catchup(aux, toks,
start, m)` + `draft_tree(L, seq)` (the static-buffer path, CUDA-graph safe), `propose() -> Tree` (host path).
A subclass supplies `_catchup` (tensors only; rows >= m are padding), `_observe` (eager, any m) and
`_levels(L, seq) -> (log-probs [D, k], target ids [D, k])`.
"""

from __future__ import annotations

import torch

from eyas.decode.target_step import raise_recompile_limit
from eyas.decode.topk import topk_rows
from eyas.decode.tree import Tree, TreeSpec, keep_best, selection_tensors, selection_tree


def level_beam(lp: torch.Tensor, ids: torch.Tensor, total: int):
    """The tree from per-depth top-k: lp/ids [D, k] -> keep_best's (ints [3, total], scores [total])."""
    D, k = lp.shape
    dev = lp.device
    scores, tokens, parents = [lp[0]], [ids[0]], [torch.full((k,), -1, device=dev, dtype=torch.long)]
    f_score, f_gidx, base = lp[0], torch.arange(k, device=dev), k
    for lvl in range(1, D):
        cum = (f_score[:, None] + lp[lvl][None, :]).flatten()                  # [k*k]: frontier x depth's top-k
        scores.append(cum)
        tokens.append(ids[lvl].repeat(k))
        parents.append(f_gidx.repeat_interleave(k))
        top = topk_rows(cum, k)[1]                                             # the next frontier
        f_score, f_gidx = cum[top], base + top
        base += k * k
    return keep_best(scores, tokens, parents, total)


class ParallelProposer:
    def __init__(self, draft, spec: TreeSpec, capacity: int, rows: int):
        """rows: scratch KV slots one draft forward writes beyond the committed ones (its mask rows)."""
        self.draft, self.spec, self.capacity = draft, spec, capacity
        cfg = draft.config
        w = draft.lm_head.weight
        self.device, self.dtype = w.device, w.dtype
        self.pad = spec.depth + 1                     # catch-up rows per round (accepted + bonus), padded
        self.junk = capacity                          # [capacity, capacity+pad): slots for pad rows
        self.scratch = capacity + self.pad            # [scratch, scratch+rows): this round's mask rows
        self.size = self.scratch + rows
        self.caches = []
        for _ in range(cfg.num_layers):
            k = torch.zeros(1, cfg.num_key_value_heads, self.size, cfg.head_dim, device=self.device, dtype=self.dtype)
            v = torch.zeros_like(k)
            torch._dynamo.mark_static_address(k)
            torch._dynamo.mark_static_address(v)
            self.caches.append((k, v))
        self.cols = torch.arange(self.size, device=self.device)
        self._tree_fn, self._catchup_fn = self._tree, self._catchup
        self._compiled_tree = None
        self.seq: list[int] = []

    def compile(self, mode: str = "reduce-overhead") -> None:
        raise_recompile_limit()
        self._compiled_tree = torch.compile(self._tree, mode=mode, fullgraph=False, dynamic=False)

    def compile_inner(self) -> None:
        """Compile (no CUDA graphs of its own) what the static-buffer path runs, for the decoder's graphs."""
        raise_recompile_limit()
        self._tree_fn = torch.compile(self._tree, dynamic=False)
        self._catchup_fn = torch.compile(self._catchup, dynamic=False)

    @torch.no_grad()
    def catchup(self, aux, toks, start, m) -> None:
        self._catchup_fn(aux, toks, start, m)

    @torch.no_grad()
    def draft_tree(self, L: torch.Tensor, seq: torch.Tensor):
        """The next tree with L (0-d) tokens committed in seq: tokens, parents, valid, scores [spec.total]."""
        return selection_tensors(*self._tree_fn(L, seq))

    def _tree(self, L, seq):
        lp, ids = self._levels(L, seq)
        return level_beam(lp, ids, self.spec.total)

    def _topk(self, pre: torch.Tensor):
        """pre [D, H] -> top-k log-probs [D, k] and their target ids."""
        logp = torch.log_softmax(self.draft.logits(pre).float(), dim=-1)
        top, ids = topk_rows(logp, self.spec.topk)
        return top, self.draft.to_target_ids(ids)

    @torch.no_grad()
    def observe(self, seq: list[int], aux: torch.Tensor, start: int) -> None:
        m = aux.shape[0]
        if start + m > self.capacity:
            raise ValueError(f"draft KV capacity {self.capacity} exceeded at position {start + m}")
        self.seq = list(seq)
        toks = torch.tensor(seq[start + 1:start + 1 + m], device=self.device)
        self._observe(aux.to(self.device), toks, start, m)

    @torch.no_grad()
    def propose(self) -> Tree:
        L = len(self.seq)
        seq = torch.tensor(self.seq + [0] * (self.pad + 1), device=self.device)
        args = (torch.tensor(L, device=self.device), seq)
        if self._compiled_tree is None:
            ints, sc = self._tree(*args)
        else:
            torch.compiler.cudagraph_mark_step_begin()
            ints, sc = self._compiled_tree(*args)
        return selection_tree(ints, sc)
