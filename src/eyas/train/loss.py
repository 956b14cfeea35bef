"""Chunked draft lm-head + soft cross-entropy: [tokens, draft-vocab] logits never exist in full.

The plain TTT loss computes `lm_head(norm(pre))` for every counted position of a step, keeps the fp32
logits and their log-softmax for backward, and gathers a [N, Vd] copy of the target probabilities: about
3 x N x Vd x 4 bytes per TTT step, all K steps alive until backward (K=7, N=16k, Vd=32k: ~44 GB). Here
the logits are made `chunk` rows at a time in forward (only the per-row log-sum-exp is kept) and
remade chunk by chunk in backward (one extra lm-head matmul, ~2 % of the step's FLOPs at the 8B shape),
and the target probabilities are read through row indices into the one shared [B*T, Vd] tensor.

Numerics: the matmul runs in the autocast dtype when autocast is on (as the plain path's
`lm_head` does), accumulation and softmax in fp32. tests/train/test_loss.py checks loss, accuracy and
gradients against the plain path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def _fwd_chunk(x, w, probs, rows, target_arg):
    """One chunk's forward: x [c, H], w [Vd, H] (compute dtype), probs [R, Vd] fp32, rows [c], target_arg [c]
    -> ce [c], lse [c] (fp32), correct [c]."""
    logits = F.linear(x, w).float()                                      # [c, Vd], one chunk only
    p = probs.index_select(0, rows)
    lse = torch.logsumexp(logits, dim=-1)
    # -sum p log_softmax = lse * sum p - sum p * logits
    return lse * p.sum(-1) - (p * logits).sum(-1), lse, logits.argmax(-1) == target_arg


def _bwd_chunk(x, w, probs, rows, lse, grad_ce):
    """One chunk's backward (logits remade): -> (d x [c, H] in the compute dtype, d w [Vd, H] fp32)."""
    logits = F.linear(x, w).float()
    p = probs.index_select(0, rows)
    # d ce / d logits = softmax * sum p - p
    g = ((torch.exp(logits - lse[:, None]) * p.sum(-1, keepdim=True) - p) * grad_ce[:, None]).to(w.dtype)
    return g @ w, (g.t() @ x).float()


# torch.compile'd chunks (compile=True, GPU training's default): the chunk's elementwise passes over [c, Vd] fp32
# (float copy, gather, log-sum-exp, products, sums; in backward exp, scale, subtract, cast) become a few fused
# kernels, which on an H200 are most of this loss's time at a small draft's shape (bench/train_online.py).
_COMPILED: dict[str, object] = {}


def _chunk_fns(compiled: bool):
    if not compiled:
        return _fwd_chunk, _bwd_chunk
    if not _COMPILED:
        # dynamic: the last chunk of a step and every step's count of rows differ; one kernel serves them all
        _COMPILED["fwd"] = torch.compile(_fwd_chunk, dynamic=True)
        _COMPILED["bwd"] = torch.compile(_bwd_chunk, dynamic=True)
    return _COMPILED["fwd"], _COMPILED["bwd"]


class _ChunkedSoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, probs, rows, target_arg, chunk: int, dt, compiled: bool):
        # x [N, H] normed hidden; weight [Vd, H]; probs [R, Vd] fp32; rows [N] indices into probs;
        # target_arg [N] draft ids. Returns ce [N] fp32 and correct [N] bool.
        N = x.shape[0]
        w = weight.to(dt)
        ce = torch.empty(N, dtype=torch.float32, device=x.device)
        lse = torch.empty(N, dtype=torch.float32, device=x.device)
        correct = torch.empty(N, dtype=torch.bool, device=x.device)
        fwd, _ = _chunk_fns(compiled)
        with torch.autocast(x.device.type, enabled=False):
            for i in range(0, N, chunk):
                j = slice(i, i + chunk)
                ce[j], lse[j], correct[j] = fwd(x[j].to(dt), w, probs, rows[j], target_arg[j])
        ctx.save_for_backward(x, weight, probs, rows, lse)
        ctx.chunk, ctx.dt, ctx.compiled = chunk, dt, compiled
        ctx.mark_non_differentiable(correct)
        return ce, correct

    @staticmethod
    def backward(ctx, grad_ce, _grad_correct):
        x, weight, probs, rows, lse = ctx.saved_tensors
        chunk, dt = ctx.chunk, ctx.dt
        w = weight.to(dt)
        gx = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        _, bwd = _chunk_fns(ctx.compiled)
        with torch.autocast(x.device.type, enabled=False):
            for i in range(0, x.shape[0], chunk):
                j = slice(i, i + chunk)
                dx, dw = bwd(x[j].to(dt), w, probs, rows[j], lse[j], grad_ce[j].float())
                if gx is not None:
                    gx[j] = dx.to(x.dtype)
                if gw is not None:
                    gw += dw
        return gx, (gw.to(weight.dtype) if gw is not None else None), None, None, None, None, None, None


def chunked_soft_ce(x: torch.Tensor, weight: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor,
                    target_arg: torch.Tensor, chunk: int = 4096, compiled: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row soft cross-entropy of `x @ weight.T` against `probs[rows]`, and argmax == target_arg.

    x [N, H] (already normed), weight [Vd, H], probs [R, Vd] (fp32, rows may repeat), rows [N] int64,
    target_arg [N]. compiled: run each chunk's math through torch.compile (fused kernels; the same math).
    Returns (ce [N] fp32, correct [N] bool)."""
    if chunk < 1:
        raise ValueError(f"loss chunk must be >= 1 rows, got {chunk}")
    return _ChunkedSoftCE.apply(x, weight, probs, rows, target_arg, int(chunk), _compute_dtype(x), bool(compiled))


def depth_loss(ce: torch.Tensor, correct: torch.Tensor, depth: torch.Tensor, steps: int, decay: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The parallel drafters' objective over their counted rows: ce/correct [N] and each row's depth [N] (0 = the
    first drafted token). loss = sum_rows decay**depth * ce / N, the token mean of the published recipes (P-EAGLE:
    decay 1; DFlash: exp(-1/gamma)). Returns (loss, stats [steps, 3] = ce_sum, correct, count per depth)."""
    stats = torch.zeros(steps, 3, dtype=torch.float32, device=ce.device)
    stats[:, 0].index_add_(0, depth, ce.detach().float())
    stats[:, 1].index_add_(0, depth, correct.float())
    stats[:, 2].index_add_(0, depth, torch.ones_like(ce, dtype=torch.float32))
    weight = torch.full_like(ce, float(decay)).pow(depth.to(ce.dtype))
    return (weight * ce).sum() / max(int(depth.numel()), 1), stats


def token_mean_objective(stats: torch.Tensor, decay: float) -> float:
    """depth_loss's value from stats [K, 3] summed over batches: sum_k decay**k * ce_k / sum_k n_k."""
    w = torch.tensor([float(decay) ** k for k in range(stats.shape[0])])
    s = stats.detach().float().cpu()
    return float((w * s[:, 0]).sum() / s[:, 2].sum().clamp(min=1))
