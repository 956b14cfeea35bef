"""P-EAGLE and DFlash exports in the speculators format vLLM 0.26 serves with zero flags (the keys its
SpeculatorsConfig algos read, the weight names its loaders take), key-contract checks naming the key, and imports
of checkpoints laid out as vllm-project/speculators saves them."""

import json

import pytest
import torch
from safetensors.torch import save_file

from eyas.draft.io import load_draft, save_draft
from eyas.draft.kinds import build_draft, draft_config
from eyas.export import ContractError, check_contract, export_vllm, import_draft, read_export

from export_fixtures import V

AUX = [2, 4, 5]


def parallel_draft(tiny, kind, *, layers=2, K=3, vd=64, seed=0):
    dc = draft_config(tiny["target"].config, kind, aux_layer_ids=AUX, draft_vocab_size=vd, num_layers=layers,
                      parallel_tokens=K, mask_token_id=V - 1)
    torch.manual_seed(seed)
    d = build_draft(dc).float().eval()
    with torch.no_grad():
        for n, p in d.named_parameters():
            p.normal_(0.0, 0.2) if p.ndim >= 2 else p.uniform_(0.5, 1.5)
        ids = torch.randperm(V)[:vd].sort().values
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
        d.set_vocab_map(ids - torch.arange(vd), t2d)
        d.embed_tokens.weight.copy_(tiny["target"].get_input_embeddings().weight)
        if kind == "p-eagle":                          # a trained embedding: its mask row moved
            d.embed_tokens.weight[V - 1] += 1.0
    return d


@pytest.fixture(scope="module", params=["p-eagle", "dflash"])
def exported(tiny, request):
    kind = request.param
    d = parallel_draft(tiny, kind)
    src = save_draft(d, tiny["root"] / f"draft-{kind}", {"target": str(tiny["target_dir"])})
    return kind, d, src, export_vllm(src, tiny["root"] / f"vllm-{kind}")


def test_config_is_what_vllm_0_26_reads(tiny, exported):
    kind, d, _, out = exported
    cfg, tensors = read_export(out)
    sc = cfg["speculators_config"]
    assert sc["proposal_methods"][0]["speculative_tokens"] == 3            # default chain: the trained tokens
    assert sc["verifier"]["name_or_path"] == str(tiny["target_dir"].resolve())
    tlc = cfg["transformer_layer_config"]
    assert tlc["num_hidden_layers"] == 2 and cfg["mask_token_id"] == V - 1 and cfg["draft_vocab_size"] == 64
    if kind == "p-eagle":   # -> method eagle3 + parallel_drafting, PeagleLlamaForCausalLM, pard_token
        assert cfg["speculators_model_type"] == sc["algorithm"] == "peagle" and tlc["model_type"] == "llama"
        assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX and cfg["norm_before_residual"] is False
        assert tensors["mask_hidden"].shape == (1, 1, 3 * 32)
        assert "embed_tokens.weight" in tensors and "layers.1.input_layernorm.weight" in tensors
        assert "layers.1.hidden_norm.weight" not in tensors                  # only layer 0 has one
    else:                   # -> DFlashDraftModel (DFlashQwen3ForCausalLM), target_layer_ids = aux - 1
        assert cfg["speculators_model_type"] == sc["algorithm"] == "dflash" and tlc["model_type"] == "qwen3"
        assert cfg["aux_hidden_state_layer_ids"] == AUX and cfg["block_size"] == 4
        assert cfg["sliding_window_non_causal"] is True and cfg["sample_from_anchor"] is False
        assert "embed_tokens.weight" not in tensors                          # the target's: vLLM shares it
        assert {"hidden_norm.weight", "layers.1.self_attn.q_norm.weight", "lm_head.weight"} <= set(tensors)
    assert check_contract(cfg, tensors) == []
    assert f"# {'P-EAGLE' if kind == 'p-eagle' else 'DFlash'} draft" in (out / "README.md").read_text()


def test_round_trip_is_exact(tiny, exported):
    kind, d, _, out = exported
    back, meta = load_draft(import_draft(out, tiny["root"] / f"back-{kind}"))
    assert meta["imported_from"]["format"] == "speculators" and back.config.kind == kind
    assert (back.config.parallel_tokens, back.config.mask_token_id, back.config.num_layers) == (3, V - 1, 2)
    for k, v in d.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k


@pytest.mark.parametrize("mutation, says", [
    (lambda c, t: t.pop("layers.1.mlp.down_proj.weight"), "layers.1.mlp.down_proj.weight: missing"),
    (lambda c, t: c["transformer_layer_config"].update(num_hidden_layers=3), "layers.2."),
    (lambda c, t: c.pop("mask_token_id"), "mask_token_id"),
    (lambda c, t: t.update({"layers.1.self_attn.k_proj.weight": torch.zeros(3, 3)}), "layers.1.self_attn.k_proj"),
])
def test_contract_names_the_key(exported, mutation, says):
    _, _, _, out = exported
    cfg, tensors = read_export(out)
    mutation(cfg, tensors)
    assert any(says in e for e in check_contract(cfg, tensors)), check_contract(cfg, tensors)


