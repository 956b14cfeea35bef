"""Training-time test (TTT): K unrolled draft steps over a packed batch.

Step k at sequence position t mirrors step k of a vLLM proposer chain that starts at t:
  hidden   = fc(aux_t) at k = 0, else the draft's own step-(k-1) pre-norm output at t
  token    = x_{t+1+k},   RoPE position = position_ids[t] + k   (position ids restart per document)
  target   = softmax over the draft vocab of the target's logits at t+1+k (which predict x_{t+2+k})
  attends  = step-0 keys at s <= t of the same document, plus its own step-j keys at t for j = 1..k
             (the chain's earlier drafted tokens; the KV cache vLLM holds at that moment)
  counted  = x_{t+2+k} lies in the same document, is an assistant token (loss_mask), and the target's
             full-vocab argmax at t+1+k is inside the draft vocab
Loss = sum_k decay^k * mean soft cross-entropy (forward KL up to the target entropy) over counted positions.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from eyas import env
from eyas.draft.model import Eagle3Draft
from eyas.train.loss import chunked_soft_ce
from eyas.train.masks import TTTBlockMasks, document_ids, ttt_block_mask_reference, ttt_dense_mask
from eyas.vocab import target_ids


def shift_left(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """x[:, t] <- x[:, t+n] along dim 1, padding the tail with `fill`."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)


def step_valid(doc: torch.Tensor, loss_mask: torch.Tensor, in_vocab: torch.Tensor, k: int) -> torch.Tensor:
    """bool [B, T]: positions t counted at TTT step k (see the module docstring)."""
    s = 1 + k
    same_doc = shift_left(doc, s + 1, fill=-1) == doc      # x_{t+2+k} in t's document (and inside the row)
    return same_doc & shift_left(loss_mask, s + 1, fill=False) & shift_left(in_vocab, s, fill=False)


