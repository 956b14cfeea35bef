"""Tiny in-process targets (Llama, Qwen3-MoE, Gemma3 multimodal wrapper) and drafts for decode tests."""

import pytest
import torch

from eyas.draft.model import Eagle3Draft, draft_config_from_target
from eyas.target import default_aux_layer_ids, wrap_model

V = 96


def tiny_llama(seed=0, vocab=V, layers=4):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def tiny_moe(seed=0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(vocab_size=V, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=4, num_experts_per_tok=2, max_position_embeddings=512,
                         attn_implementation="sdpa")
    return Qwen3MoeForCausalLM(cfg).eval()


def tiny_gemma3(seed=0):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    torch.manual_seed(seed)
    text = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=8,
                layer_types=["sliding_attention", "full_attention"] * 2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=V - 1,
                       boi_token_index=V - 2, eoi_token_index=V - 3)
    cfg._attn_implementation = "sdpa"
    cfg.text_config._attn_implementation = "sdpa"
    return Gemma3ForConditionalGeneration(cfg).eval()


def random_draft(model, seed=1, scale=1.0):
    torch.manual_seed(seed)
    target = wrap_model(model)
    aux = default_aux_layer_ids(target.layout.num_layers)
    d = Eagle3Draft(draft_config_from_target(model.config, aux_layer_ids=aux))
    with torch.no_grad():
        for p in d.parameters():
            p.mul_(scale)
    d.init_from_target(target.layout.embed.weight, target.layout.lm_head.weight)
    return d.eval(), target


@pytest.fixture
def llama():
    return tiny_llama()
