"""One draft level as the proposer now runs it (this call's k/v written into the static cache, attention
over the cache in place, GQA by grouping query heads) equals the level it replaced (attention over
cat(cache, this call's k/v) with K/V repeated per query head), which copied the whole cache, x nh/nkv,
on every level. fp32 on CPU: grouping the heads is bit-identical; attending in place moves this call's
keys to their slots, so the softmax sums run in another order (a few ulps); KV writes are bit-identical."""

import pytest
import torch
import torch.nn.functional as F
from conftest import random_draft, tiny_llama

import eyas.decode.proposer as proposer_module
from eyas.decode.proposer import EagleProposer
from eyas.decode.tree import TreeSpec
from eyas.draft.model import Attention, Eagle3Draft, draft_config_from_target


def old_step(self, *args, **kw):
    """EagleProposer._step through its escape hatch (EYAS_DRAFT_CACHE=copy): the level before the in-place
    cache (commit bbc08b6) — attention over cat(cache, new k/v), then the k/v written."""
    was = proposer_module._CACHE_COPY
    proposer_module._CACHE_COPY = True
    try:
        return EagleProposer._step(self, *args, **kw)
    finally:
        proposer_module._CACHE_COPY = was


def gqa_draft(heads=8, kv_heads=2):
    """A draft with nh/nkv = 4 (Llama-3.1-8B's ratio); conftest's tiny drafts have 2."""
    from transformers import LlamaConfig
    torch.manual_seed(5)
    tcfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=heads, num_key_value_heads=kv_heads)
    d = Eagle3Draft(draft_config_from_target(tcfg, aux_layer_ids=[1, 2, 3]))
    with torch.no_grad():
        for p in d.parameters():
            p.normal_(0.0, 0.3)
    return d.eval()


def drafts():
    return {"rep2": random_draft(tiny_llama(), scale=3.0)[0], "rep4": gqa_draft()}


def level_args(prop, k, lvl, g):
    """Level `lvl` (1-based) of a tree round: k rows at their scratch slots, seeing random earlier-level slots."""
    H = prop.draft.config.hidden_size
    anc = torch.zeros(k, prop.S, dtype=torch.bool)
    anc[:, :(lvl - 1) * k] = torch.rand(k, (lvl - 1) * k, generator=g) < 0.4
    return dict(tokens=torch.randint(0, 96, (k,), generator=g), hidden=torch.randn(k, H, generator=g),
                positions=torch.full((k,), 30 + lvl), write=prop.scratch + (lvl - 1) * k + torch.arange(k),
                ctx_len=torch.tensor(30), anc=anc, self_mask=torch.eye(k, dtype=torch.bool), pick=torch.arange(k))


def catchup_args(prop, m, g):
    """The catch-up's rows: m real rows at start.., pads at junk slots (as _catchup builds them)."""
    rows, H, start = prop.pad, prop.draft.config.hidden_size, 27
    ar = torch.arange(rows)
    real = ar < m
    self_mask = ((ar[:, None] >= ar[None, :]) & real[None, :]) | torch.eye(rows, dtype=torch.bool)
    return dict(tokens=torch.randint(0, 96, (rows,), generator=g), hidden=torch.randn(rows, H, generator=g),
                positions=start + ar, write=torch.where(real, start + ar, prop.junk + ar), ctx_len=torch.tensor(start),
                anc=torch.zeros(rows, prop.S, dtype=torch.bool), self_mask=self_mask, pick=torch.tensor([m - 1]))


