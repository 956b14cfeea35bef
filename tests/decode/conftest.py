"""Tiny in-process targets (Llama, Qwen3-MoE, Gemma3 multimodal wrapper) and drafts for decode tests; a saved
target (char tokenizer + ChatML template), draft dir and bench file for `eyas eval` tests."""

import json

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


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def char_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for c in map(chr, range(32, 127)):
        vocab[c] = len(vocab)
    vocab["\n"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML
    return fast


def write_eval_dirs(root):
    """root/target (tiny Llama, vocab 128, char tokenizer), root/draft, root/bench.jsonl (3 questions, 4 turns)."""
    from eyas.draft.io import save_draft
    model = tiny_llama(seed=2, vocab=128)
    model.save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "target")
    draft, _ = random_draft(model)
    save_draft(draft, root / "draft", {"target": "tiny"})
    rows = [{"question_id": 1, "category": "a", "turns": ["hi there", "and again?"]},
            {"question_id": 2, "category": "b", "turns": ["what is 2+2"]},
            {"question_id": 3, "category": "b", "turns": ["another"]}]
    (root / "bench.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


@pytest.fixture
def llama():
    return tiny_llama()
