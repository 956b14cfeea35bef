"""P-EAGLE's training objective: one forward over the packed rows plus COD-sampled mask rows.

Rows (the vLLM proposer's layout, eyas positions as in train/ttt.py):
  base row t (depth 0)        token x_{t+1}, hidden fc(aux_t), position pos_t         -> target softmax(logits_{t+1})
  mask row (t, d), d >= 1     token mask_token_id, hidden fc(mask_hidden), pos_t + d  -> target softmax(logits_{t+1+d})
Attention: a base row sees base rows s <= t of its document; mask row (t, d) sees those and the mask rows
(t, 1..d) of its own rollout. A row at depth d counts where TTT step d would (train/ttt.step_valid).

COD sampling (Conditional Drop-token, the published recipe): depth d keeps about n * max(r^d, r_min) rollouts
(n = the row's counted base rows, r = 0.7, r_min = 0.2), drawn from the rollouts kept at depth d-1 whose
depth-d row counts, so every kept mask row's shallower rows exist. `anchors` caps the depth-1 pool.
Loss: the token mean over every counted row, depth d weighted decay**d (the recipe: decay 1).
"""

from __future__ import annotations

import torch
from torch import nn

from eyas.train.loss import chunked_soft_ce, depth_loss
from eyas.train.masks import block_mask_of, document_ids
from eyas.train.ttt import shift_left, step_valid

COD_RATIO, COD_RATIO_MIN = 0.7, 0.2


def cod_capacity(T: int, K: int, ratio: float = COD_RATIO, ratio_min: float = COD_RATIO_MIN,
                 anchors: int | None = None) -> int:
    """The most mask rows cod_layout samples for a row of T tokens: a static row count for compiled training."""
    n = T if anchors is None else min(T, anchors)
    return sum(min(n, int(T * max(ratio ** d, ratio_min))) for d in range(1, K))


