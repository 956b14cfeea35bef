import pytest
import torch

from eyas.draft.model import Eagle3Draft, draft_config_from_target
from eyas.train.ttt import (TargetHead, TTTUnroll, document_ids, simulated_tau, step_valid, ttt_block_mask,
                            ttt_dense_mask)
from tests.train.fakes import AUX, tiny_target


def test_document_ids_restart_on_position_reset():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert document_ids(pos).tolist() == [[1, 1, 1, 2, 2, 3, 3, 3, 3]]


def test_dense_mask_matches_brute_force():
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2], [0, 1, 0, 1, 2, 3, 4]])
    doc = document_ids(pos)
    T = pos.shape[1]
    for k in range(3):
        m = ttt_dense_mask(doc, k)
        assert m.shape == (2, 1, T, (k + 1) * T)
        for b in range(2):
            for q in range(T):
                for kv in range((k + 1) * T):
                    step, s = divmod(kv, T)
                    want = (s <= q and doc[b, s] == doc[b, q]) if step == 0 else s == q
                    assert bool(m[b, 0, q, kv]) == want, (b, q, kv)


@pytest.mark.skipif(ttt_block_mask is None, reason="no FlexAttention")
def test_flex_block_mask_equals_dense_in_the_unroll():
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


@pytest.mark.slow
@pytest.mark.skipif(ttt_block_mask is None, reason="no FlexAttention")
def test_compiled_block_mask_creation_equals_eager():
    """Long rows build the BlockMask compiled (no [T, KT] int64 grid); it must be the same mask."""
    pos = torch.cat([torch.arange(150), torch.arange(106)])[None]
    doc = document_ids(pos)
    for k in (0, 2):
        a = ttt_block_mask(doc, k, block_size=64, compile_mask=False)
        b = ttt_block_mask(doc, k, block_size=64, compile_mask=True)
        assert torch.equal(a.to_dense(), b.to_dense()), k
