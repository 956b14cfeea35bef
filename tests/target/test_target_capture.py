"""Hook capture equals the model's own hidden states, for every architecture family, padded and packed.

Reference values come from transformers itself: `output_hidden_states=True` for the aux states and the
logits, and separate unpadded single-document runs for padded batches and packed rows.
"""

from __future__ import annotations

import pytest
import torch

from eyas.target import capture, default_aux_layer_ids, find_layout, packed_position_ids, target_states
from tests.target.zoo import ARCHS, BY_NAME, LAYERS

ARCH_IDS = [a.name for a in ARCHS]
AUX = default_aux_layer_ids(LAYERS)  # [2, 4, 5]
# fp32 on CPU: padded/packed runs use other matmul shapes than the reference, so they agree to
# rounding (~1e-5 seen); a token leaking across a mask or a wrong position moves states by ~1-10.
TOL = dict(atol=1e-4, rtol=1e-4)

_models: dict[str, torch.nn.Module] = {}


def model_and_layout(name: str):
    # Building is cheap but not free; tests only read the models, so share one per architecture.
    if name not in _models:
        _models[name] = BY_NAME[name].model()
    model = _models[name]
    return model, find_layout(model)


def tokens(*shape: int) -> torch.Tensor:
    return torch.randint(1, 80, shape)  # 0 is the pad id; the top ids are the multimodal specials


@pytest.mark.parametrize("name", ARCH_IDS)
def test_find_layout_paths(name):
    model, layout = model_and_layout(name)
    assert layout.paths == BY_NAME[name].paths
    assert layout.num_layers == LAYERS
    assert layout.hidden_size == 32 and layout.vocab_size == 96
    assert layout.layers is model.get_submodule(layout.paths["layers"])
    assert layout.norm is model.get_submodule(layout.paths["norm"])
    assert layout.embed is model.get_input_embeddings()


@pytest.mark.parametrize("name", ARCH_IDS)
def test_aux_and_last_equal_output_hidden_states(name):
    model, layout = model_and_layout(name)
    ids = tokens(2, 12)
    ref = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    hs = ref.hidden_states  # hs[k] = input of layer k; hs[N] = final norm output
    assert len(hs) == LAYERS + 1
    for logits in (False, True):  # backbone-only path and full-model path
        aux, last, out = target_states(model, layout, ids, AUX, logits=logits)
        assert aux.shape == (2, 12, len(AUX), 32) and last.shape == (2, 12, 32)
        for j, k in enumerate(AUX):
            assert torch.equal(aux[:, :, j], hs[k]), f"aux id {k} differs from hidden_states[{k}]"
        assert torch.equal(layout.norm(last), hs[LAYERS])
        if logits:
            assert torch.equal(out, ref.logits)
    # The convention training relies on: target logits = lm_head(norm(last)).
    torch.testing.assert_close(layout.lm_head(layout.norm(last)), ref.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ARCH_IDS)
def test_capture_context_manager_reads_every_layer(name):
    model, layout = model_and_layout(name)
    ids = tokens(1, 9)
    ref = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    every = list(range(LAYERS))
    with capture(layout, every) as cap:
        model(input_ids=ids, use_cache=False)
    for k in every:
        assert torch.equal(cap.aux[:, :, k], ref[k])
    assert all(not layer._forward_pre_hooks for layer in layout.layers), "hooks must not outlive the block"
    assert not layout.norm._forward_pre_hooks


# Four documents per architecture and their single, unpadded full-model runs: the references for the
# padded and packed tests. Lengths exceed Gemma3's sliding window (4) so windows are exercised.
DOC_LENS = (7, 11, 4, 9)
_refs: dict[str, tuple[list[torch.Tensor], list[tuple]]] = {}


def documents(name: str):
    if name not in _refs:
        model, layout = model_and_layout(name)
        gen = torch.Generator().manual_seed(1)
        docs = [torch.randint(1, 80, (n,), generator=gen) for n in DOC_LENS]
        runs = []
        for d in docs:
            aux, last, out = target_states(model, layout, d[None], AUX, logits=True)
            runs.append((aux[0], last[0], out[0]))
        _refs[name] = (docs, runs)
    return _refs[name]


