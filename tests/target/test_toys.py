"""The toy targets: deterministic, in the checkpoint layout vLLM loads (Kimi-K2.5's config keys and tensor names),
their text half loaded by eyas through transformers, and captured aux states equal to the model's own."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors import safe_open

from eyas.target import load_target, target_states
from eyas.target.toys import KIMI_MEDIA, build_toy, toy_conversations, toy_tokenizer
from eyas.target.wrapped import WrappedTextLM


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    return build_toy(tmp_path_factory.mktemp("kimi"), "kimi-k2.5", size="tiny")


def _sha(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def _tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as h:
        return {k: h.get_tensor(k) for k in h.keys()}


def test_toy_is_deterministic_from_its_seed(kimi, tmp_path):
    assert _sha(build_toy(tmp_path / "again", "kimi-k2.5", size="tiny")) == _sha(kimi)
    assert _sha(build_toy(tmp_path / "seed1", "kimi-k2.5", size="tiny", seed=1)) != _sha(kimi)
    with pytest.raises(FileExistsError):
        build_toy(kimi, "kimi-k2.5", size="tiny")


def test_kimi_toy_has_kimi_k25_keys_and_vllm_tensor_names(kimi):
    doc = json.loads((kimi / "config.json").read_text())
    assert doc["architectures"] == ["KimiK25ForConditionalGeneration"] and doc["model_type"] == "kimi_k25"
    text = doc["text_config"]
    assert text["model_type"] == "deepseek_v3" and text["first_k_dense_replace"] == 1
    for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
                "n_shared_experts", "num_experts_per_tok", "n_group", "topk_group", "scoring_func",
                "routed_scaling_factor", "topk_method", "norm_topk_prob", "rope_scaling"):
        assert key in text, key
    assert text["rope_scaling"]["type"] == "yarn"
    vision = doc["vision_config"]   # the names vLLM's KimiK25VisionConfig reads, and the real config's vt_* ones
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "patch_size",
                "init_pos_emb_height", "merge_kernel_size", "mm_hidden_size", "vt_hidden_size"):
        assert key in vision, key
    tok = toy_tokenizer()
    assert doc["media_placeholder_token_id"] == tok.convert_tokens_to_ids("<|media_pad|>")
    assert json.loads((kimi / "preprocessor_config.json").read_text())["media_proc_cfg"] == KIMI_MEDIA
    t = _tensors(kimi)
    names = set(t)
    assert "language_model.model.layers.0.mlp.gate_proj.weight" in names              # the dense first layer
    assert not any(k.startswith("language_model.model.layers.0.mlp.experts") for k in names)
    E = text["n_routed_experts"]
    for e in (0, E - 1):
        for p in ("gate_proj", "up_proj", "down_proj"):                                 # one tensor per expert
            assert f"language_model.model.layers.7.mlp.experts.{e}.{p}.weight" in names
    for k in ("language_model.model.layers.1.mlp.shared_experts.down_proj.weight",
              "language_model.model.layers.1.self_attn.kv_a_proj_with_mqa.weight", "language_model.lm_head.weight",
              "language_model.model.embed_tokens.weight", "vision_tower.encoder.blocks.0.wqkv.weight",
              "vision_tower.patch_embed.pos_emb.weight", "mm_projector.proj.2.weight", "mm_projector.pre_norm.bias"):
        assert k in names, k
    assert t["language_model.model.layers.1.self_attn.kv_a_proj_with_mqa.weight"].shape[0] == \
        text["kv_lora_rank"] + text["qk_rope_head_dim"]
    assert t["mm_projector.proj.2.weight"].shape[0] == text["hidden_size"]
    assert t["language_model.model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert t["language_model.model.layers.1.mlp.gate.weight"].dtype == torch.bfloat16


def test_full_size_keeps_the_mla_sizes_vllm_kernels_take(tmp_path):
    doc = json.loads((build_toy(tmp_path / "full", "kimi-k2.5") / "config.json").read_text())["text_config"]
    assert (doc["kv_lora_rank"], doc["qk_rope_head_dim"], doc["qk_nope_head_dim"], doc["v_head_dim"]) == \
        (512, 64, 128, 128)
    assert doc["num_hidden_layers"] == 8 and doc["n_routed_experts"] == 16


def test_text_half_loads_as_deepseek_v3_from_the_language_model_keys(kimi):
    t = load_target(kimi, dtype=torch.bfloat16)
    assert isinstance(t.model, WrappedTextLM) and type(t.model.language_model).__name__ == "DeepseekV3ForCausalLM"
    assert t.load_path == "fast" and t.layout.paths["layers"] == "language_model.model.layers"
    ckpt = _tensors(kimi)
    layer = t.model.language_model.model.layers[3]
    gate_up = layer.mlp.experts.gate_up_proj
    I = gate_up.shape[1] // 2
    assert torch.equal(gate_up[5, :I], ckpt["language_model.model.layers.3.mlp.experts.5.gate_proj.weight"])
    assert torch.equal(gate_up[5, I:], ckpt["language_model.model.layers.3.mlp.experts.5.up_proj.weight"])
    assert torch.equal(layer.self_attn.kv_b_proj.weight, ckpt["language_model.model.layers.3.self_attn.kv_b_proj.weight"])
    assert layer.mlp.gate.weight.dtype == torch.float32        # the router stays fp32, as transformers keeps it
    assert torch.equal(layer.mlp.gate.e_score_correction_bias,
                       ckpt["language_model.model.layers.3.mlp.gate.e_score_correction_bias"])


def test_captured_aux_states_are_the_models_own_hidden_states(kimi):
    t = load_target(kimi, dtype=torch.float32)
    ids = t.tokenizer.apply_chat_template(toy_conversations(1)[0]["messages"][:1], add_generation_prompt=True,
                                          return_tensors="pt")["input_ids"]
    aux, last, logits = target_states(t.model, t.layout, ids, [2, 4, 5], logits=True)
    out = t.model(input_ids=ids, output_hidden_states=True)
    for j, k in enumerate([2, 4, 5]):
        assert torch.equal(aux[0, :, j], out.hidden_states[k][0]), k
    lm = t.model.language_model
    assert torch.allclose(lm.lm_head(lm.model.norm(last)), out.logits, atol=1e-5)
    assert torch.equal(logits, out.logits)


def test_toy_text_round_trips_through_its_tokenizer(kimi):
    """Greedy output is printable ASCII (the toy never emits a lone byte or a stray special token), so a regenerated
    answer re-tokenizes to exactly the ids the toy produced."""
    t = load_target(kimi, dtype=torch.float32)
    ids = t.tokenizer.apply_chat_template(toy_conversations(2)[1]["messages"][:1], add_generation_prompt=True,
                                          return_tensors="pt")["input_ids"]
    new = t.model.generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=None)[0, ids.shape[1]:].tolist()
    end = t.tokenizer.convert_tokens_to_ids("<|im_end|>")
    new = new[:new.index(end)] if end in new else new
    assert new and t.tokenizer.encode(t.tokenizer.decode(new), add_special_tokens=False) == new


def test_dense_control_is_a_llama_in_the_same_wrapper_layout(tmp_path):
    path = build_toy(tmp_path / "llava", "llava-llama", size="tiny")
    names = set(_tensors(path))
    assert "language_model.model.layers.0.self_attn.q_proj.weight" in names and "language_model.lm_head.weight" in names
    assert any(k.startswith("vision_tower.vision_model.") for k in names)
    t = load_target(path, dtype=torch.float32)
    assert type(t.model).__name__ == "LlavaForConditionalGeneration"
    ids = torch.tensor([[5, 40, 41, 42, 43, 44]])
    aux, _, _ = target_states(t.model, t.layout, ids, [2, 4, 5])
    out = t.model(input_ids=ids, output_hidden_states=True)
    assert torch.equal(aux[0, :, 1], out.hidden_states[4][0])


def test_target_identity_does_not_depend_on_the_load_dtype(kimi):
    """A store extracted in bf16 is the same target's for a trainer that loads it in fp32: the wrapper's text_config
    carries the load dtype, which the identity hash leaves out at every level."""
    from eyas.store import config_hash
    from eyas.target import load_config

    hashes = {config_hash(load_target(kimi, dtype=d).config) for d in (torch.float32, torch.bfloat16)}
    assert hashes == {config_hash(load_config(kimi))}
