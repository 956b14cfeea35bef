"""P-EAGLE's proposer: each round is ONE draft forward over the accepted rows (their KV, committed) followed
by D-1 mask rows, as vLLM's parallel-drafting EAGLE proposer runs it. The bonus row (the last accepted row:
h of the last verified position, token = the bonus) gives depth 1, mask row j depth j+1.

catchup() only stores the round's accepted rows (static buffers); draft_tree() runs the forward, so both the
catch-up and the drafting happen in that one pass. Prefill (observe with more rows than a round has) writes the
prompt's KV eagerly and keeps its last row for the first forward.
"""

from __future__ import annotations

import torch

from eyas.decode.parallel import ParallelProposer
from eyas.decode.tree import TreeSpec


class PEagleProposer(ParallelProposer):
    def __init__(self, draft, spec: TreeSpec, capacity: int):
        super().__init__(draft, spec, capacity, rows=max(1, spec.depth - 1))
        cfg = draft.config
        # the pending accepted rows (written by catchup, consumed by the next draft forward)
        self.p_aux = torch.zeros(self.pad, cfg.num_aux, cfg.target_hidden_size, device=self.device, dtype=self.dtype)
        self.p_tok = torch.zeros(self.pad, dtype=torch.long, device=self.device)
        self.p_start = torch.zeros((), dtype=torch.long, device=self.device)
        self.p_m = torch.zeros((), dtype=torch.long, device=self.device)

    def _catchup(self, aux, toks, start, m):
        self.p_aux.copy_(aux)
        self.p_tok.copy_(toks)
        self.p_start.copy_(start)
        self.p_m.copy_(m)

    def _observe(self, aux, toks, start: int, m: int) -> None:
        if m > self.pad:  # prefill: all rows but the last now (their KV only), the last one pending
            self._forward(aux[:m - 1], toks[:m - 1], torch.tensor(start, device=self.device),
                          torch.tensor(m - 1, device=self.device), masks=0)
            aux, toks, start, m = aux[m - 1:], toks[m - 1:], start + m - 1, 1
        rows = self.pad - m
        aux = torch.cat([aux.to(self.dtype), aux.new_zeros((rows,) + tuple(aux.shape[1:])).to(self.dtype)])
        toks = torch.cat([toks, toks.new_zeros(rows)])
        self._catchup(aux, toks, torch.tensor(start, device=self.device), torch.tensor(m, device=self.device))

    def _forward(self, aux, toks, start, m, masks: int) -> torch.Tensor:
        """One causal forward: accepted rows aux [R, k, Ht] / toks [R] at positions start.. (rows >= m padding)
        then `masks` mask rows after the last real one. Returns pre-norm hidden [R + masks, H]."""
        draft, dev = self.draft, self.device
        R = toks.shape[0]
        ar = torch.arange(R, device=dev)
        real = ar < m
        mk = torch.arange(masks, device=dev)
        write = torch.cat([torch.where(real, start + ar, self.junk + ar), self.scratch + mk])
        pos = torch.cat([start + ar, start + m + mk])                 # mask row j sits j+1 after the last real row
        hidden = torch.cat([draft.combine(aux.to(self.dtype)), draft.mask_state().to(self.dtype).expand(masks, -1)])
        tokens = torch.cat([toks, torch.full((masks,), draft.config.mask_token_id, device=dev, dtype=toks.dtype)])
        n = R + masks
        idx = torch.arange(n, device=dev)
        seen = torch.cat([real, torch.ones(masks, dtype=torch.bool, device=dev)])
        own = ((idx[:, None] >= idx[None, :]) & seen[None, :]) | torch.eye(n, dtype=torch.bool, device=dev)
        mask = (self.cols < start).expand(n, -1).index_copy(1, write, own)                  # [n, size]
        pre, _ = draft(tokens[None], hidden[None], pos[None], mask=mask[None, None], past=self.caches,
                       cache_slots=write)
        return pre[0]

    def _levels(self, L, seq):
        D = self.spec.depth
        pre = self._forward(self.p_aux, self.p_tok, self.p_start, self.p_m, D - 1)
        pick = torch.cat([(self.p_m - 1).reshape(1), self.pad + torch.arange(D - 1, device=self.device)])
        return self._topk(pre.index_select(0, pick))