@pytest.mark.parametrize("name", ["rep2", "rep4"])
@pytest.mark.parametrize("case", ["level1", "level3", "catchup"])
def test_level_in_place_equals_concatenated_cache(name, case):
    draft = drafts()[name]
    k = 4
    prop = EagleProposer(draft, TreeSpec(total=20, depth=5, topk=k), 48)
    g = torch.Generator().manual_seed(11)
    prop.kbuf.copy_(torch.randn(prop.kbuf.shape, generator=g))  # stale junk everywhere: masks must hide it
    prop.vbuf.copy_(torch.randn(prop.vbuf.shape, generator=g))
    args = catchup_args(prop, 3, g) if case == "catchup" else level_args(prop, k, int(case[-1]), g)
    kv0 = prop.kbuf.clone(), prop.vbuf.clone()
    with torch.no_grad():
        ref = old_step(prop, **args)
        ref_kv = prop.kbuf.clone(), prop.vbuf.clone()
        prop.kbuf.copy_(kv0[0])
        prop.vbuf.copy_(kv0[1])
        got = prop._step(**args)
    assert torch.equal(prop.kbuf, ref_kv[0]) and torch.equal(prop.vbuf, ref_kv[1])
    for a, b in zip(got[:2], ref[:2]):  # pre, top-k log-probs: fp32 summation order only (a few ulps of the scale)
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6 * float(b.abs().max()))
    assert torch.equal(got[2], ref[2])                                   # top-k token ids


@pytest.mark.parametrize("name", ["rep2", "rep4"])
def test_grouped_query_attention_equals_repeated_kv(name):
    # Bit identity held on one CPU and not on another (AMD EPYC: 1 ulp, from the kernel's row blocking), so the
    # bound is a few fp32 ulps of the output scale: a wrong head/row mapping is off by O(1).
    at = drafts()[name].layers[0].self_attn
    g = torch.Generator().manual_seed(2)
    B, T, S = 2, 5, 37
    q = torch.randn(B, T, at.nh, at.d, generator=g).transpose(1, 2)      # strided, as the projections give it
    k, v = (torch.randn(B, at.nkv, S, at.d, generator=g) for _ in range(2))
    mask = torch.rand(B, 1, T, S, generator=g) < 0.6
    mask[..., 0] = True
    rep = at.nh // at.nkv
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask)
    got = Attention._grouped_sdpa(at, q, k, v, mask)
    torch.testing.assert_close(got, ref, rtol=0, atol=4 * torch.finfo(ref.dtype).eps * float(ref.abs().max()))


def test_tree_round_equals_concatenated_cache(monkeypatch):
    """A whole round (catch-up, then every level of the tree) with the old and the new level: same trees."""
    draft = drafts()["rep4"]
    spec = TreeSpec(total=20, depth=5, topk=4)
    aux = torch.randn(12, 3, 64, generator=torch.Generator().manual_seed(4))
    seq = list(range(10, 23))
    out = []
    for copy in (True, False):
        monkeypatch.setattr(proposer_module, "_CACHE_COPY", copy)
        prop = EagleProposer(draft, spec, 48)
        with torch.no_grad():
            prop.observe(seq, aux[:9], 0)
            prop.observe(seq, aux[9:12], 9)  # a round's catch-up (padded to the static shape)
            t = prop.propose()
        out.append(t)
    assert out[0].tokens == out[1].tokens and out[0].parents == out[1].parents
    torch.testing.assert_close(out[0].scores, out[1].scores, rtol=0, atol=2e-6 * max(map(abs, out[0].scores)))


def test_grouped_query_attention_takes_any_output_layout(monkeypatch):
    # CUDA's fused SDPA kernels return [B, H, T, d] laid out as [B, T, H, d] (strided); the CPU math path returns
    # it contiguous. A .view on that output broke the draft level on the H200 only (2026-12-01): emulate it here.
    at = drafts()["rep2"].layers[0].self_attn
    g = torch.Generator().manual_seed(3)
    B, T, S = 2, 4, 19
    q = torch.randn(B, at.nh, T, at.d, generator=g)
    k, v = (torch.randn(B, at.nkv, S, at.d, generator=g) for _ in range(2))
    mask = torch.ones(B, 1, T, S, dtype=torch.bool)
    ref = Attention._grouped_sdpa(at, q, k, v, mask)
    sdpa = F.scaled_dot_product_attention

    def strided_sdpa(*a, **kw):
        o = sdpa(*a, **kw)
        return o.transpose(1, 2).contiguous().transpose(1, 2)             # same values, CUDA's memory layout
    monkeypatch.setattr(F, "scaled_dot_product_attention", strided_sdpa)
    got = Attention._grouped_sdpa(at, q, k, v, mask)
    torch.testing.assert_close(got, ref, rtol=0, atol=4 * torch.finfo(ref.dtype).eps * float(ref.abs().max()))
