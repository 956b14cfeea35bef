import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eyas.draft.model import Eagle3Draft, draft_config_from_target
from eyas.train.loss import chunked_soft_ce
from eyas.train.masks import BlockMask, TTTBlockMasks, document_ids, ttt_dense_mask
from eyas.train.ttt import (TargetHead, TTTUnroll, counted_positions, shift_left, simulated_tau, step_valid,
                            step_weights)
from tests.train.fakes import AUX, tiny_target


@pytest.mark.skipif(BlockMask is None, reason="no FlexAttention")
@pytest.mark.parametrize("mask_env", [None, "reference"])
def test_flex_block_mask_equals_dense_in_the_unroll(monkeypatch, mask_env):
    if mask_env:  # the escape hatch to create_block_mask per step gives the same unroll
        monkeypatch.setenv("EYAS_TTT_MASK", mask_env)
    target = tiny_target()
    cfg = draft_config_from_target(target.config, aux_layer_ids=AUX)
    draft = Eagle3Draft(cfg)
    B, T = 2, 20
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    pos = torch.cat([torch.arange(12), torch.arange(8)]).expand(B, T).clone()
    pos[1] = torch.cat([torch.arange(5), torch.arange(15)])
    aux = torch.randn(B, T, 3, cfg.target_hidden_size)
    probs = torch.softmax(torch.randn(B, T, cfg.draft_vocab_size), -1)
    ok = torch.ones(B, T, dtype=torch.bool)
    arg = probs.argmax(-1)
    lm = torch.ones(B, T, dtype=torch.bool)
    out = {}
    with torch.no_grad():  # FlexAttention has no backward on CPU; the forward is what the mask decides
        for kind in ("dense", "flex"):
            out[kind] = TTTUnroll(draft, 3, attention=kind)(ids, pos, lm, aux, probs, ok, arg)
    torch.testing.assert_close(out["dense"][0], out["flex"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["dense"][1], out["flex"][1])


def test_step_valid_masks_document_end_assistant_and_vocab():
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    doc = document_ids(pos)
    lm = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1]]).bool()
    ok = torch.ones(1, 8, dtype=torch.bool)
    # k=0: t counts iff x_{t+2} is assistant and in t's document
    assert step_valid(doc, lm, ok, 0).int().tolist() == [[1, 1, 1, 0, 0, 1, 0, 0]]
    # k=1: predicts x_{t+3}
    assert step_valid(doc, lm, ok, 1).int().tolist() == [[1, 1, 0, 0, 0, 0, 0, 0]]
    ok[0, 2] = False  # target argmax at position 2 (t+1 for t=1 at k=0) is outside the draft vocab
    assert step_valid(doc, lm, ok, 0).int().tolist() == [[1, 0, 1, 0, 0, 1, 0, 0]]


def test_ttt_step_k_reproduces_an_inference_chain():
    """Step k at position t == running the draft as a chain from t with a KV cache (vLLM's proposer)."""
    target = tiny_target()
    cfg = draft_config_from_target(target.config, aux_layer_ids=AUX)
    draft = Eagle3Draft(cfg).eval()
    T, K, t = 10, 3, 5
    ids = torch.randint(0, cfg.vocab_size, (1, T))
    pos = torch.arange(T)[None]
    aux = torch.randn(1, T, 3, cfg.target_hidden_size)
    # TTT: collect the pre-norm output of every step at position t.
    doc = document_ids(pos)
    hidden, past, ttt = draft.combine(aux), None, []
    for k in range(K):
        tok = torch.cat([ids[:, 1 + k:], torch.zeros(1, 1 + k, dtype=torch.long)], 1)
        pre, kv = draft(tok, hidden, pos + k, mask=ttt_dense_mask(doc, k), past=past)
        past = kv if past is None else (torch.cat([past[0], kv[0]], 2), torch.cat([past[1], kv[1]], 2))
        ttt.append(pre[0, t])
        hidden = pre
    # Chain: prefill positions 0..t with target states, then feed each step's output back one token at a time.
    pre, cache = draft(ids[:, 1:t + 2], draft.combine(aux[:, :t + 1]), pos[:, :t + 1])
    torch.testing.assert_close(pre[0, t], ttt[0], rtol=1e-5, atol=1e-5)
    h = pre[:, t:t + 1]
    for j in range(1, K):
        S = cache[0].shape[2]
        m = torch.ones(1, 1, 1, S + 1, dtype=torch.bool)
        h, kv = draft(ids[:, t + 1 + j:t + 2 + j], h, torch.tensor([[t + j]]), mask=m, past=cache)
        cache = (torch.cat([cache[0], kv[0]], 2), torch.cat([cache[1], kv[1]], 2))
        torch.testing.assert_close(h[0, 0], ttt[j], rtol=1e-5, atol=1e-5)


