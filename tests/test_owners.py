"""The owner modules on their own: aux layer ids, the draft vocabulary, device and dtype resolution."""

import pytest
import torch

from eyas.aux_layers import (AuxLayerIdsError, aux_layer_id_problems, check_aux_layer_ids, choose_aux_layer_ids,
                              resolve_aux_layer_ids)
from eyas.devices import DTYPE_TABLE, DeviceError, dtype_bytes, dtype_name, resolve_device, resolve_dtype
from eyas.vocab import (DraftVocabError, build_draft_vocab, check_draft_vocab, full_vocab, require_draft_vocab,
                        target_ids, vocab_from_target_ids)


def test_aux_rules_each_name_their_reason():
    assert aux_layer_id_problems([2, 4, 5], 6) == []
    assert "explicit non-empty list" in aux_layer_id_problems([], 6)[0]
    assert "explicit non-empty list" in aux_layer_id_problems([1, True], 6)[0]
    assert "strictly increasing" in aux_layer_id_problems([2, 2, 5], 6)[0]
    assert "[-1] out of range" in aux_layer_id_problems([-1, 2], None)[0]
    assert "[6] out of range: the target has 6" in aux_layer_id_problems([2, 6], 6)[0]
    assert "fc.weight takes 96" in aux_layer_id_problems([1, 2], fc_in=96, hidden_size=32)[0]
    with pytest.raises(AuxLayerIdsError, match="strictly increasing.*; .*out of range"):
        check_aux_layer_ids([9, 2], 6)


def test_aux_resolution_order_and_contradiction():
    assert resolve_aux_layer_ids(None, 32) == [2, 16, 29]
    assert resolve_aux_layer_ids(None, 32, recorded=[1, 2, 3]) == [1, 2, 3]
    assert resolve_aux_layer_ids([1, 2, 3], 32, recorded=[1, 2, 3]) == [1, 2, 3]
    assert choose_aux_layer_ids(None, 32, recorded=[9, 1], recorded_where="the draft") == ([9, 1], "the draft")
    assert choose_aux_layer_ids([4], 32, recorded=[1]) == ([4], "--aux-layer-ids")   # unchecked: the caller judges
    assert choose_aux_layer_ids(None, 32)[1] == "default (2, N//2, N-3)"
    with pytest.raises(AuxLayerIdsError, match=r"differ from the aux ids \[4, 5, 6\] recorded in S"):
        resolve_aux_layer_ids([1, 2, 3], 32, recorded=[4, 5, 6], recorded_where="S")


def test_one_vocab_builder_and_its_map():
    freq = torch.tensor([5, 0, 9, 9, 1, 7])
    d2t, t2d, cov = build_draft_vocab(freq, 3)
    assert target_ids(d2t).tolist() == [2, 3, 5] and t2d.nonzero().flatten().tolist() == [2, 3, 5]
    assert cov == pytest.approx(25 / 31)
    assert build_draft_vocab(freq, 100)[0].numel() == 6           # capped at the target vocabulary
    assert torch.equal(build_draft_vocab(freq, 2)[1], vocab_from_target_ids(torch.tensor([3, 2]), 6)[1])
    d, t = full_vocab(6)
    assert check_draft_vocab(d, t, vocab_size=6) == [] and target_ids(d).tolist() == list(range(6))


def test_vocab_checks():
    d2t, t2d, _ = build_draft_vocab(torch.arange(8), 4)
    assert check_draft_vocab(d2t, t2d, vocab_size=8) == []
    assert any("covers 8 target ids; the target vocabulary has 9" in p for p in check_draft_vocab(d2t, t2d, vocab_size=9))
    bad = d2t.clone()
    bad[0] = 100
    assert any("outside [0, 8)" in p for p in check_draft_vocab(bad, t2d))
    with pytest.raises(DraftVocabError, match="^prep: d2t: missing"):
        require_draft_vocab(None, t2d, where="prep")


def test_device_and_dtype_vocabulary():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DeviceError, match="'gpu0': not a device"):
        resolve_device("gpu0")
    assert resolve_dtype("auto", "cpu") == torch.float32 and resolve_dtype("auto", "cuda:1") == torch.bfloat16
    assert [resolve_dtype(n, "cpu") for n in ("bf16", "fp16", "fp32")] == [torch.bfloat16, torch.float16, torch.float32]
    assert dtype_name(torch.bfloat16) == "bf16"
    with pytest.raises(ValueError, match="'bfloat16': choose one of auto, bf16, fp16, fp32"):
        resolve_dtype("bfloat16", "cpu")


def test_one_dtype_table_in_every_spelling():
    """Flags, configs, engines and torch spell a dtype differently; one table gives each its bytes."""
    for spelling in ("bf16", "bfloat16", "torch.bfloat16", torch.bfloat16, "fp16", torch.float16):
        assert dtype_bytes(spelling) == 2
    assert dtype_bytes("fp32") == dtype_bytes(torch.float32) == 4
    assert dtype_bytes("fp8") == dtype_bytes(torch.float8_e4m3fn) == 1
    assert all(dtype_bytes(getattr(torch, long)) == size for long, size in DTYPE_TABLE.values())
    with pytest.raises(ValueError, match="'int4': not one of"):
        dtype_bytes("int4")
