"""Tiny random models of every architecture family eyas must read, built in-process (CPU, fp32).

Each entry gives the model class, a config small enough to run in milliseconds, and the module paths
`find_layout` must report. Sizes are chosen so the interesting code paths run: Gemma3's sliding window
(4) is shorter than the test sequences, MoE layers have several experts, DeepSeek-V3 has one dense
layer before its MoE layers and uses MLA with a LoRA'd query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import transformers as tf

VOCAB = 96
HIDDEN = 32
LAYERS = 8  # default aux ids (2, N//2, N-3) = [2, 4, 5]: distinct, as on real models


@dataclass(frozen=True)
class Arch:
    name: str
    build_config: Callable[[], object]
    model_cls: str
    paths: dict[str, str]
    sliding_window: int | None = None

    def config(self):
        return self.build_config()

    def model(self, seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        cfg = self.config()
        cfg._attn_implementation = "sdpa"
        model = getattr(tf, self.model_cls)(cfg).float().eval()
        _spread_weights(model)
        return model


def _spread_weights(model: torch.nn.Module) -> None:
    """Random init is std 0.02: tiny models would emit near-constant states and hide masking bugs.

    Norm weights stay as initialised (Gemma's are zero-centred); everything else gets std 0.2 so
    layers mix tokens visibly and a leaked token changes the output by far more than rounding.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or p.ndim < 2:
                continue
            p.normal_(0.0, 0.2)


def _attn(**kw) -> dict:
    base = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                pad_token_id=0, tie_word_embeddings=False)
    base.update(kw)
    return base


def llama():
    return tf.LlamaConfig(**_attn())


def qwen3():
    return tf.Qwen3Config(**_attn(head_dim=8))


def qwen3_moe():
    return tf.Qwen3MoeConfig(**_attn(head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                     decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True))


def mixtral():
    return tf.MixtralConfig(**_attn(num_local_experts=4, num_experts_per_tok=2))


def deepseek_v3():
    return tf.DeepseekV3Config(**_attn(num_key_value_heads=4, moe_intermediate_size=16, first_k_dense_replace=1,
                                       n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                       n_shared_experts=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
                                       qk_nope_head_dim=8, v_head_dim=8))


def gemma3():
    text = tf.Gemma3TextConfig(**_attn(head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
                                       layer_types=[("full" if i % 3 == 2 else "sliding") + "_attention"
                                                    for i in range(LAYERS)]))
    vision = tf.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   image_size=28, patch_size=14)
    return tf.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                           image_token_id=VOCAB - 1, boi_token_index=VOCAB - 2, eoi_token_index=VOCAB - 3)


def llava():
    text = tf.LlamaConfig(**_attn())
    vision = tf.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 image_size=28, patch_size=14, projection_dim=16)
    return tf.LlavaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_id=VOCAB - 1,
                          vision_feature_layer=-1)


def qwen2_5_vl():
    text = _attn(head_dim=8, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "mrope_section": [1, 1, 2]})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=HIDDEN,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0])
    return tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=VOCAB - 1,
                               video_token_id=VOCAB - 2, vision_start_token_id=VOCAB - 3,
                               vision_end_token_id=VOCAB - 4, tie_word_embeddings=False)


def gpt2():
    return tf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=4, n_positions=128,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0, tie_word_embeddings=False)


_DEC = {"layers": "model.layers", "embed": "model.embed_tokens", "norm": "model.norm", "lm_head": "lm_head"}
_MM = {"layers": "model.language_model.layers", "embed": "model.language_model.embed_tokens",
       "norm": "model.language_model.norm", "lm_head": "lm_head"}

ARCHS = [
    Arch("llama", llama, "LlamaForCausalLM", _DEC),
    Arch("qwen3", qwen3, "Qwen3ForCausalLM", _DEC),
    Arch("qwen3_moe", qwen3_moe, "Qwen3MoeForCausalLM", _DEC),
    Arch("mixtral", mixtral, "MixtralForCausalLM", _DEC),
    Arch("deepseek_v3", deepseek_v3, "DeepseekV3ForCausalLM", _DEC),
    Arch("gemma3", gemma3, "Gemma3ForConditionalGeneration", _MM, sliding_window=4),
    Arch("llava", llava, "LlavaForConditionalGeneration", _MM),
    Arch("qwen2_5_vl", qwen2_5_vl, "Qwen2_5_VLForConditionalGeneration", _MM),
    Arch("gpt2", gpt2, "GPT2LMHeadModel",
         {"layers": "transformer.h", "embed": "transformer.wte", "norm": "transformer.ln_f", "lm_head": "lm_head"}),
]
BY_NAME = {a.name: a for a in ARCHS}
