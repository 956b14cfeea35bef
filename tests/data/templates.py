"""Real chat-template styles and a small byte-level BPE tokenizer built in-process (no network, no cache).

The templates are the published ones for Llama-3 Instruct, Qwen2.5 (ChatML with a default system prompt),
Gemma-3 (system folded into the first user turn, `model` role, trimmed content), Gemma-2 (refuses system
messages) and SmolLM2-Instruct (ChatML with its default system prompt), reduced to plain-text messages.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}"
    "{%- endif %}{%- for message in messages %}"
    "{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\") %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

GEMMA3 = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}"
)

GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# style -> (template, the token that must close every assistant turn)
STYLES = {
    "llama3": (LLAMA3, "<|eot_id|>"),
    "qwen25": (QWEN25, "<|im_end|>"),
    "gemma3": (GEMMA3, "<end_of_turn>"),
    "smollm2": (SMOLLM2, "<|im_end|>"),
}

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<pad>"]
BOS = {"llama3": "<|begin_of_text|>", "gemma3": "<bos>", "gemma2": "<bos>"}

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "Hello! How can I help you today?",
    "system user assistant model", "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "def f(x):\n    return x * 2\n", "2 + 2 = 4. The answer is four.", "Paris is the capital of France.",
]


@lru_cache(maxsize=None)
def _backend_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer)
    return tok.to_str()


def make_tokenizer(style: str = "smollm2", template: str | None = None):
    """A fresh fast tokenizer (byte-level BPE: every string round-trips) with a style's specials + template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tpl = template or {**{k: v[0] for k, v in STYLES.items()}, "gemma2": GEMMA2}[style]
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_backend_json()),
                                  bos_token=BOS.get(style, "<|im_start|>"), eos_token=STYLES.get(style, (0, "<end_of_turn>"))[1],
                                  unk_token="<|endoftext|>", pad_token="<pad>")
    tok.chat_template = tpl
    return tok


def make_target_dir(path: Path, style: str = "smollm2") -> Path:
    """A target directory prepare can read: tokenizer files + a tiny Llama config (no weights needed)."""
    from transformers import LlamaConfig

    path = Path(path)
    tok = make_tokenizer(style)
    tok.save_pretrained(path)
    LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id).save_pretrained(path)
    return path


def make_model_dir(path: Path, style: str = "smollm2", seed: int = 0) -> Path:
    """make_target_dir plus random weights: a target every stage can run (prepare, train, eval)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    make_target_dir(path, style)
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig.from_pretrained(path)).save_pretrained(path)
    return Path(path)


def write_jsonl(path: Path, rows: list) -> Path:
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path
