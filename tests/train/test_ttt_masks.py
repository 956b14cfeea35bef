"""TTT masks (train/masks.py): the dense mask, the create_block_mask reference, and the direct block-grid
construction that training uses, which must be the reference's BlockMask block for block."""

import pytest
import torch
import torch.nn.functional as F

from eyas.train.masks import (BlockMask, TTTBlockMasks, document_ids, ttt_block_mask_reference,
                              ttt_dense_mask)

needs_flex = pytest.mark.skipif(BlockMask is None, reason="no FlexAttention")


def packed_positions(B: int, T: int, g: torch.Generator) -> torch.Tensor:
    """Random packed rows: each row its own number of documents (1 up to ~T/3); row 0 unpadded, odd rows end in
    a padding document (collate's arange), other rows in single-token padding documents (position 0 repeated)."""
    rows = []
    for b in range(B):
        pad = int(torch.randint(0, T // 3 + 1, (1,), generator=g)) if b else 0
        used, pos = T - pad, []
        longest = max(1, used // int(torch.randint(1, max(2, T // 3), (1,), generator=g)))
        while len(pos) < used:
            pos += range(min(int(torch.randint(1, longest + 1, (1,), generator=g)), used - len(pos)))
        tail = list(range(pad)) if b % 2 else [0] * pad
        rows.append(pos + tail)
    return torch.tensor(rows)


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


def _blocks(m, which: str) -> torch.Tensor:
    """The partial or full block grid of a BlockMask as a dense [B, 1, nQ, nKV] int tensor."""
    one = BlockMask.from_kv_blocks(getattr(m, which + "num_blocks"), getattr(m, which + "indices"),
                                   BLOCK_SIZE=m.BLOCK_SIZE, seq_lengths=m.seq_lengths)
    return one.to_dense()


@needs_flex
@pytest.mark.parametrize("T,bs", [(128, 128), (256, 128), (384, 128), (200, 128), (333, 128), (200, 64),
                                  (333, 32), (96, 16), (7, 4)])
@pytest.mark.parametrize("B", [1, 3])
def test_direct_block_masks_equal_create_block_mask(T, bs, B):
    g = torch.Generator().manual_seed(T * 7 + bs + B)
    for _ in range(2):
        doc = document_ids(packed_positions(B, T, g))
        masks = TTTBlockMasks(doc, bs)
        for k in range(7):
            new, ref = masks(k), ttt_block_mask_reference(doc, k, block_size=bs)
            assert new.seq_lengths == ref.seq_lengths == (T, (k + 1) * T) and new.BLOCK_SIZE == ref.BLOCK_SIZE
            assert new.kv_indices.shape == ref.kv_indices.shape
            assert torch.equal(new.to_dense(), ref.to_dense()), (T, bs, B, k)
            # the same split into partial and full blocks: as sparse, and as many blocks skip mask_mod
            assert torch.equal(new.kv_num_blocks, ref.kv_num_blocks), k
            assert torch.equal(new.full_kv_num_blocks, ref.full_kv_num_blocks), k
            assert torch.equal(_blocks(new, "kv_"), _blocks(ref, "kv_")), k
            assert torch.equal(_blocks(new, "full_kv_"), _blocks(ref, "full_kv_")), k
            assert torch.equal(new.q_num_blocks, ref.q_num_blocks) and torch.equal(new.q_indices, ref.q_indices)


def _kernel_view(m: BlockMask) -> torch.Tensor:
    """bool [B, 1, T, KV]: what a block-sparse kernel attends with `m`. Full blocks: every pair; partial
    blocks: mask_mod; unlisted blocks: nothing (eager flex_attention applies mask_mod everywhere instead)."""
    (T, KV), (bq, bk) = m.seq_lengths, m.BLOCK_SIZE
    grow = lambda x: x.repeat_interleave(bq, -2).repeat_interleave(bk, -1)[..., :T, :KV].bool()  # noqa: E731
    B = m.kv_num_blocks.shape[0]
    b, q, kv = torch.arange(B)[:, None, None], torch.arange(T)[None, :, None], torch.arange(KV)[None, None, :]
    mod = m.mask_mod(b, torch.zeros_like(b), q, kv)[:, None]
    return grow(_blocks(m, "full_kv_")) | (grow(_blocks(m, "kv_")) & mod)


@needs_flex
@pytest.mark.parametrize("T,bs", [(200, 64), (333, 32), (256, 64), (9, 4)])
def test_direct_block_masks_attend_exactly_the_dense_mask(T, bs):
    g = torch.Generator().manual_seed(T + bs)
    doc = document_ids(packed_positions(3, T, g))
    masks = TTTBlockMasks(doc, bs)
    for k in range(7):
        assert torch.equal(_kernel_view(masks(k)), ttt_dense_mask(doc, k)), k


def _attention_case(pos, k, g):
    doc = document_ids(pos)
    B, T = pos.shape
    q = torch.randn(B, 4, T, 16, generator=g)
    kv = [torch.randn(B, 2, (k + 1) * T, 16, generator=g) for _ in range(2)]
    rep = [x.repeat_interleave(2, dim=1) for x in kv]
    dense = F.scaled_dot_product_attention(q, *rep, attn_mask=ttt_dense_mask(doc, k))
    return doc, q, kv, dense


@needs_flex
def test_eager_flex_attention_with_direct_mask_equals_dense_attention():
    from torch.nn.attention.flex_attention import flex_attention
    g = torch.Generator().manual_seed(3)
    for B, T, k in ((1, 40, 0), (3, 37, 3), (2, 64, 6)):
        doc, q, kv, dense = _attention_case(packed_positions(B, T, g), k, g)
        out = flex_attention(q, *kv, block_mask=TTTBlockMasks(doc, block_size=16)(k), enable_gqa=True)
        torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@needs_flex
def test_compiled_flex_attention_uses_the_direct_blocks():
    """Compiled (inductor's CPU template) flex attention skips unlisted blocks and runs full blocks without
    mask_mod, so it checks the block lists themselves; dropping one block must change the output."""
    from torch.nn.attention.flex_attention import flex_attention
    flex = torch.compile(flex_attention)
    g = torch.Generator().manual_seed(5)
    pos = torch.cat([torch.arange(40), torch.arange(200), torch.arange(93)]).expand(2, 333).clone()
    pos[1, 150:] = torch.arange(183)                                     # long documents: some full blocks
    doc, q, kv, dense = _attention_case(pos, 2, g)
    m = TTTBlockMasks(doc, block_size=64)(2)
    assert int(m.full_kv_num_blocks.sum()) > 0
    torch.testing.assert_close(flex(q, *kv, block_mask=m, enable_gqa=True), dense, rtol=1e-5, atol=1e-5)
    fewer = m.kv_num_blocks.clone()
    fewer[:, :, -1] -= 1
    dropped = BlockMask.from_kv_blocks(fewer, m.kv_indices, m.full_kv_num_blocks, m.full_kv_indices,
                                       BLOCK_SIZE=64, mask_mod=m.mask_mod, seq_lengths=m.seq_lengths)
    assert (flex(q, *kv, block_mask=dropped, enable_gqa=True) - dense).abs().max() > 1e-3


@needs_flex
def test_block_size_one_is_refused():
    with pytest.raises(ValueError, match="block_size"):
        TTTBlockMasks(torch.ones(1, 4, dtype=torch.long), 1)


@pytest.mark.slow
@needs_flex
def test_compiled_block_mask_creation_equals_eager():
    """Long rows build the reference BlockMask compiled (no [T, KT] int64 grid); it must be the same mask."""
    pos = torch.cat([torch.arange(150), torch.arange(106)])[None]
    doc = document_ids(pos)
    for k in (0, 2):
        a = ttt_block_mask_reference(doc, k, block_size=64, compile_mask=False)
        b = ttt_block_mask_reference(doc, k, block_size=64, compile_mask=True)
        assert torch.equal(a.to_dense(), b.to_dense()), k
