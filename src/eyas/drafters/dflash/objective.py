"""DFlash's training objective: blocks at randomly sampled anchors, filled in one pass against the packed context.

For an anchor t (the last context row; eyas positions as in train/ttt.py):
  context   rows s <= t of t's document: c_s = hidden_norm(fc(aux_s)) as keys/values in every layer
  block     row 0: token x_{t+1} at pos_t + 1 (the anchor: the last committed token at decode time);
            row i = 1..K: the mask token at pos_t + 1 + i, trained on softmax(logits_{t+i}) (it predicts x_{t+1+i})
  attention a block row sees its document's context up to t and every row of its own block (non-causal)
Row i counts where TTT step i-1 would at t (train/ttt.step_valid); anchors are drawn uniformly from the t whose
first mask row counts, at most `anchors` per packed row (the recipe: 512). Loss: the token mean over counted
rows, row i weighted decay**(i-1), decay = exp(-1/gamma) with the paper's gamma (7 for 16-token blocks, 5 for 10,
4 for 8): `recipe_decay`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from eyas.train.loss import chunked_soft_ce, depth_loss
from eyas.train.masks import block_mask_of, document_ids
from eyas.train.ttt import shift_left, step_valid

ANCHORS = 512


def recipe_decay(block_size: int) -> float:
    """exp(-1/gamma): the DFlash paper's per-position loss decay for a block of this many tokens."""
    gamma = 7.0 if block_size >= 16 else 5.0 if block_size >= 10 else 4.0
    return math.exp(-1.0 / gamma)


def sample_anchors(first_counts: torch.Tensor, anchors: int, static: bool = False) -> torch.Tensor:
    """first_counts bool [B, T] (CPU): where an anchor's first mask row counts. Returns anchors long [B, A]
    (ascending per row, -1 = none), at most `anchors` per row drawn uniformly; static: A = anchors always (one
    shape for compiled training)."""
    picked = []
    for row in first_counts:
        cand = row.nonzero().flatten()
        picked.append(cand[torch.randperm(cand.numel())[:anchors]].sort().values)
    A = anchors if static else max(1, max(p.numel() for p in picked))
    out = torch.full((len(picked), A), -1, dtype=torch.long)
    for b, p in enumerate(picked):
        out[b, :p.numel()] = p
    return out


def _allowed(qa, qdoc, kv_ctx, kv_s, kv_doc, kv_a, q_real):
    """A block query of anchor qa (document qdoc) sees context s <= qa of its document and its own block."""
    return q_real & ((kv_ctx & (kv_s <= qa) & (kv_doc == qdoc)) | (~kv_ctx & (kv_a == qa)))


def _rows(anchor: torch.Tensor, doc: torch.Tensor, block: int):
    """Per block row: its anchor (-1: padding) and document; per key: context flag, position, document, anchor."""
    B, T = doc.shape
    qa = anchor.repeat_interleave(block, dim=1)                                 # [B, Q]
    qdoc = doc.gather(1, qa.clamp(min=0))
    ar = torch.arange(T, device=doc.device).expand(B, T)
    kv_ctx = torch.cat([torch.ones_like(ar, dtype=torch.bool), torch.zeros_like(qa, dtype=torch.bool)], 1)
    kv_s = torch.cat([ar, torch.full_like(qa, T)], 1)
    kv_doc = torch.cat([doc, qdoc], 1)
    kv_a = torch.cat([torch.full_like(ar, -2), qa], 1)
    return qa, qdoc, kv_ctx, kv_s, kv_doc, kv_a


def dflash_dense_mask(anchor: torch.Tensor, doc: torch.Tensor, block: int) -> torch.Tensor:
    """bool [B, 1, Q, T + Q] over keys = context rows then block rows; padding blocks see only themselves."""
    qa, qdoc, kv_ctx, kv_s, kv_doc, kv_a = _rows(anchor, doc, block)
    T, Q = doc.shape[1], qa.shape[1]
    allowed = _allowed(qa[:, :, None], qdoc[:, :, None], kv_ctx[:, None, :], kv_s[:, None, :], kv_doc[:, None, :],
                       kv_a[:, None, :], (qa >= 0)[:, :, None])
    own = torch.zeros(Q, T + Q, dtype=torch.bool, device=doc.device)
    own[:, T:] = torch.eye(Q, dtype=torch.bool, device=doc.device)
    return (allowed | own)[:, None]


