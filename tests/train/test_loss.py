"""The fused chunked lm-head + loss (train/loss.py) equals the plain path: loss, accuracy and gradients."""

import pytest
import torch
import torch.nn.functional as F

from eyas.draft.model import Eagle3Draft, draft_config_from_target
from eyas.train.loss import chunked_soft_ce
from eyas.train.ttt import TTTUnroll
from tests.train.fakes import AUX, tiny_target


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_soft_ce_equals_plain_with_grads(chunk):
    g = torch.Generator().manual_seed(0)
    N, H, V, R = 23, 16, 40, 30
    x = torch.randn(N, H, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(torch.randn(R, V, generator=g, dtype=torch.float64), -1)
    rows = torch.randint(0, R, (N,), generator=g)
    arg = torch.randint(0, V, (N,), generator=g)
    arg[:5] = (x[:5] @ w.t()).argmax(-1).detach()           # some rows are correct
    gout = torch.randn(N, generator=g, dtype=torch.float64)

    logits = x @ w.t()
    ce_ref = -(probs[rows] * torch.log_softmax(logits.float(), -1)).sum(-1)
    (ce_ref.double() * gout).sum().backward()
    gx_ref, gw_ref = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    ce, correct = chunked_soft_ce(x, w, probs.float(), rows, arg, chunk=chunk)
    (ce.double() * gout).sum().backward()
    torch.testing.assert_close(ce.double(), ce_ref.double(), rtol=1e-5, atol=1e-5)
    assert correct.tolist() == (logits.argmax(-1) == arg).tolist() and correct[:5].all()
    torch.testing.assert_close(x.grad, gx_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad, gw_ref, rtol=1e-5, atol=1e-5)


def _unroll_case(dtype=torch.float32):
    torch.manual_seed(0)
    target = tiny_target()
    cfg = draft_config_from_target(target.config, aux_layer_ids=AUX)
    draft = Eagle3Draft(cfg).to(dtype)
    B, T = 2, 24
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    pos = torch.cat([torch.arange(14), torch.arange(10)]).expand(B, T).clone()
    aux = torch.randn(B, T, 3, cfg.target_hidden_size, dtype=dtype)
    probs = torch.softmax(torch.randn(B, T, cfg.draft_vocab_size), -1)
    ok = torch.rand(B, T) > 0.2
    lm = torch.rand(B, T) > 0.3
    return draft, (ids, pos, lm, aux, probs, ok, probs.argmax(-1))


def _loss_and_grads(draft, args, chunk, autocast=False):
    draft.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, stats = TTTUnroll(draft, 4, loss_chunk=chunk)(*args)
    loss.backward()
    return loss.detach(), stats, {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk", [5, 4096])
def test_ttt_fused_loss_equals_plain_path(chunk):
    draft, args = _unroll_case()
    ref = _loss_and_grads(draft, args, 0)
    new = _loss_and_grads(draft, args, chunk)
    torch.testing.assert_close(new[0], ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(new[1], ref[1], rtol=1e-5, atol=1e-4)   # ce sums, correct counts, counts
    assert ref[2].keys() == new[2].keys() and "lm_head.weight" in new[2] and "fc.weight" in new[2]
    for name in ref[2]:
        torch.testing.assert_close(new[2][name], ref[2][name], rtol=1e-4, atol=1e-6, msg=name)


def test_ttt_fused_loss_under_bf16_autocast_close_to_plain():
    draft, args = _unroll_case()
    ref = _loss_and_grads(draft, args, 0, autocast=True)
    new = _loss_and_grads(draft, args, 8, autocast=True)
    torch.testing.assert_close(new[0], ref[0], rtol=1e-2, atol=1e-2)
    for name in ref[2]:
        a, b = new[2][name].float(), ref[2][name].float()
        assert (a - b).norm() <= 0.03 * b.norm() + 1e-6, name


def test_bad_chunk_is_refused():
    with pytest.raises(ValueError, match="chunk"):
        chunked_soft_ce(torch.ones(2, 3), torch.ones(4, 3), torch.ones(2, 4) / 4, torch.arange(2),
                        torch.zeros(2, dtype=torch.long), chunk=0)


def test_compiled_chunks_equal_eager():
    """compiled=True (GPU training's default) runs the same chunk math through torch.compile: loss, accuracy and
    gradients equal the eager chunks' (fp32, up to the fused kernels' summation order)."""
    g = torch.Generator().manual_seed(1)
    N, H, V, R = 37, 16, 48, 30
    probs = torch.softmax(torch.randn(R, V, generator=g), -1)
    rows = torch.randint(0, R, (N,), generator=g)
    arg = torch.randint(0, V, (N,), generator=g)
    x0, w0 = torch.randn(N, H, generator=g), torch.randn(V, H, generator=g)
    gout = torch.randn(N, generator=g)
    out = {}
    for compiled in (False, True):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        ce, correct = chunked_soft_ce(x, w, probs, rows, arg, chunk=16, compiled=compiled)  # 16, 16, 5 rows
        (ce * gout).sum().backward()
        out[compiled] = (ce.detach(), correct, x.grad, w.grad)
    for a, b in zip(out[False], out[True]):
        if a.dtype == torch.bool:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_compiled_target_head_equals_eager():
    from eyas.train.ttt import TargetHead

    g = torch.Generator().manual_seed(2)
    V, H, Vd = 64, 16, 40
    norm = torch.nn.RMSNorm(H, eps=1e-5)
    weight = torch.randn(V, H, generator=g)
    ids = torch.sort(torch.randperm(V, generator=g)[:Vd]).values
    d2t, t2d = ids - torch.arange(Vd), torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    last = torch.randn(2, 21, H, generator=g)                    # 42 rows in chunks of 16: a short last chunk
    eager = TargetHead(norm, weight, d2t, t2d, chunk=16)(last)
    fused = TargetHead(norm, weight, d2t, t2d, chunk=16, compiled=True)(last)
    torch.testing.assert_close(fused[0], eager[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(fused[1], eager[1]) and torch.equal(fused[2], eager[2])