def test_kind_specific_contract_rules(tiny, exported):
    kind, _, src, out = exported
    cfg, tensors = read_export(out)
    if kind == "p-eagle":
        tensors.pop("mask_hidden")
        assert any(e.startswith("mask_hidden: missing") for e in check_contract(cfg, tensors))
    else:
        cfg["sliding_window_non_causal"] = False
        assert any("causally" in e for e in check_contract(cfg, tensors))
        with pytest.raises(ValueError, match="block size 4"):
            export_vllm(src, tiny["root"] / "too-long", chain=4)


def write_published(path, config, tensors):
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return path


def verifier(tiny):
    return {"name_or_path": str(tiny["target_dir"]), "architectures": ["LlamaForCausalLM"]}


def proposal(k):
    return [{"proposal_type": "greedy", "speculative_tokens": k, "verifier_accept_k": 1, "accept_tolerance": 0.0}]


def test_import_a_speculators_p_eagle_checkpoint(tiny):
    """PEagleSpeculatorConfig + PEagleDraftModel.save_pretrained: llama layers, mask_hidden [1, 1, k*H], a
    trained embed_tokens, no verifier_* keys, norm_before_residual absent (vLLM: false)."""
    d = parallel_draft(tiny, "p-eagle", layers=3, seed=4)
    sd = {**d.state_dict(), "mask_hidden": d.mask_hidden.detach().reshape(1, 1, -1)}
    tlc = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 3, "vocab_size": V, "rms_norm_eps": 1e-6,
           "rope_theta": 5000.0, "max_position_embeddings": 128, "hidden_act": "silu", "tie_word_embeddings": False}
    cfg = {"architectures": ["PEagleSpeculator"], "speculators_model_type": "peagle", "speculators_version": "0.3.0",
           "speculators_config": {"algorithm": "peagle", "proposal_methods": proposal(4),
                                  "default_proposal_method": "greedy", "verifier": verifier(tiny)},
           "transformer_layer_config": tlc, "draft_vocab_size": 64, "eagle_aux_hidden_state_layer_ids": AUX,
           "norm_before_fc": False, "fc_norm": False, "norm_output": False, "mask_token_id": V - 1,
           "embed_requires_grad": True, "target_hidden_size": None}
    src = write_published(tiny["root"] / "pub-peagle", cfg, sd)
    back, _ = load_draft(import_draft(src, tiny["root"] / "pub-peagle-in"))
    dc = back.config
    assert (dc.kind, dc.num_layers, dc.parallel_tokens, dc.norm_before_residual) == ("p-eagle", 3, 4, False)
    for k, v in d.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k


def test_import_a_speculators_dflash_checkpoint(tiny):
    """DFlashSpeculatorConfig + DFlashDraftModel.save_pretrained: a Qwen3 transformer_layer_config (layer_types
    all full attention), block_size, aux_hidden_state_layer_ids, embed_tokens and lm_head saved, d2t/t2d for a
    reduced draft vocab, sliding_window_non_causal left at its default (false)."""
    d = parallel_draft(tiny, "dflash", layers=2, K=5, seed=6)
    tlc = {"model_type": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 2, "vocab_size": V, "rms_norm_eps": 1e-6,
           "rope_theta": 5000.0, "max_position_embeddings": 128, "hidden_act": "silu", "attention_bias": False,
           "layer_types": ["full_attention"] * 2, "use_sliding_window": False, "sliding_window": None,
           "tie_word_embeddings": False}
    cfg = {"architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash", "speculators_version": "0.3.0",
           "speculators_config": {"algorithm": "dflash", "proposal_methods": proposal(5),
                                  "default_proposal_method": "greedy", "verifier": verifier(tiny)},
           "transformer_layer_config": tlc, "draft_vocab_size": 64, "block_size": 6, "target_hidden_size": None,
           "aux_hidden_state_layer_ids": AUX, "mask_token_id": V - 1, "sliding_window_non_causal": False,
           "sample_from_anchor": False}
    src = write_published(tiny["root"] / "pub-dflash", cfg, d.state_dict())
    back, _ = load_draft(import_draft(src, tiny["root"] / "pub-dflash-in"))
    assert (back.config.kind, back.config.parallel_tokens, back.config.head_dim) == ("dflash", 5, 8)
    for k, v in d.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    cfg["sample_from_anchor"] = True
    with pytest.raises(ContractError, match="sample_from_anchor"):
        import_draft(write_published(tiny["root"] / "pub-dspark", cfg, d.state_dict()), tiny["root"] / "x")