def counted_positions(doc: torch.Tensor, loss_mask: torch.Tensor, in_vocab: torch.Tensor, steps: int):
    """Every TTT step's counted positions with one device->host sync (they do not depend on the draft), instead
    of a valid.nonzero() or pre[valid] per step. Returns per step k (valid [B, T], b [N_k], t [N_k]) with
    (b, t) == valid.nonzero(as_tuple=True)."""
    B, T = doc.shape
    valid = torch.stack([step_valid(doc, loss_mask, in_vocab, k) for k in range(steps)])     # [K, B, T]
    counts = valid.sum((1, 2)).tolist()                                                      # the one sync
    # A stable sort of the flat [K*B*T] mask puts the counted indices first, in nonzero()'s (row-major) order.
    flat = torch.argsort(valid.logical_not().flatten().to(torch.uint8), stable=True)[:sum(counts)]
    out = []
    for k, f in enumerate(flat.split(counts)):
        f = f - k * B * T
        out.append((valid[k], f // T, f % T))
    return out


class TargetHead(nn.Module):
    """The target's frozen final norm + lm_head, turning `last` hidden states into the training signal.

    Logits are computed `chunk` tokens at a time, so full-vocab fp32 logits exist only for one chunk.
    """

    def __init__(self, norm: nn.Module, lm_head_weight: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor,
                 chunk: int = 2048, compiled: bool = False):
        """compiled: each chunk's norm, head, argmax, column selection and softmax through torch.compile (fused
        kernels over the [chunk, V] logits; the same math)."""
        super().__init__()
        self.norm = norm.requires_grad_(False)
        self.register_buffer("weight", lm_head_weight.detach(), persistent=False)
        # The target id of every draft id: the columns of the target's logits the draft vocabulary keeps.
        self.register_buffer("kept_ids", target_ids(d2t), persistent=False)
        self.register_buffer("t2d", t2d.bool(), persistent=False)
        self.chunk = chunk
        # dynamic: a batch's last chunk is shorter; one kernel serves every chunk length
        self._chunk_fn = torch.compile(self._chunk, dynamic=True) if compiled else self._chunk

    def _chunk(self, h: torch.Tensor):
        x = self.norm(h.to(self.weight.dtype))
        logits = F.linear(x.to(self.weight.dtype), self.weight).float()      # [c, V]: one chunk only
        d = logits.index_select(1, self.kept_ids)
        return torch.softmax(d, dim=-1), self.t2d[logits.argmax(-1)], d.argmax(-1)

    @torch.no_grad()
    def forward(self, last: torch.Tensor):
        """last [B, T, H] -> probs [B, T, Vd] fp32, in_vocab [B, T] bool, argmax [B, T] (draft ids)."""
        B, T, H = last.shape
        flat = last.reshape(B * T, H)
        Vd = self.kept_ids.numel()
        probs = torch.empty(B * T, Vd, dtype=torch.float32, device=last.device)
        ok = torch.empty(B * T, dtype=torch.bool, device=last.device)
        arg = torch.empty(B * T, dtype=torch.long, device=last.device)
        for i in range(0, flat.shape[0], self.chunk):
            j = slice(i, i + self.chunk)
            probs[j], ok[j], arg[j] = self._chunk_fn(flat[j])
        return probs.view(B, T, Vd), ok.view(B, T), arg.view(B, T)


class TTTUnroll(nn.Module):
    """Wraps the draft so that one forward() is the whole K-step unroll + loss (DDP/FSDP2 hook on it)."""

    def __init__(self, draft: Eagle3Draft, steps: int, decay: float = 0.8, attention: str = "dense",
                 loss_chunk: int = 4096, compile_loss: bool = False):
        """loss_chunk: rows per lm-head chunk in the fused head + loss (train/loss.py); 0 = the plain path
        that materialises every step's [N, Vd] logits (kept as the reference the tests compare with).
        compile_loss: the fused loss's chunks through torch.compile (GPU training's default)."""
        super().__init__()
        if steps < 1:
            raise ValueError(f"ttt steps must be >= 1, got {steps}")
        if attention not in ("dense", "flex"):
            raise ValueError(f"attention must be 'dense' or 'flex', got {attention!r}")
        self.draft, self.steps, self.decay, self.attention = draft, steps, decay, attention
        self.loss_chunk, self.compile_loss = loss_chunk, compile_loss

    def forward(self, input_ids, position_ids, loss_mask, aux, probs, in_vocab, target_arg):
        """input_ids/position_ids/loss_mask [B, T]; aux [B, T, k, Ht]; probs [B, T, Vd]; in_vocab,
        target_arg [B, T] (from TargetHead). Returns (loss, stats [K, 3] = ce_sum, correct, count)."""
        draft = self.draft
        doc = document_ids(position_ids)
        counted = counted_positions(doc, loss_mask, in_vocab, self.steps)   # before any draft work is queued
        # flex: one block analysis of the document layout serves the K steps' masks
        block_masks = None
        if self.attention == "flex":  # EYAS_TTT_MASK=reference: create_block_mask per step (the slow original)
            block_masks = (TTTBlockMasks(doc) if env.get("EYAS_TTT_MASK") != "reference"
                           else lambda k: ttt_block_mask_reference(doc, k))
        hidden = draft.combine(aux)                                       # [B, T, H]
        past = None
        loss = hidden.new_zeros((), dtype=torch.float32)
        weights = step_weights(self.decay, self.steps)
        stats = []
        for k in range(self.steps):
            tokens = shift_left(input_ids, 1 + k)
            mask = block_masks(k) if block_masks is not None else ttt_dense_mask(doc, k)
            pre, (kk, vv) = draft(tokens, hidden, position_ids + k, mask=mask, past=past)
            past = (kk, vv) if past is None else (torch.cat([past[0], kk], 2), torch.cat([past[1], vv], 2))
            valid, b, t = counted[k]
            # Logits only where counted: user turns and padding cost no lm_head FLOPs.
            if self.loss_chunk:
                ce, correct = self._fused_ce(pre, b, t, probs, target_arg, 1 + k)
            else:
                logits = draft.logits(pre[b, t]).float()                  # [N, Vd]
                p = shift_left(probs, 1 + k)[b, t]
                ce = -(p * torch.log_softmax(logits, dim=-1)).sum(-1)
                correct = logits.argmax(-1) == shift_left(target_arg, 1 + k)[b, t]
            correct = correct.sum()
            n = valid.sum()
            loss = loss + weights[k] * ce.sum() / n.clamp(min=1)
            stats.append(torch.stack([ce.sum().detach(), correct.float(), n.float()]))
            hidden = pre
        return loss, torch.stack(stats)

    def _fused_ce(self, pre, b, t, probs, target_arg, shift: int):
        """The plain path's (ce, correct) for positions (b, t), target rows read `shift` positions later,
        without a [N, Vd] logits or probs tensor (train/loss.py)."""
        B, T = pre.shape[:2]
        rows = b * T + t + shift                       # valid positions never read past their row's end
        x = self.draft.norm(pre[b, t])
        return chunked_soft_ce(x, self.draft.lm_head.weight, probs.reshape(B * T, -1), rows,
                               target_arg.reshape(-1)[rows], self.loss_chunk, compiled=self.compile_loss)


def step_weights(decay: float, steps: int) -> list[float]:
    """Loss weight of TTT step k, decay**k: the one definition the training loss and the logged objective share."""
    return [decay ** k for k in range(steps)]


def objective(stats: torch.Tensor, decay: float) -> float:
    """The training objective from stats [K, 3] (summed over batches): sum_k w_k * ce_k / n_k."""
    per_step = stats[:, 0].cpu() / stats[:, 2].cpu().clamp(min=1)
    return float((torch.tensor(step_weights(decay, stats.shape[0])) * per_step).sum())


def token_loss(stats: torch.Tensor) -> float:
    """Mean cross-entropy (nats) per predicted token over all TTT steps, unweighted: what the progress bar
    shows and the demo plots. `loss` in metrics.jsonl is the objective (step k weighted by step_decay**k)."""
    return float(stats[:, 0].sum() / stats[:, 2].clamp(min=1).sum())


def step_accuracy(stats: torch.Tensor) -> list[float]:
    """stats [K, 3] (summed over batches) -> per-step accuracy."""
    return [float(c / n) if n > 0 else 0.0 for _, c, n in stats.tolist()]


def simulated_tau(step_acc: list[float], K: int | None = None) -> float:
    """Expected tokens per verification of a K-token chain from per-step accuracies.

    acc_k is measured with the true prefix (teacher forcing), i.e. it estimates P(draft k correct |
    drafts 0..k-1 accepted). The chain emits the accepted run plus the bonus token:
        tau = 1 + sum_{k<K} prod_{j<=k} acc_j
    Steps beyond the trained ones reuse the last measured accuracy. K defaults to len(step_acc).
    """
    if not step_acc:
        raise ValueError("simulated_tau needs at least one step accuracy")
    K = len(step_acc) if K is None else int(K)
    tau, run = 1.0, 1.0
    for k in range(K):
        run *= float(step_acc[min(k, len(step_acc) - 1)])
        tau += run
    return tau