def _assert_same(got, want, where: str):
    for g, w, what in zip(got, want, ("aux", "last", "logits")):
        if g is not None:
            torch.testing.assert_close(g, w, **TOL, msg=lambda m: f"{where} {what}: {m}")


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", ARCH_IDS)
def test_padded_batch_equals_unpadded_runs(name, side):
    model, layout = model_and_layout(name)
    docs, runs = documents(name)
    T = max(DOC_LENS)
    ids = torch.zeros(len(docs), T, dtype=torch.long)
    mask = torch.zeros(len(docs), T, dtype=torch.long)
    for i, d in enumerate(docs):
        cols = slice(T - len(d), T) if side == "left" else slice(0, len(d))
        ids[i, cols], mask[i, cols] = d, 1
    for logits in (False, True):  # backbone path and full-model path
        aux, last, out = target_states(model, layout, ids, AUX, attention_mask=mask, logits=logits)
        for i in range(len(docs)):
            valid = mask[i].bool()
            got = (aux[i][valid], last[i][valid], None if out is None else out[i][valid])
            _assert_same(got, runs[i], f"{name} {side}-padded row {i} logits={logits}")


@pytest.mark.parametrize("name", ARCH_IDS)
def test_packed_rows_equal_separate_documents(name):
    model, layout = model_and_layout(name)
    docs, runs = documents(name)
    # Two packed rows of 20 tokens: docs (0, 2, 3) fill row 0; row 1 holds doc 1 and is padded to
    # length with one extra "document" of pad tokens, as a collator of packed rows does.
    layout_rows = [[0, 2, 3], [1]]
    rows, positions = [], []
    for row in layout_rows:
        lens = [DOC_LENS[d] for d in row]
        pad = 20 - sum(lens)
        rows.append(torch.cat([docs[d] for d in row] + [torch.zeros(pad, dtype=torch.long)]))
        positions.append(packed_position_ids(lens + ([pad] if pad else []))[0])
    ids, pos = torch.stack(rows), torch.stack(positions)
    for logits in (False, True):
        aux, last, out = target_states(model, layout, ids, AUX, position_ids=pos, logits=logits)
        for r, row in enumerate(layout_rows):
            start = 0
            for d in row:
                cols = slice(start, start + DOC_LENS[d])
                start += DOC_LENS[d]
                got = (aux[r, cols], last[r, cols], None if out is None else out[r, cols])
                _assert_same(got, runs[d], f"{name} row {r} doc {d} logits={logits}")


def test_packed_rows_with_a_padding_mask():
    model, layout = model_and_layout("gemma3")
    docs, runs = documents("gemma3")
    ids = torch.cat(docs[:2])[None]
    pos = packed_position_ids(list(DOC_LENS[:2]))
    ones = torch.ones_like(ids)
    aux, _, _ = target_states(model, layout, ids, AUX, attention_mask=ones, position_ids=pos)
    _assert_same((aux[0, DOC_LENS[0]:], None, None), runs[1], "all-ones mask must not hide the packing")
    with pytest.raises(ValueError, match="cannot be combined with a padding attention_mask"):
        target_states(model, layout, torch.cat([ids, ids.new_zeros(1, 3)], 1), AUX,
                      attention_mask=torch.cat([ones, ones.new_zeros(1, 3)], 1),
                      position_ids=torch.cat([pos, pos.new_zeros(1, 3)], 1))
    # Left padding with continuing positions and a mask is an ordinary padded batch, not an error.
    padded = torch.cat([ids.new_zeros(1, 3), docs[1][None]], 1)
    mask = torch.cat([ones.new_zeros(1, 3), torch.ones_like(docs[1])[None]], 1)
    aux, _, _ = target_states(model, layout, padded, AUX, attention_mask=mask,
                              position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    _assert_same((aux[0, 3:], None, None), runs[1], "left padding with explicit positions")


def test_packed_check_detects_a_leak():
    """Control for the test above: without restarting positions the documents see each other."""
    model, layout = model_and_layout("llama")
    docs, runs = documents("llama")
    aux, _, _ = target_states(model, layout, torch.cat(docs[:2])[None], AUX)
    assert (aux[0, DOC_LENS[0]:] - runs[1][0]).abs().max() > 1e-2


def test_left_padding_without_mask_is_different():
    """Control for the padding test: the mask matters, so the equality above is not vacuous."""
    model, layout = model_and_layout("gpt2")
    docs, runs = documents("gpt2")
    ids = torch.cat([torch.zeros(3, dtype=torch.long), docs[0]])[None]
    aux, _, _ = target_states(model, layout, ids, AUX)
    assert (aux[0, 3:] - runs[0][0]).abs().max() > 1e-2


def test_unreached_aux_layer_is_a_clear_error():
    _, layout = model_and_layout("llama")
    with pytest.raises(RuntimeError, match=r"aux layers \[4\] were not reached"):
        with capture(layout, [4]) as cap:
            pass
        cap.aux


@pytest.mark.parametrize("bad, msg", [([8], "out of range"), ([-1], "out of range"), ([2, 2], "repeat")])
def test_bad_aux_ids_are_rejected(bad, msg):
    _, layout = model_and_layout("llama")
    with pytest.raises(ValueError, match=msg):
        with capture(layout, bad):
            pass
