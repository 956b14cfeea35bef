"""Draft vocabulary: top-N by frequency, numbered by target id, d2t offsets / t2d mask as vLLM reads them."""

from __future__ import annotations

import pytest
import torch

from eyas.data import build_draft_vocab, check_draft_vocab


def test_top_tokens_sorted_by_target_id():
    freq = torch.tensor([5, 0, 9, 1, 9, 3, 0, 7])
    d2t, t2d, cov = build_draft_vocab(freq, 4)
    target = torch.arange(4) + d2t
    assert target.tolist() == [0, 2, 4, 7]  # the 4 most frequent ids, ascending
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert t2d.nonzero().flatten().tolist() == [0, 2, 4, 7]
    assert cov == pytest.approx((5 + 9 + 9 + 7) / 34)
    assert check_draft_vocab(d2t, t2d) == []


def test_size_capped_at_vocab_and_ties_go_to_lower_ids():
    freq = torch.tensor([0, 2, 0, 2])
    d2t, t2d, cov = build_draft_vocab(freq, 100)
    assert d2t.numel() == 4 and bool(t2d.all()) and cov == 1.0
    d2t, _, _ = build_draft_vocab(freq, 3)
    assert (torch.arange(3) + d2t).tolist() == [0, 1, 3]  # 1 and 3 by count, then 0 (lowest unseen id)


def test_empty_counts_and_bad_sizes():
    d2t, t2d, cov = build_draft_vocab(torch.zeros(10, dtype=torch.int64), 4)
    assert cov == 0.0 and d2t.numel() == 4
    with pytest.raises(ValueError, match="size"):
        build_draft_vocab(torch.ones(4), 0)


def test_check_names_inconsistencies():
    d2t, t2d, _ = build_draft_vocab(torch.tensor([3, 1, 2, 0]), 2)
    t2d[3] = True
    assert any("t2d marks" in p for p in check_draft_vocab(d2t, t2d))
    assert any("int64" in p for p in check_draft_vocab(d2t.to(torch.int32), t2d))
