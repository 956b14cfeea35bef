"""Compiled decoder layers (target/compiled.py) capture the same states as the eager forward."""

import torch

from eyas.target import default_aux_layer_ids, find_layout, target_states
from eyas.target.compiled import compile_layers, uncompile_layers
from tests.target.fixtures import VOCAB, tiny_llama


def test_compiled_capture_equals_eager_packed_and_batched():
    model = tiny_llama()
    layout = find_layout(model)
    aux = default_aux_layer_ids(layout.num_layers)
    ids = torch.randint(0, VOCAB, (2, 24))
    pos = torch.cat([torch.arange(10), torch.arange(14)]).expand(2, 24).contiguous()   # packed documents
    ref = [target_states(model, layout, ids, aux, position_ids=pos), target_states(model, layout, ids[:1], aux)]
    try:
        assert compile_layers(layout) == layout.num_layers
        assert compile_layers(layout) == 0                      # idempotent
        new = [target_states(model, layout, ids, aux, position_ids=pos), target_states(model, layout, ids[:1], aux)]
    finally:
        uncompile_layers(layout)
    for (a_ref, l_ref, _), (a_new, l_new, _) in zip(ref, new):
        torch.testing.assert_close(a_new, a_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(l_new, l_ref, rtol=1e-5, atol=1e-5)
    assert all(getattr(layer, "_eyas_eager_forward", None) is None for layer in layout.layers)