def test_target_head_chunked_equals_full():
    target = tiny_target()
    lay = target.layout
    d2t = torch.zeros(40, dtype=torch.long)
    ids = torch.sort(torch.randperm(lay.vocab_size)[:40]).values
    d2t, t2d = ids - torch.arange(40), torch.zeros(lay.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    last = torch.randn(2, 9, lay.hidden_size)
    full = target.model.lm_head(lay.norm(last)).float()
    for chunk in (1, 5, 1000):
        p, ok, arg = TargetHead(lay.norm, lay.lm_head.weight, d2t, t2d, chunk=chunk)(last)
        torch.testing.assert_close(p, torch.softmax(full[..., ids], -1))
        assert torch.equal(ok, t2d[full.argmax(-1)])
        assert torch.equal(ids[arg], full[..., ids].argmax(-1).apply_(lambda i: ids[i]))


def test_simulated_tau_formula():
    assert simulated_tau([1.0, 1.0, 1.0]) == 4.0
    assert simulated_tau([0.0, 1.0]) == 1.0
    assert simulated_tau([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert simulated_tau([0.5], K=3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert simulated_tau([0.8, 0.5, 0.5], K=1) == pytest.approx(1.8)
    with pytest.raises(ValueError):
        simulated_tau([])


def _forward_before_counted_positions(unroll, input_ids, position_ids, loss_mask, aux, probs, in_vocab, target_arg):
    """TTTUnroll.forward as it was before counted_positions (dense masks): step_valid, then valid.nonzero()
    (fused loss) or pre[valid] (plain loss) inside every step. The reference the new forward must equal."""
    draft, doc = unroll.draft, document_ids(position_ids)
    hidden, past = draft.combine(aux), None
    loss, stats = hidden.new_zeros((), dtype=torch.float32), []
    for k, w in enumerate(step_weights(unroll.decay, unroll.steps)):
        pre, kv = draft(shift_left(input_ids, 1 + k), hidden, position_ids + k, mask=ttt_dense_mask(doc, k), past=past)
        past = kv if past is None else (torch.cat([past[0], kv[0]], 2), torch.cat([past[1], kv[1]], 2))
        valid = step_valid(doc, loss_mask, in_vocab, k)
        if unroll.loss_chunk:
            B, T = valid.shape
            b, t = valid.nonzero(as_tuple=True)
            rows = b * T + t + 1 + k
            ce, correct = chunked_soft_ce(draft.norm(pre[b, t]), draft.lm_head.weight, probs.reshape(B * T, -1),
                                          rows, target_arg.reshape(-1)[rows], unroll.loss_chunk)
        else:
            logits = draft.logits(pre[valid]).float()
            ce = -(shift_left(probs, 1 + k)[valid] * torch.log_softmax(logits, dim=-1)).sum(-1)
            correct = logits.argmax(-1) == shift_left(target_arg, 1 + k)[valid]
        n = valid.sum()
        loss = loss + w * ce.sum() / n.clamp(min=1)
        stats.append(torch.stack([ce.sum().detach(), correct.sum().float(), n.float()]))
        hidden = pre
    return loss, torch.stack(stats)


def _counting_case():
    target = tiny_target()
    cfg = draft_config_from_target(target.config, aux_layer_ids=AUX)
    draft = Eagle3Draft(cfg)
    B, T = 3, 26
    padded = torch.cat([torch.arange(5), torch.arange(9), torch.arange(4), torch.zeros(8, dtype=torch.long)])
    pos = torch.stack([torch.cat([torch.arange(14), torch.arange(12)]), torch.arange(T), padded])
    probs = torch.softmax(torch.randn(B, T, cfg.draft_vocab_size), -1)
    args = (torch.randint(0, cfg.vocab_size, (B, T)), pos, torch.rand(B, T) > 0.3,
            torch.randn(B, T, 3, cfg.target_hidden_size), probs, torch.rand(B, T) > 0.2, probs.argmax(-1))
    return draft, args


@pytest.mark.parametrize("chunk", [0, 5, 4096])
def test_forward_equals_the_per_step_sync_forward_exactly(chunk):
    """Valid positions found once for all K steps: loss, stats and every gradient bit-identical (fp32)."""
    draft, args = _counting_case()
    unroll = TTTUnroll(draft, 5, loss_chunk=chunk)
    out = {}
    before = lambda: _forward_before_counted_positions(unroll, *args)  # noqa: E731
    for name, fwd in (("before", before), ("now", lambda: unroll(*args))):
        draft.zero_grad(set_to_none=True)
        loss, stats = fwd()
        loss.backward()
        out[name] = loss.detach(), stats, {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}
    assert torch.equal(out["now"][0], out["before"][0]) and torch.equal(out["now"][1], out["before"][1])
    assert out["now"][1][:, 2].min() > 0 and out["now"][2].keys() == out["before"][2].keys()
    for name, g in out["before"][2].items():
        assert torch.equal(out["now"][2][name], g), name


def test_counted_positions_are_nonzero_per_step():
    doc = document_ids(torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5, 6, 7]]))
    lm, ok = torch.rand(2, 8) > 0.2, torch.rand(2, 8) > 0.1
    for k, (valid, b, t) in enumerate(counted_positions(doc, lm, ok, 6)):
        assert torch.equal(valid, step_valid(doc, lm, ok, k))
        want = valid.nonzero(as_tuple=True)
        assert torch.equal(b, want[0]) and torch.equal(t, want[1]), k


class SyncCounter(TorchDispatchMode):
    """Counts the ops that make a device->host sync on a GPU (their output size or value is data-dependent):
    nonzero, boolean indexing, masked_select, item()/bool()/int(), and Tensor.tolist() (not an aten op, so
    patched while the mode is on). `matmuls_before` = matmuls seen before the first sync."""

    SYNCING = {"aten.nonzero.default", "aten.masked_select.default", "aten._local_scalar_dense.default",
               "aten.unique2.default", "aten._unique2.default", "aten.nonzero_static.default"}
    MATMULS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default"}

    def __enter__(self):
        self.calls, self.matmuls_before, self._tolist = [], 0, torch.Tensor.tolist

        def counted_tolist(x):
            self.calls.append("tolist")
            return self._tolist(x)
        torch.Tensor.tolist = counted_tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        boolean_index = func in (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default) and any(
            i is not None and i.dtype == torch.bool for i in args[1])
        if str(func) in self.SYNCING or boolean_index:
            self.calls.append(str(func))
        elif str(func) in self.MATMULS and not self.calls:
            self.matmuls_before += 1
        return func(*args, **(kwargs or {}))


def test_sync_counter_sees_the_syncing_ops():
    x = torch.tensor([1.0, -1.0, 2.0])
    with SyncCounter() as c:
        x.nonzero(), x[x > 0], x.sum().item(), x.tolist(), bool(x[0] > 0)
        x[torch.tensor([0, 2])], x.argsort(stable=True), x.cumsum(0)                   # no sync
    assert len(c.calls) == 5, c.calls
    assert x.tolist() == [1.0, -1.0, 2.0] and len(c.calls) == 5                         # unpatched after


@pytest.mark.parametrize("chunk", [0, 4096])
def test_forward_makes_one_host_sync(chunk):
    """K = 5 steps, one sync (the counts of counted positions, one .tolist()), before any draft matmul."""
    draft, args = _counting_case()
    unroll = TTTUnroll(draft, 5, loss_chunk=chunk)
    with SyncCounter() as c:
        unroll(*args)
    assert c.calls == ["tolist"] and c.matmuls_before == 0
    with SyncCounter() as c:
        _forward_before_counted_positions(unroll, *args)
    assert len(c.calls) == 5 * (1 if chunk else 3)     # what it replaces: a nonzero, or 3 boolean indexings, a step
    assert c.matmuls_before > 0


@pytest.mark.skipif(BlockMask is None, reason="no FlexAttention")
def test_block_masks_are_built_without_a_sync():
    doc = document_ids(torch.cat([torch.arange(150), torch.arange(106)])[None].expand(2, 256))
    with SyncCounter() as c:
        masks = TTTBlockMasks(doc, 64)
        [masks(k) for k in range(7)]
    assert c.calls == []
