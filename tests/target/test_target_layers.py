"""Layer discovery by structure (meta-built models of every family, odd wrappers, clear failures)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from eyas.cli import main
from eyas.target import LayoutError, build_meta, default_aux_layer_ids, find_layout
from eyas.target.inspect import describe
from tests.target.zoo import ARCHS, BY_NAME, LAYERS


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.name)
def test_describe_builds_every_family_on_meta(arch):
    config = arch.config()
    config.architectures = [arch.model_cls]
    info = describe(config)
    assert info["architecture"] == arch.model_cls
    assert info["paths"] == arch.paths and info["layers_path"] == arch.paths["layers"]
    assert (info["num_layers"], info["hidden_size"], info["vocab_size"]) == (LAYERS, 32, 96)
    assert info["default_aux_layer_ids"] == [2, 4, 5]
    assert info["num_parameters"] > 0
    assert all(p.is_meta for p in build_meta(config).parameters())


def test_inspect_cli_on_a_multimodal_dir(tmp_path, capsys):
    config = BY_NAME["gemma3"].config()
    config.architectures = ["Gemma3ForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    assert main(["inspect", "--target", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["layers_path"] == "model.language_model.layers"
    assert info["paths"]["norm"] == "model.language_model.norm"
    assert info["num_layers"] == LAYERS and info["vocab_size"] == 96


class _Blocks(nn.Module):
    """A made-up architecture: unusual attribute names, no transformers base class."""

    def __init__(self, vocab=50, hidden=16, n=5):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(8, hidden)  # smaller table: must not be taken for the token embedding
        self.stack = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(n))
        self.final_rmsnorm = nn.RMSNorm(hidden)


class _Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = _Blocks()
        self.head = nn.Linear(16, 50, bias=False)

    def get_output_embeddings(self):
        return self.head


def test_custom_module_is_found_by_structure():
    model = _Custom()
    layout = find_layout(model)
    assert layout.paths == {"layers": "body.stack", "embed": "body.tok", "norm": "body.final_rmsnorm",
                            "lm_head": "head"}
    assert (layout.num_layers, layout.hidden_size, layout.vocab_size) == (5, 16, 50)


class _NoDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.mixer = nn.Linear(16, 16)
        self.lm_head = nn.Linear(16, 50)


def test_no_decoder_list_error_lists_what_was_searched():
    with pytest.raises(LayoutError) as err:
        find_layout(_NoDecoder())
    msg = str(err.value)
    assert "_NoDecoder: no text decoder found" in msg
    assert "'embed'" in msg                       # the embedding it started from
    assert "<root> (no ModuleList among children ['embed', 'mixer', 'lm_head'])" in msg
    assert "model.layers" in msg and "transformer.h" in msg  # the shapes it knows


def test_layer_list_without_final_norm_names_the_owner():
    model = _Custom()
    del model.body.final_rmsnorm
    with pytest.raises(LayoutError, match=r"body \(layer list 'stack' but no \*Norm child among \['tok', 'pos', "
                                          r"'stack'\]\)"):
        find_layout(model)


def test_no_embedding_at_all():
    with pytest.raises(LayoutError, match="no token embedding / lm_head found"):
        find_layout(nn.Sequential(nn.Linear(4, 4)))


def test_hybrid_stack_of_mixed_block_types_is_accepted():
    model = _Custom()
    model.body.stack[1] = nn.Sequential(nn.Linear(16, 16))  # e.g. a mamba block between attention blocks
    assert find_layout(model).paths["layers"] == "body.stack"


@pytest.mark.parametrize("n, ids", [(1, [0]), (2, [0, 1]), (3, [0, 1, 2]), (4, [0, 2, 3]), (6, [0, 2, 5]),
                                    (7, [2, 3, 4]), (8, [2, 4, 5]), (30, [2, 15, 27]), (32, [2, 16, 29]),
                                    (80, [2, 40, 77])])
def test_default_aux_layer_ids(n, ids):
    assert default_aux_layer_ids(n) == ids


def test_default_aux_layer_ids_needs_a_layer():
    with pytest.raises(ValueError, match="at least one decoder layer"):
        default_aux_layer_ids(0)


def test_capture_through_custom_module():
    """Hooks on a non-transformers module: aux k is what enters block k, last is what enters the norm."""
    from eyas.target import capture

    model = _Custom()
    layout = find_layout(model)
    x = torch.randn(2, 3, 16)
    with capture(layout, [0, 3]) as cap:
        h = x
        for block in layout.layers:
            h = block(h)
        layout.norm(h)
    assert torch.equal(cap.aux[:, :, 0], x)
    assert torch.equal(cap.aux[:, :, 1], layout.layers[2](layout.layers[1](layout.layers[0](x))))
    assert torch.equal(cap.last, h)
