"""The parallel drafters compute one thing three ways, which must agree: a rollout run alone (the definition),
the batched training forward (COD rows / anchored blocks under one mask, dense or FlexAttention) and the
decoding proposer (static caches, catch-up then one forward)."""

import pytest
import torch

from eyas.decode.tree import TreeSpec
from eyas.drafters.dflash.objective import DFlashObjective, sample_anchors
from eyas.draft.kinds import get_kind
from eyas.drafters.p_eagle.objective import PEagleObjective, cod_capacity, cod_layout
from tests.draft.test_parallel_models import HT, V, make

K = 4


def packed(B=2, T=18, seed=0):
    """Two documents per row (position ids restart), every token counted."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V - 1, (B, T), generator=g)
    pos = torch.cat([torch.arange(7), torch.arange(T - 7)])[None].expand(B, T).clone()
    aux = torch.randn(B, T, 3, HT, generator=g)
    ones = torch.ones(B, T, dtype=torch.bool)
    return ids, pos, ones, aux, ones


def doc_start(pos_row, t):
    s = t
    while s > 0 and pos_row[s] == pos_row[s - 1] + 1:
        s -= 1
    return s


def p_eagle_alone(draft, ids, pos, aux, b, t, d):
    """Rollout (t, d) by itself: its document's base rows up to t, then d mask rows; the last row's hidden."""
    s0 = doc_start(pos[b], t)
    toks = torch.cat([ids[b, s0 + 1:t + 2], torch.full((d,), draft.config.mask_token_id)])
    hid = torch.cat([draft.combine(aux[b, s0:t + 1]), draft.mask_state().expand(d, -1)])
    p = torch.cat([pos[b, s0:t + 1], pos[b, t] + 1 + torch.arange(d)])
    return draft(toks[None], hid[None], p[None])[0][0, -1]


def test_cod_layout_nests_its_rollouts():
    torch.manual_seed(0)
    valid = torch.rand(6, 2, 40) > 0.1
    anchor, depth = cod_layout(valid, anchors=20)
    for b in range(2):
        kept = {d: set(anchor[b][depth[b] == d].tolist()) for d in range(1, 6)}
        assert len(kept[1]) <= 20
        for d in range(2, 6):
            assert kept[d] <= kept[d - 1] and all(valid[d, b, t] for t in kept[d])
            assert len(kept[d]) <= max(1, int(valid[0, b].sum() * max(0.7 ** d, 0.2)))
        assert (anchor[b, :40] == torch.arange(40)).all() and (depth[b, :40] == 0).all()


@pytest.mark.parametrize("attention", ["dense", "flex"])
def test_p_eagle_training_rows_equal_rollouts_run_alone(attention):
    draft, _ = make("p-eagle", K=K)
    ids, pos, lm, aux, iv = packed()
    torch.manual_seed(3)
    with torch.no_grad():
        pre, anchor, depth, counted = PEagleObjective(draft, K, attention=attention).rows(ids, pos, lm, aux, iv)
        checked = 0
        for b in range(2):
            for i in range(pre.shape[1]):
                if counted[b, i] and (depth[b, i] > 0 or i % 5 == 0):
                    t, d = int(anchor[b, i]), int(depth[b, i])
                    torch.testing.assert_close(pre[b, i], p_eagle_alone(draft, ids, pos, aux, b, t, d),
                                               rtol=1e-4, atol=1e-4)
                    checked += 1
    assert checked > 20 and int(depth.max()) == K - 1


def dflash_alone(draft, ids, pos, aux, b, t):
    """Block at anchor t by itself: context = its document up to t, block = [x_{t+1}, mask x K]."""
    s0 = doc_start(pos[b], t)
    blk = torch.cat([ids[b, t + 1:t + 2], torch.full((K,), draft.config.mask_token_id)])
    ctx = aux[b, s0:t + 1]
    mask = torch.ones(1, 1, K + 1, ctx.shape[0] + K + 1, dtype=torch.bool)
    return draft(blk[None], (pos[b, t] + 1 + torch.arange(K + 1))[None], context=draft.context(ctx)[None],
                 context_positions=pos[b, s0:t + 1][None], mask=mask)[0]


@pytest.mark.parametrize("attention", ["dense", "flex"])
def test_dflash_training_blocks_equal_blocks_run_alone(attention):
    draft, _ = make("dflash", K=K, layers=2)
    ids, pos, lm, aux, iv = packed()
    torch.manual_seed(3)
    with torch.no_grad():
        pre, anchor, counts = DFlashObjective(draft, K, 0.8, attention=attention, anchors=5).rows(ids, pos, lm, aux, iv)
        assert anchor.shape[1] == 5
        for b in range(2):
            for a in range(5):
                t = int(anchor[b, a])
                got = pre[b, a * (K + 1):(a + 1) * (K + 1)]
                torch.testing.assert_close(got, dflash_alone(draft, ids, pos, aux, b, t), rtol=1e-4, atol=1e-4)
                # a mask row counts only while its target lies in the anchor's document
                assert counts[b, a].tolist() == [pos[b, t] + 2 + k < (7 if t < 7 else 11) for k in range(K)]


def test_anchor_sampling_caps_and_sorts():
    torch.manual_seed(0)
    first = torch.zeros(2, 30, dtype=torch.bool)
    first[0, ::2] = True
    first[1, 3] = True
    a = sample_anchors(first, 6)
    assert a.shape == (2, 6) and (a[0] == a[0].sort().values).all() and first[0, a[0]].all()
    assert a[1].tolist() == [3, -1, -1, -1, -1, -1]


@pytest.mark.parametrize("kind", ["p-eagle", "dflash"])
def test_proposer_levels_equal_the_forward_run_alone(kind):
    """After a prefill and one round of accepted rows, the proposer's per-depth top-k is the rollout from the
    last committed token run alone."""
    draft, _ = make(kind, K=K)
    n = 12
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, V - 1, (n + 1,), generator=g).tolist()          # n verified positions + the bonus
    aux = torch.randn(n, 3, HT, generator=g)
    spec = TreeSpec(total=10, depth=K, topk=3)
    prop = get_kind(kind).proposer(draft, spec, 64)
    prop.observe(seq[:n - 2], aux[:n - 3], 0)                              # prefill
    prop.propose()                                                         # its tree (P-EAGLE: its last row's KV)
    prop.observe(seq, aux[n - 3:], n - 3)                                  # a round: 3 accepted rows
    with torch.no_grad():
        lp, ids = prop._levels(torch.tensor(n + 1), torch.tensor(seq + [0] * 8))
        ids1, pos1, aux1 = torch.tensor(seq)[None], torch.arange(n + 1)[None], aux[None]
        if kind == "p-eagle":
            pre = torch.stack([p_eagle_alone(draft, ids1, pos1, aux1, 0, n - 1, d) for d in range(K)])
        else:
            pre = dflash_alone(draft, ids1, pos1, aux1, 0, n - 1)[1:]
        want = torch.log_softmax(draft.logits(pre).float(), -1).topk(3, -1)
    torch.testing.assert_close(lp, want.values, rtol=1e-4, atol=1e-4)
    assert torch.equal(ids, draft.to_target_ids(want.indices))


def test_dflash_refuses_a_tree_deeper_than_its_block():
    draft, _ = make("dflash", K=3)
    with pytest.raises(ValueError, match="block size 4"):
        get_kind("dflash").proposer(draft, TreeSpec.chain(4), 64)


@pytest.mark.parametrize("kind", ["p-eagle", "dflash"])
def test_static_shapes_pad_without_changing_the_loss(kind):
    """Compiled training pads to one shape per step (COD's capacity / `anchors` blocks): the padding counts nothing."""
    draft, _ = make(kind, K=K, layers=2)
    ids, pos, lm, aux, iv = packed()
    T = ids.shape[1]
    probs = torch.softmax(torch.randn(2, T, V), -1)
    arg = probs.argmax(-1)
    obj = get_kind(kind).objective(draft, steps=K, decay=0.8, attention="dense", compile_loss=False, anchors=20)
    out = []
    for static in (False, True):
        obj.static_shapes = static
        torch.manual_seed(5)
        with torch.no_grad():
            out.append((obj(ids, pos, lm, aux, probs, iv, arg), obj.rows(ids, pos, lm, aux, iv)[0].shape))
            torch.manual_seed(5)
    (loss_a, stats_a), shape_a = out[0]
    (loss_b, stats_b), shape_b = out[1]
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(stats_a, stats_b)
    assert shape_b[1] > shape_a[1]
    if kind == "p-eagle":
        assert shape_b[1] == T + cod_capacity(T, K, anchors=20)
    else:
        assert shape_b[1] == 20 * (K + 1)


@pytest.mark.parametrize("attention", ["dense", "flex"])
@pytest.mark.parametrize("kind", ["p-eagle", "dflash"])
def test_objectives_run_under_bf16_autocast(kind, attention):
    """GPU training's default (fp32 master weights, bf16 autocast): forward and backward, on the CPU's autocast;
    FlexAttention (not autocast-aware) needs q, k and v in one dtype."""
    draft, _ = make(kind, K=K, layers=2)
    draft.train()
    ids, pos, lm, aux, iv = packed()
    probs = torch.softmax(torch.randn(2, ids.shape[1], V), -1)
    obj = get_kind(kind).objective(draft, steps=K, decay=0.8, attention=attention, compile_loss=False, anchors=6)
    backward = attention == "dense"                  # FlexAttention has no CPU backward
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.set_grad_enabled(backward):
        loss, stats = obj(ids, pos, lm, aux, probs, iv, probs.argmax(-1))
    assert torch.isfinite(loss) and stats[:, 2].sum() > 0
    if backward:
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in draft.parameters() if p.requires_grad)
