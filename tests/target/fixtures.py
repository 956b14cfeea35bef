"""On-disk targets for the load tests, written in-process: HF dirs, a fake hub cache, a tiny GGUF.

The GGUF is written the way llama.cpp's converter lays out a Llama (its tensor names, its
interleaved-RoPE row order for q/k, a GPT-2-style BPE vocabulary), in F32 so that loading it back
through transformers must reproduce the source model's logits exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# Byte-level BPE vocabulary: 3 specials, the letters, the space marker, then merges of "Ġ" + letter.
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
SPECIALS = ["<unk>", "<s>", "</s>"]
TOKENS = SPECIALS + LETTERS + ["Ġ"] + ["Ġ" + c for c in LETTERS]
MERGES = ["Ġ " + c for c in LETTERS]
VOCAB = len(TOKENS)  # 56


def tiny_llama(seed: int = 0, tie: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tie, bos_token_id=1,
                      eos_token_id=2, pad_token_id=2)
    cfg.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.2)
            else:
                p.uniform_(0.5, 1.5)  # non-trivial norms: a wrong norm mapping must show
    return model


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    bpe = models.BPE(vocab={t: i for i, t in enumerate(TOKENS)}, merges=[tuple(m.split(" ")) for m in MERGES],
                     unk_token="<unk>")
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>")


def write_hf_dir(path: Path, model=None) -> Path:
    model = model if model is not None else tiny_llama()
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def write_hub_cache(cache: Path, repo_id: str, model=None, revision: str = "0123456789abcdef0123456789abcdef01234567"
                    ) -> Path:
    """The layout huggingface_hub keeps: models--org--name/{refs/main, snapshots/<rev>/files}."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    write_hf_dir(snapshot, model)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def _to_llama_cpp_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's q/k rows pair dimension i with i + d/2 for RoPE; llama.cpp pairs 2i with 2i+1.
    Reorder rows per head from [2, d/2] (half-split) to [d/2, 2] (interleaved)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_qwen2(seed: int = 0, hidden: int = 256):
    """A Qwen2 (q/k/v biases, untied) whose rows are a multiple of 256 wide, as the K-quants need."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
                      rope_theta=1e6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    cfg.architectures = ["Qwen2ForCausalLM"]
    model = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.05) if "norm" not in name else p.uniform_(0.5, 1.5)
    return model


LAYER_TENSORS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}


def _encode(name: str, t: np.ndarray, qtype, rng) -> tuple[np.ndarray, object]:
    """(data, raw_dtype) for GGUFWriter.add_tensor. Types gguf can quantize quantize `t`; the K-quants (which
    it cannot) get random blocks with small finite fp16 scales, so the tensor is random but well formed."""
    import gguf
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

    if qtype is None or qtype == Q.F32 or t.ndim == 1:
        return np.ascontiguousarray(t, dtype=np.float32), None
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        block, size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(t.size // block, size), dtype=np.uint8)
        for off in ([208] if qtype == Q.Q6_K else [0, 2]):
            raw[:, off:off + 2] = (rng.uniform(2e-4, 2e-3, len(raw))).astype(np.float16).view(np.uint8).reshape(-1, 2)
        return raw.reshape(t.shape[0], -1), qtype
    return gguf.quants.quantize(np.ascontiguousarray(t, dtype=np.float32), qtype), qtype


# A chat template over the tiny vocabulary's special tokens
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant {% endif %}")


def write_tiny_gguf(path: Path, model=None, arch: str = "llama", qtypes=None, seed: int = 0,
                    chat_template: str | None = None, extra: dict | None = None,
                    special: tuple[int | None, int | None, int | None] = (1, 2, 2)) -> Path:
    """`model` as llama.cpp's converter writes it for `arch` (llama or qwen2). qtypes: GGUF tensor name ->
    GGMLQuantizationType (default F32 everywhere, so a load must reproduce the model exactly). extra: more
    metadata, key -> value (typed by gguf's writer). special: tokenizer.ggml.{bos,eos,padding}_token_id (None:
    the key is left out)."""
    import gguf

    model = model if model is not None else tiny_llama()
    cfg = model.config
    qtypes = qtypes or {}
    rng = np.random.default_rng(seed)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch == "llama":
        w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
        w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    if arch == "qwen2":
        w.add_tokenizer_pre("qwen2")
    w.add_token_list(TOKENS)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))  # 3 = control, 1 = normal
    w.add_token_merges(MERGES)
    for add_id, i in zip((w.add_bos_token_id, w.add_eos_token_id, w.add_pad_token_id), special):
        if i is not None:
            add_id(i)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for key, value in (extra or {}).items():
        w.add_key_value(key, value, gguf.GGUFValueType.get_type(value))

    def add(name, t):
        data, raw = _encode(name, t, qtypes.get(name), rng)
        if raw is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=raw)

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, gg in LAYER_TENSORS.items():
            for kind in ("weight", "bias"):
                key = f"model.layers.{i}.{hf}.{kind}"
                if key not in sd:
                    continue
                t = sd[key]
                if arch == "llama" and gg == "attn_q":
                    t = _to_llama_cpp_rows(t, cfg.num_attention_heads)
                elif arch == "llama" and gg == "attn_k":
                    t = _to_llama_cpp_rows(t, cfg.num_key_value_heads)
                add(f"blk.{i}.{gg}.{kind}", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
