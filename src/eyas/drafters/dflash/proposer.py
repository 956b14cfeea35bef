"""DFlash's proposer (vLLM 0.26's DFlashProposer, one sequence): the accepted rows' target states become context
keys/values in every layer's cache (catchup, no attention), then one non-causal pass over the block
[last committed token, mask x K] at the next K+1 positions yields depths 1..K (draft_tree). The whole trained
block always runs; a chain or tree uses its first `depth` rows.
"""

from __future__ import annotations

import torch

from eyas.decode.parallel import ParallelProposer
from eyas.decode.tree import TreeSpec


class DFlashProposer(ParallelProposer):
    def __init__(self, draft, spec: TreeSpec, capacity: int):
        K = draft.config.parallel_tokens
        if spec.depth > K:
            raise ValueError(f"{spec.label()}: depth {spec.depth} exceeds the {K} tokens this DFlash draft fills per "
                             f"block (block size {K + 1}); use --chain/--tree depth <= {K}")
        self.block = K + 1
        super().__init__(draft, spec, capacity, rows=self.block)

    def _catchup(self, aux, toks, start, m):
        rows = aux.shape[0]
        ar = torch.arange(rows, device=self.device)
        write = torch.where(ar < m, start + ar, self.junk + ar)
        kvs = self.draft.context_kv(self.draft.context(aux.to(self.dtype))[None], (start + ar)[None])
        for (kc, vc), (k, v) in zip(self.caches, kvs):
            kc.index_copy_(2, write, k)
            vc.index_copy_(2, write, v)

    def _observe(self, aux, toks, start: int, m: int) -> None:
        self._catchup(aux, toks, torch.tensor(start, device=self.device), torch.tensor(m, device=self.device))

    def _levels(self, L, seq):
        ar = torch.arange(self.block, device=self.device)
        last = seq.index_select(0, (L - 1).reshape(1))
        tokens = torch.where(ar == 0, last, self.draft.config.mask_token_id)
        write = self.scratch + ar
        mask = (self.cols < L - 1) | ((self.cols >= self.scratch) & (self.cols < self.scratch + self.block))
        pre = self.draft(tokens[None], (L - 1 + ar)[None], mask=mask.expand(self.block, -1)[None, None],
                         caches=self.caches, slots=write)[0]
        return self._topk(pre[1:self.spec.depth + 1])