def dflash_block_mask(anchor: torch.Tensor, doc: torch.Tensor, block: int):
    qa, qdoc, kv_ctx, kv_s, kv_doc, kv_a = _rows(anchor, doc, block)
    T = doc.shape[1]

    def mask_mod(b, h, q, kv):
        return _allowed(qa[b, q], qdoc[b, q], kv_ctx[b, kv], kv_s[b, kv], kv_doc[b, kv], kv_a[b, kv],
                        qa[b, q] >= 0) | (kv == q + T)
    B, Q = qa.shape
    return block_mask_of(mask_mod, B, Q, T + Q, doc.device)


class DFlashObjective(nn.Module):
    """forward(...) -> (loss, stats [K, 3]) like train/ttt.TTTUnroll; K = steps = mask rows per block."""

    def __init__(self, draft, steps: int, decay: float, attention: str = "dense", compile_loss: bool = False,
                 anchors: int | None = None, loss_chunk: int = 4096):
        """compile_loss: a compiled run; every batch row then holds `anchors` blocks (padding blocks count
        nothing), so every step has one shape."""
        super().__init__()
        if attention not in ("dense", "flex"):
            raise ValueError(f"attention must be 'dense' or 'flex', got {attention!r}")
        if steps != draft.config.parallel_tokens:
            raise ValueError(f"{steps} steps, but the draft fills {draft.config.parallel_tokens} mask rows per block")
        self.draft, self.steps, self.decay, self.attention = draft, steps, decay, attention
        self.compile_loss, self.anchors, self.loss_chunk = compile_loss, anchors or ANCHORS, loss_chunk
        self.static_shapes = compile_loss

    def rows(self, input_ids, position_ids, loss_mask, aux, in_vocab):
        """The one forward: pre-norm hidden [B, A*(K+1), H] of every sampled block, the anchors [B, A] (-1: none)
        and which mask rows count, [B, A, K] (row i = 1..K at [..., i-1])."""
        draft, K = self.draft, self.steps
        blk = K + 1
        B, T = input_ids.shape
        dev = input_ids.device
        doc = document_ids(position_ids)
        valid = torch.stack([step_valid(doc, loss_mask, in_vocab, k) for k in range(K)])       # [K, B, T]
        anchor = sample_anchors(valid[0].cpu(), self.anchors, static=self.static_shapes).to(dev)  # [B, A]
        A = anchor.shape[1]
        t = anchor.clamp(min=0)
        slot = torch.arange(blk, device=dev)
        first = shift_left(input_ids, 1).gather(1, t)                                          # x_{t+1}
        ids = torch.where(slot == 0, first[:, :, None], draft.config.mask_token_id).reshape(B, A * blk)
        pos = (position_ids.gather(1, t)[:, :, None] + 1 + slot).reshape(B, A * blk)
        mask = (dflash_block_mask if self.attention == "flex" else dflash_dense_mask)(anchor, doc, blk)
        pre = draft(ids, pos, context=draft.context(aux), context_positions=position_ids, mask=mask)  # [B, Q, H]
        # row i >= 1 of anchor t counts where step i-1 counts at t
        counts = valid.permute(1, 2, 0).gather(1, t[:, :, None].expand(B, A, K)) & (anchor >= 0)[:, :, None]
        return pre, anchor, counts

    def forward(self, input_ids, position_ids, loss_mask, aux, probs, in_vocab, target_arg):
        draft, T, blk = self.draft, input_ids.shape[1], self.steps + 1
        pre, anchor, counts = self.rows(input_ids, position_ids, loss_mask, aux, in_vocab)
        b, a, k = counts.nonzero(as_tuple=True)
        rows = b * T + anchor[b, a] + 1 + k           # row i = k+1 of anchor t is trained on logits_{t+1+k}
        ce, correct = chunked_soft_ce(draft.norm(pre[b, a * blk + 1 + k]), draft.lm_head.weight, probs.flatten(0, 1),
                                      rows, target_arg.reshape(-1)[rows], self.loss_chunk, compiled=self.compile_loss)
        return depth_loss(ce, correct, k, self.steps, self.decay)
