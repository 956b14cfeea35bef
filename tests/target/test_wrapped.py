"""A wrapper transformers cannot build as a causal LM (Kimi-K2.5): its text model reached through text_config, from
configs alone (the full-size Kimi-K2.5 config, ~1T parameters, on the meta device) and with or without
transformers' own Kimi classes; per-expert checkpoint tensors fused into transformers' experts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from eyas.cli import main
from eyas.store import config_hash
from eyas.target import build_meta, find_layout, load_config
from eyas.target.inspect import describe
from eyas.target.keys import fuse_experts
from eyas.target.wrapped import WrappedTextLM

FULL = Path(__file__).parent / "data" / "kimi-k2.5-config.json"
PATHS = {"layers": "language_model.model.layers", "embed": "language_model.model.embed_tokens",
         "norm": "language_model.model.norm", "lm_head": "language_model.lm_head"}


def full_size_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(FULL, path / "config.json")
    return path


@pytest.fixture
def no_kimi_in_transformers(monkeypatch):
    """transformers as it was before it knew Kimi-K2.5: AutoConfig refuses the model type."""
    from transformers.models.auto import configuration_auto

    monkeypatch.delitem(configuration_auto.CONFIG_MAPPING._mapping, "kimi_k25")


def test_full_size_kimi_k25_config_builds_its_text_model_on_meta(tmp_path):
    config = load_config(full_size_dir(tmp_path / "k25"))
    model = build_meta(config)
    assert isinstance(model, WrappedTextLM) and type(model.language_model).__name__ == "DeepseekV3ForCausalLM"
    assert find_layout(model).paths == PATHS
    info = describe(config)
    assert info["architecture"] == "KimiK25ForConditionalGeneration (text model DeepseekV3ForCausalLM)"
    assert (info["num_layers"], info["hidden_size"], info["vocab_size"]) == (61, 7168, 163840)
    assert 1.0e12 < info["num_parameters"] < 1.05e12                      # ~1T: 384 experts x 60 MoE layers
    assert info["attention"].startswith("MLA (64 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, "
                                        "qk_rope_head_dim 64")
    assert info["mlp"].startswith("MoE (384 routed experts, top-8, 1 shared, first 1 layer(s) dense, scoring_func "
                                  "sigmoid, topk_method noaux_tc, routed_scaling_factor 2.827")
    assert info["default_aux_layer_ids"] == [2, 30, 58]


def test_inspect_cli_full_size_kimi_k25(tmp_path, capsys):
    assert main(["inspect", "--target", str(full_size_dir(tmp_path / "k25")), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["layers_path"] == "language_model.model.layers" and info["model_type"] == "kimi_k25"


def test_without_transformers_kimi_classes_the_text_config_is_read_directly(tmp_path, no_kimi_in_transformers):
    # The hub config names remote code (auto_map) and a `kimi_k2` text model: read without running either.
    config = load_config(full_size_dir(tmp_path / "k25"))
    assert type(config.text_config).__name__ == "DeepseekV3Config" and config.text_config.num_hidden_layers == 61
    assert config.architectures == ["KimiK25ForConditionalGeneration"]
    assert find_layout(build_meta(config)).paths == PATHS
    assert config_hash(config) == config_hash(load_config(tmp_path / "k25"))   # the same identity every time


def test_unknown_wrapper_without_a_known_text_model_still_fails_clearly(tmp_path, no_kimi_in_transformers):
    doc = json.loads(FULL.read_text())
    doc["text_config"]["model_type"] = "not_a_model"
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="ships its own modelling code; eyas runs it only if you pass --trust-remote"):
        load_config(tmp_path)


# --- per-expert checkpoint tensors -> transformers' fused experts
def _experts(n=3, inter=4, hidden=5):
    g = torch.Generator().manual_seed(0)
    return {f"m.layers.1.mlp.experts.{e}.{p}.weight": torch.randn((hidden, inter) if p == "down_proj" else
                                                                  (inter, hidden), generator=g)
            for e in range(n) for p in ("gate_proj", "up_proj", "down_proj")}


def test_fuse_experts_stacks_gate_up_and_down():
    state = {**_experts(), "m.norm.weight": torch.ones(5)}
    own = {"m.layers.1.mlp.experts.gate_up_proj": torch.Size([3, 8, 5]),
           "m.layers.1.mlp.experts.down_proj": torch.Size([3, 5, 4]), "m.norm.weight": torch.Size([5])}
    out = fuse_experts(state, own)
    assert set(out) == set(own)
    gu = out["m.layers.1.mlp.experts.gate_up_proj"]
    assert torch.equal(gu[2, :4], state["m.layers.1.mlp.experts.2.gate_proj.weight"])
    assert torch.equal(gu[2, 4:], state["m.layers.1.mlp.experts.2.up_proj.weight"])
    assert torch.equal(out["m.layers.1.mlp.experts.down_proj"][1], state["m.layers.1.mlp.experts.1.down_proj.weight"])
    # a model that keeps experts apart takes the per-expert keys unchanged
    assert fuse_experts(state, {k: v.shape for k, v in state.items()}).keys() == state.keys()


def test_fuse_experts_errors_name_the_key():
    own = {"m.layers.1.mlp.experts.gate_up_proj": torch.Size([3, 8, 5]),
           "m.layers.1.mlp.experts.down_proj": torch.Size([3, 5, 4])}
    state = _experts()
    del state["m.layers.1.mlp.experts.1.up_proj.weight"]
    with pytest.raises(KeyError, match=r"m\.layers\.1\.mlp\.experts\.1\.up_proj\.weight: missing"):
        fuse_experts(state, own)
    with pytest.raises(KeyError, match=r"do not make m\.layers\.1\.mlp\.experts\.gate_up_proj \[3, 6, 5\]"):
        fuse_experts(_experts(), {**own, "m.layers.1.mlp.experts.gate_up_proj": torch.Size([3, 6, 5])})
