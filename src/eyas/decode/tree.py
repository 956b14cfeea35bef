"""Draft trees, tree specs, and acceptance (greedy walk and recursive rejection sampling).

A tree holds N drafted nodes; verification index 0 is the root (the last committed token, whose
target logits judge the first level) and node i is verification index i + 1. Nodes are ordered so
that every parent precedes its children.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeSpec:
    """EAGLE-2 dynamic tree: `depth` draft levels, `topk` expansion per level, `total` kept nodes.
    A chain of K is TreeSpec(total=K, depth=K, topk=1)."""
    total: int
    depth: int
    topk: int

    def __post_init__(self):
        if min(self.total, self.depth, self.topk) < 1:
            raise ValueError(f"tree {self}: total, depth and topk must all be >= 1")
        most = self.topk + (self.depth - 1) * self.topk * self.topk
        if self.total > most:
            raise ValueError(f"tree {self}: total={self.total} exceeds the {most} candidates that depth={self.depth}, "
                             f"topk={self.topk} can produce")

    @classmethod
    def chain(cls, k: int) -> "TreeSpec":
        return cls(total=k, depth=k, topk=1)

    @classmethod
    def parse(cls, text: str) -> "TreeSpec":
        """'total=60,depth=7,topk=10' (any order; all three keys required)."""
        got = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = re.fullmatch(r"(total|depth|topk)\s*=\s*(\d+)", part)
            if not m:
                raise ValueError(f"--tree {text!r}: cannot read {part!r}; expected e.g. total=60,depth=7,topk=10")
            got[m.group(1)] = int(m.group(2))
        missing = {"total", "depth", "topk"} - set(got)
        if missing:
            raise ValueError(f"--tree {text!r}: missing {sorted(missing)} (format total=60,depth=7,topk=10)")
        return cls(**got)

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    def label(self) -> str:
        return f"chain-{self.depth}" if self.is_chain else f"tree(total={self.total},depth={self.depth},topk={self.topk})"


@dataclass
class Tree:
    tokens: list[int]        # [N] target-vocab ids
    parents: list[int]       # [N] parent node index, -1 = root
    scores: list[float] | None = None  # cumulative draft log-prob per node (cost-model calibration)

    def __post_init__(self):
        self.depths = []
        self.children: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]  # by verification index
        for i, p in enumerate(self.parents):
            if p >= i:
                raise ValueError(f"tree node {i} has parent {p}: parents must precede children")
            self.depths.append(1 if p < 0 else self.depths[p] + 1)
            self.children[p + 1].append(i + 1)

    def __len__(self) -> int:
        return len(self.tokens)

    def ancestors(self) -> torch.Tensor:
        """bool [N+1, N+1]: row i sees column j iff j is i or an ancestor of i (verification indices)."""
        n = len(self.tokens) + 1
        anc = torch.zeros(n, n, dtype=torch.bool)
        anc[0, 0] = True
        for i, p in enumerate(self.parents):
            anc[i + 1] = anc[p + 1]
            anc[i + 1, i + 1] = True
        return anc


def greedy_accept(tree: Tree, root_token: int, argmax: list[int]) -> tuple[list[int], int]:
    """Longest path whose every token equals the target's argmax at its parent.
    argmax [N+1] per verification index. Returns (accepted verification indices, bonus token)."""
    tokens = [root_token] + tree.tokens
    cur, path = 0, []
    while True:
        nxt = next((c for c in tree.children[cur] if tokens[c] == argmax[cur]), None)
        if nxt is None:
            return path, argmax[cur]
        path.append(nxt)
        cur = nxt


def sample_accept(tree: Tree, probs, generator: torch.Generator, *, residual: bool = True) -> tuple[list[int], int]:
    """Recursive rejection sampling over the tree (SpecInfer / EAGLE), lossless in distribution.

    `probs(i)` -> target distribution (1-D float64 CPU tensor) at verification index i. The draft's
    candidates are its deterministic top-k, i.e. point-mass proposals, so child c with token x is
    accepted with probability p(x) / 1; on rejection p <- normalise(max(p - delta_x, 0)) = p with x
    zeroed. If every child is rejected the bonus token is drawn from that residual.
    `residual=False` is the deliberately broken rule (redraw from the unmodified p) the tests use
    to show the statistical check has power.
    """
    cur, path = 0, []
    while True:
        p = probs(cur).clone()
        p_orig = p.clone()
        moved = False
        for c in tree.children[cur]:
            x = tree.tokens[c - 1]
            u = torch.rand((), generator=generator, dtype=torch.float64).item()
            if u < p[x].item():
                path.append(c)
                cur, moved = c, True
                break
            if residual:
                p[x] = 0.0
                s = p.sum()
                if s <= 0:  # numerically exhausted: nothing left to draw from but what was rejected
                    p = p_orig
                    break
                p = p / s
        if not moved:
            dist = p if residual else p_orig
            return path, int(torch.multinomial(dist.float(), 1, generator=generator).item())


# ---- the same tree logic as static-shape tensor code (runs inside the decoder's CUDA graphs) ----

def keep_best(scores: list[torch.Tensor], tokens: list[torch.Tensor], parents: list[torch.Tensor], total: int):
    """EAGLE-2's selection over every drafted candidate (per level: cumulative scores, target ids, parents as
    global candidate indices, -1 = root): the `total` best by score. A stable sort lets a parent (smaller index)
    win a tie, keeping the kept set ancestor-closed. Returns int64 [3, total] (global index, token, parent global
    index) and the kept scores [total], ordered by global index."""
    all_scores = torch.cat(scores)
    order = torch.sort(all_scores, descending=True, stable=True).indices[:total]
    sel = torch.sort(order).values
    return torch.stack([sel, torch.cat(tokens)[sel], torch.cat(parents)[sel]]), all_scores[sel]


def selection_tensors(ints: torch.Tensor, sc: torch.Tensor):
    """keep_best's output as the decoder's tree buffers: tokens [N], parents [N] (node indices, -1 root), valid
    [N] (False: an orphan on an exact tie), scores [N]; parents precede children."""
    sel, tok, par = ints
    N = sel.shape[0]
    loc = torch.searchsorted(sel, par.clamp(min=0)).clamp(max=N - 1)
    root = par < 0
    valid = root | (sel[loc] == par)
    return tok, torch.where(root, -1, loc), valid, sc


def selection_tree(ints: torch.Tensor, sc: torch.Tensor) -> Tree:
    """keep_best's output as a host Tree, orphans (only possible on exact ties) dropped."""
    (sel_l, tok_l, par_l), sc_l = ints.tolist(), sc.tolist()
    keep_tok, keep_par, keep_sc, remap = [], [], [], {}
    for g, t, pg, s in zip(sel_l, tok_l, par_l, sc_l):
        if pg >= 0 and pg not in remap:
            continue  # parent not kept (only possible on exact ties): drop the orphan
        remap[g] = len(keep_tok)
        keep_tok.append(t)
        keep_par.append(-1 if pg < 0 else remap[pg])
        keep_sc.append(s)
    return Tree(keep_tok, keep_par, keep_sc)