def cod_layout(valid: torch.Tensor, ratio: float = COD_RATIO, ratio_min: float = COD_RATIO_MIN,
               anchors: int | None = None, pad_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """valid bool [K, B, T] (CPU): where depth k counts. Returns the rows' anchor t and depth, long [B, T + M]:
    the T base rows (anchor t, depth 0) first, then each row's sampled mask rows; rows padding a batch row to
    the longest (or to pad_to mask rows) have anchor = depth = -1."""
    K, B, T = valid.shape
    extra = []
    for b in range(B):
        n0 = int(valid[0, b].sum())
        prev = valid[min(1, K - 1), b].nonzero().flatten()
        if anchors is not None and prev.numel() > anchors:
            prev = prev[torch.randperm(prev.numel())[:anchors]].sort().values
        ts, ds = [], []
        for d in range(1, K):
            cand = prev if d == 1 else prev[valid[d, b, prev]]
            size = min(cand.numel(), int(n0 * max(ratio ** d, ratio_min)))
            if size <= 0:
                break
            prev = cand[torch.randperm(cand.numel())[:size]].sort().values
            ts.append(prev)
            ds.append(torch.full_like(prev, d))
        extra.append((torch.cat(ts) if ts else torch.zeros(0, dtype=torch.long),
                      torch.cat(ds) if ds else torch.zeros(0, dtype=torch.long)))
    M = max(max(t.numel() for t, _ in extra), pad_to or 0)
    anchor = torch.full((B, T + M), -1, dtype=torch.long)
    depth = torch.full((B, T + M), -1, dtype=torch.long)
    anchor[:, :T], depth[:, :T] = torch.arange(T), 0
    for b, (t, d) in enumerate(extra):
        anchor[b, T:T + t.numel()], depth[b, T:T + t.numel()] = t, d
    return anchor, depth


def _allowed(aq, ak, dq, dk, docq, dock, q_real):
    """The attention rule (module docstring) on broadcastable row attributes."""
    base = (dk == 0) & (ak <= aq) & (docq == dock)
    chain = (ak == aq) & (dk >= 1) & (dk <= dq)
    return (base | chain) & q_real


def peagle_dense_mask(anchor: torch.Tensor, depth: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """bool [B, 1, N, N] (True = attend) over cod_layout's rows; padding rows see only themselves."""
    rdoc = doc.gather(1, anchor.clamp(min=0))
    N = anchor.shape[1]
    allowed = _allowed(anchor[:, :, None], anchor[:, None, :], depth[:, :, None], depth[:, None, :],
                       rdoc[:, :, None], rdoc[:, None, :], (anchor >= 0)[:, :, None])
    return (allowed | torch.eye(N, dtype=torch.bool, device=anchor.device))[:, None]


def peagle_block_mask(anchor: torch.Tensor, depth: torch.Tensor, doc: torch.Tensor):
    """The same rule as a FlexAttention BlockMask (GPU training)."""
    rdoc = doc.gather(1, anchor.clamp(min=0))

    def mask_mod(b, h, q, kv):
        return _allowed(anchor[b, q], anchor[b, kv], depth[b, q], depth[b, kv], rdoc[b, q], rdoc[b, kv],
                        anchor[b, q] >= 0) | (q == kv)
    B, N = anchor.shape
    return block_mask_of(mask_mod, B, N, N, anchor.device)


class PEagleObjective(nn.Module):
    """forward(...) -> (loss, stats [K, 3]) like train/ttt.TTTUnroll; K = steps = depths."""

    def __init__(self, draft, steps: int, decay: float = 1.0, attention: str = "dense", compile_loss: bool = False,
                 anchors: int | None = None, loss_chunk: int = 4096):
        """compile_loss: a compiled run; the mask rows are then padded to cod_capacity, so every step has one
        shape (the compiled layers and block masks are built once)."""
        super().__init__()
        if attention not in ("dense", "flex"):
            raise ValueError(f"attention must be 'dense' or 'flex', got {attention!r}")
        self.draft, self.steps, self.decay, self.attention = draft, steps, decay, attention
        self.compile_loss, self.anchors, self.loss_chunk = compile_loss, anchors, loss_chunk
        self.static_shapes = compile_loss

    def rows(self, input_ids, position_ids, loss_mask, aux, in_vocab):
        """The one forward: pre-norm hidden [B, N, H] of cod_layout's rows, their anchor and depth [B, N], and
        which rows count [B, N]."""
        draft, K = self.draft, self.steps
        B, T = input_ids.shape
        dev = input_ids.device
        doc = document_ids(position_ids)
        valid = torch.stack([step_valid(doc, loss_mask, in_vocab, k) for k in range(K)])       # [K, B, T]
        pad = cod_capacity(T, K, anchors=self.anchors) if self.static_shapes else None
        anchor, depth = (x.to(dev) for x in cod_layout(valid.cpu(), anchors=self.anchors, pad_to=pad))  # [B, N]
        ext_t, ext_d = anchor[:, T:], depth[:, T:]
        M = ext_t.shape[1]
        ids = torch.cat([shift_left(input_ids, 1), torch.full_like(ext_t, draft.config.mask_token_id)], 1)
        pos = torch.cat([position_ids, position_ids.gather(1, ext_t.clamp(min=0)) + ext_d.clamp(min=0)], 1)
        base = draft.combine(aux)                                                              # [B, T, H]
        hidden = torch.cat([base, draft.mask_state().to(base.dtype).expand(B, M, -1)], 1)        # [B, N, H]
        mask = (peagle_block_mask if self.attention == "flex" else peagle_dense_mask)(anchor, depth, doc)
        pre, _ = draft(ids, hidden, pos, mask=mask)                                            # [B, N, H]
        return pre, anchor, depth, torch.cat([valid[0], ext_t >= 0], 1)

    def forward(self, input_ids, position_ids, loss_mask, aux, probs, in_vocab, target_arg):
        draft, T = self.draft, input_ids.shape[1]
        pre, anchor, depth, counted = self.rows(input_ids, position_ids, loss_mask, aux, in_vocab)
        b, i = counted.nonzero(as_tuple=True)
        t, d = anchor[b, i], depth[b, i]
        rows = b * T + t + 1 + d                      # the target logits each row is trained on
        ce, correct = chunked_soft_ce(draft.norm(pre[b, i]), draft.lm_head.weight, probs.flatten(0, 1), rows,
                                      target_arg.reshape(-1)[rows], self.loss_chunk, compiled=self.compile_loss)
        return depth_loss(ce, correct, d, self.steps, self.decay)
