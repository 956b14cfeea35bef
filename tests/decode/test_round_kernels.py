"""The round's kernel-saving pieces equal what they replace: the two-stage top-k equals torch.topk,
and SlotCache's one all-layer KV buffer equals per-layer buffers (writes and compaction)."""

import pytest
import torch
from conftest import random_draft, tiny_gemma3, tiny_llama, tiny_moe

import eyas.decode.proposer as proposer_module
from eyas.decode.proposer import EagleProposer
from eyas.decode.target_step import SlotCache, TargetRunner
from eyas.decode.topk import WIDE, _chunk, topk_rows
from eyas.decode.tree import TreeSpec


def check_topk(x, k):
    v, i = topk_rows(x, k)
    rv, ri = x.topk(k, dim=-1)
    assert v.shape == i.shape == rv.shape and i.dtype == torch.long
    assert torch.equal(v, rv)                                   # values exactly, in torch's order
    assert torch.equal(x.gather(-1, i), v)                      # indices point at those values
    assert (i.sort(-1).values.diff(dim=-1) > 0).all()           # no index twice
    unique = (x[..., None, :] == rv[..., :, None]).sum(-1) == 1  # indices are only defined without ties
    assert torch.equal(i[unique], ri[unique])


@pytest.mark.parametrize("shape", [(10, 16384), (1, 16384), (3, 2, 5000), (7, 49152 + 13), (4, 4097), (2, 300), (16,)])
@pytest.mark.parametrize("k", [1, 4, 10])
def test_topk_rows_equals_torch_topk(shape, k):
    g = torch.Generator().manual_seed(shape[-1] + k)
    x = torch.randn(shape, generator=g)
    check_topk(x, k)
    check_topk(torch.log_softmax(x * 5, dim=-1), k)           # what the proposer feeds it
    y = x.clone()
    y[..., ::3] = float("-inf")                                 # -inf entries, ties among them
    check_topk(y, k)
    y.fill_(float("-inf"))
    y[..., -1] = 1.0                                            # the winner in the tail: the rest all -inf
    v, i = topk_rows(y, k)
    assert torch.equal(v, y.topk(k, dim=-1).values) and (i[..., 0] == shape[-1] - 1).all()
    assert (i >= 0).all() and (i < shape[-1]).all()


def test_topk_rows_takes_two_stages_where_wide():
    assert _chunk(WIDE - 1, 10) is None and _chunk(16384, 10) == 512 and _chunk(16384, 4) == 256
    assert 16384 % _chunk(16384, 10) == 0 and (49152 + 13) % _chunk(49152 + 13, 10) != 0  # both paths tested


def test_topk_rows_traces_as_one_graph():
    """CPU proxy for 'capturable in a CUDA graph': one dynamo graph, no host reads."""
    torch._dynamo.reset()
    f = torch.compile(lambda x: topk_rows(x, 10), fullgraph=True, dynamic=False, backend="eager")
    x = torch.randn(10, 16384 + 5)
    assert torch.equal(f(x)[0], x.topk(10).values)
    torch._dynamo.reset()


def fill_and_compact(cache, n_layers, seed):
    g = torch.Generator().manual_seed(seed)
    nkv, d = 2, 16
    cache.slots = torch.arange(0, 12)
    for layer in range(n_layers):
        cache.update(torch.randn(1, nkv, 12, d, generator=g), torch.randn(1, nkv, 12, d, generator=g), layer)
    cache.slots = torch.tensor([20, 3, 7])
    for layer in range(n_layers):
        cache.update(torch.randn(1, nkv, 3, d, generator=g), torch.randn(1, nkv, 3, d, generator=g), layer)
    cache.compact(torch.tensor([5, 9, 20, 10]), torch.tensor([5, 6, 7, 8]))   # overlapping, one in place
    return list(zip(cache.kbuf, cache.vbuf))


@pytest.mark.parametrize("make", [tiny_llama, tiny_moe, tiny_gemma3])
def test_one_kv_buffer_equals_per_layer_buffers(make):
    cfg = make().config
    n = len(SlotCache(cfg, 32).layers)
    one, per = SlotCache(cfg, 32), SlotCache(cfg, 32, shared=False)
    a, b = fill_and_compact(one, n, 0), fill_and_compact(per, n, 0)
    assert one.kv is not None and all(one.in_kv)
    assert [k.data_ptr() for k in one.kbuf] == [one.kv[i, 0].data_ptr() for i in range(n)]
    assert per.kv is None and not any(per.in_kv)
    for (ka, va), (kb, vb) in zip(a, b, strict=True):
        assert torch.equal(ka, kb) and torch.equal(va, vb)
        assert ka.is_contiguous() and ka.data_ptr() != va.data_ptr()


def test_layers_of_another_shape_keep_their_own_buffers():
    cache = SlotCache(tiny_llama().config, 32)                  # promises 2 KV heads of 16 for 4 layers
    cache.slots = torch.arange(4)
    for layer, d in enumerate([16, 8, 16, 16]):
        cache.update(torch.randn(1, 2, 4, d), torch.randn(1, 2, 4, d), layer)
    assert cache.in_kv == [True, False, True, True] and cache.kbuf[1].shape == (1, 2, 32, 8)
    k1 = cache.kbuf[1].clone()
    cache.compact(torch.tensor([2, 3]), torch.tensor([0, 1]))
    assert torch.equal(cache.kbuf[1][:, :, :2], k1[:, :, 2:4])
    assert torch.equal(cache.kv[0, 0, :, :, :2], cache.kv[0, 0, :, :, 2:4])


def test_proposer_trees_equal_with_torch_topk(monkeypatch):
    """End to end over a draft vocabulary wide enough for two stages: the trees torch.topk gives."""
    model = tiny_llama(vocab=3 * WIDE + 7, layers=2)
    draft, target = random_draft(model, scale=4.0)
    assert _chunk(draft.config.draft_vocab_size, 5) is not None
    runner = TargetRunner(model, target.layout, draft.config.aux_layer_ids, 64)
    seq = [5, 17, 300, 4000, 12]
    with torch.no_grad():
        _, aux = runner.step(torch.tensor(seq), torch.arange(5), torch.arange(5), torch.tensor(0),
                             torch.ones(5, 5, dtype=torch.bool).tril(), eager=True)
    trees = []
    for fn in (topk_rows, lambda x, k: x.topk(k, dim=-1)):
        monkeypatch.setattr(proposer_module, "topk_rows", fn)
        prop = EagleProposer(draft, TreeSpec(total=20, depth=4, topk=5), 64)
        prop.observe(seq + [7], aux, 0)
        t = prop.propose()
        trees.append((t.tokens, t.parents, t.scores))
    assert trees[0] == trees[1] and len(trees[0][0]) == 20