def tree_masks(parents: torch.Tensor, valid: torch.Tensor, depth: int):
    """parents long [N] (-1 = root, else an earlier node), valid bool [N] (False = a pad/orphan row).
    Returns (pv long [W], anc bool [W, W], dep long [W], valid_v bool [W]) over W = N+1 verification
    rows: pv = parent row (root and invalid rows: themselves), anc = row sees column (itself and its
    ancestors; invalid rows see only themselves), dep = depth (root and invalid rows 0).
    `depth` iterations of anc = eye | anc[pv] reach every ancestor: no host loop over nodes."""
    N, dev = parents.shape[0], parents.device
    has_par = parents >= 0
    par0 = parents.clamp(min=0)
    for _ in range(depth):  # a node is real only if its whole ancestry is (orphans on exact score ties)
        valid = valid & (~has_par | valid[par0])
    rows = torch.arange(1, N + 1, device=dev)
    pv = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), torch.where(valid, parents + 1, rows)])
    eye = torch.eye(N + 1, dtype=torch.bool, device=dev)
    anc = eye
    for _ in range(depth):
        anc = eye | anc[pv]
    valid_v = torch.cat([torch.ones(1, dtype=torch.bool, device=dev), valid])
    return pv, anc, anc.sum(-1) - 1, valid_v


def accept_path(tok_v: torch.Tensor, pv: torch.Tensor, anc: torch.Tensor, dep: torch.Tensor, valid_v: torch.Tensor,
                target: torch.Tensor, depth: int, bonus_from: torch.Tensor | None = None):
    """The deepest row whose every ancestor's token equals `target` at its parent row.

    tok_v [W] (row 0 = root token), target long [W]: the target's token per row — its argmax (greedy:
    the same walk as `greedy_accept`) or one sample from its distribution (T > 0: with point-mass
    proposals, 'accept child c with p(x_c), else zero x_c and renormalise' selects child c exactly
    when a sample y ~ p equals x_c, and the bonus drawn from the residual is that same y, so the walk
    below *is* recursive rejection sampling, one sample per row). `bonus_from` replaces target for
    the bonus only (the deliberately broken rule of the tests). Returns (n_acc 0-d long,
    keep long [depth+1]: the accepted rows by depth, row 0 first, pads repeat row 0,
    emitted long [depth+1]: the accepted tokens then the bonus, pads repeat the bonus)."""
    match = valid_v & (tok_v == target[pv])
    match[0] = True
    good = ~(anc & ~match[None, :]).any(-1)
    # [1]-shaped picks with index_select: indexing by a 0-d tensor may read it on the host (a sync)
    best = torch.where(good, dep, -1).argmax(0, keepdim=True)
    n_acc = dep.index_select(0, best)
    lvl = torch.arange(depth + 1, device=tok_v.device)
    on = anc.index_select(0, best) & (dep[None, :] == lvl[:, None])        # [depth+1, W]
    keep = on.long().argmax(-1)                                            # row at each depth (0 past n_acc)
    bonus = (target if bonus_from is None else bonus_from).index_select(0, best)
    nxt = torch.cat([tok_v.index_select(0, keep[1:]), tok_v[:1]])
    emitted = torch.where(lvl < n_acc, nxt, bonus)
    return n_acc.reshape(()), keep, emitted


def sample_rows(logits: torch.Tensor, temperature: float, noise: torch.Tensor) -> torch.Tensor:
    """One sample per row from softmax(logits / T) with exponential noise E (argmax p / E is a sample;
    gpt-fast's trick): no multinomial, no host sync, CUDA-graph safe. noise [W, V] ~ Exp(1)."""
    p = torch.softmax(logits / temperature, dim=-1)
    return (p / noise).argmax(-1)
