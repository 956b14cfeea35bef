"""Toy targets with a real model's structure and random weights, written as checkpoints vLLM and eyas both load.

`build_toy(out, "kimi-k2.5")`: a `KimiK25ForConditionalGeneration` dir shaped like Kimi-K2.5 and shrunk: config.json
with Kimi-K2.5's keys (a DeepSeek-V3 `text_config` with MLA, yarn RoPE, the first layer dense and MoE layers with
routed experts + a shared expert and Kimi's routing keys; a MoonViT `vision_config`), weights under the checkpoint
names vLLM's `KimiK25ForConditionalGeneration.load_weights` reads (`language_model.model.layers.N...` with one tensor
per expert, `vision_tower.*`, `mm_projector.proj.{0,2}`), bf16 safetensors with the router bias in fp32, a
`preprocessor_config.json` for vLLM's Kimi vision processor, and a small byte-level BPE tokenizer with Kimi's chat
and media tokens. MLA keeps Kimi-K2.5's kernel-facing sizes (kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim
128, v_head_dim 128: what FlashMLA / FlashInfer-MLA / Triton-MLA on Hopper take); layers, width, heads and experts
shrink instead.
`build_toy(out, "llava-llama")`: the dense control, a Llama inside a Llava wrapper with the same `language_model.*`
checkpoint layout and a tiny CLIP tower.

Deterministic from the seed: each tensor is drawn from its own generator seeded by (seed, its name), so a tensor
never depends on the order others were made in. Builds in about a second on a CPU.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import zlib
from functools import lru_cache
from importlib import resources
from pathlib import Path

import torch

TOYS = ("kimi-k2.5", "llava-llama")

# Kimi's chat and media tokens (the toy's tokenizer has them as single special tokens).
CHAT = {"system": "<|im_system|>", "user": "<|im_user|>", "assistant": "<|im_assistant|>"}
MIDDLE, END = "<|im_middle|>", "<|im_end|>"
MEDIA = ["<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>", "<|kimi_k25_video_placeholder|>"]
SPECIALS = ["[BOS]", "[EOS]", "[UNK]", "[PAD]", *CHAT.values(), MIDDLE, END, *MEDIA, "<image>"]
# Kimi-K2's template reduced to plain-text messages: role marker, role name, middle marker, content, end marker.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif m['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    "{{ m['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}")
VOCAB = 320            # 256 byte tokens + the specials, padded; rows past the tokenizer are never emitted

# Kimi-K2.5's text config with layers, width, heads and experts shrunk; MLA sizes and routing keys as the real one.
KIMI_TEXT = dict(
    architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_size=256, intermediate_size=512,
    moe_intermediate_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, first_k_dense_replace=1, moe_layer_freq=1,
    n_group=1, topk_group=1, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
    routed_scaling_factor=2.827, aux_loss_alpha=0.001, seq_aux=True, ep_size=1, num_nextn_predict_layers=0,
    hidden_act="silu", rms_norm_eps=1e-5, attention_bias=False, attention_dropout=0.0, initializer_range=0.02,
    max_position_embeddings=4096, rope_theta=50000.0, tie_word_embeddings=False, use_cache=True,
    rope_scaling={"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
                  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    torch_dtype="bfloat16")
# MoonViT as vLLM 0.26's KimiK25VisionConfig reads it (hidden_size, init_pos_emb_*), as transformers' Kimi_K25VisionConfig
# (vLLM 0.32) reads it (pos_emb_*, hidden_act), and the real config's vt_* spellings.
KIMI_VISION = dict(
    patch_size=14, init_pos_emb_height=16, init_pos_emb_width=16, init_pos_emb_time=4, pos_emb_type="divided_fixed",
    pos_emb_height=16, pos_emb_width=16, pos_emb_time=4, hidden_act="gelu_pytorch_tanh",
    num_attention_heads=2, num_hidden_layers=1, hidden_size=64, intermediate_size=128, merge_kernel_size=[2, 2],
    video_attn_type="spatial_temporal", merge_type="sd2_tpool", mm_projector_type="patchmerger", mm_hidden_size=64,
    projector_hidden_act="gelu", projector_ln_eps=1e-5, vt_hidden_size=64, vt_num_hidden_layers=1,
    vt_num_attention_heads=2, vt_intermediate_size=128)
# vLLM's fused Kimi vision processor (and the real preprocessor_config.json's keys); tiny patch limits keep vLLM's
# multimodal profiling to a few image tokens.
KIMI_MEDIA = dict(
    in_patch_limit=16, patch_size=14, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], merge_kernel_size=2,
    fixed_output_tokens=None, patch_limit_on_one_side=4, in_patch_limit_each_frame=16, in_patch_limit_video=None,
    sample_fps=2.0, max_num_frames_each_video=None, temporal_merge_kernel_size=4, timestamp_mode="hh:mm:ss.fff")

# The CPU-test size: every structural feature kept (MLA with a LoRA'd query and a rope split, yarn, a dense first
# layer, routed + shared experts), widths cut so a forward takes milliseconds. vLLM's MLA kernels need the full size.
TINY_TEXT = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=2,
                 num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
                 v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2)
SIZES = ("full", "tiny")
# Output projections (into the residual stream) are drawn this much smaller than unit-variance: each block then
# nudges the token's own embedding instead of replacing it, so the toy's greedy text has structure (a draft can
# learn it, as it learns a real model's) while routing, attention and every layer still change the logits.
RESIDUAL_SCALE = 0.35
_INTO_RESIDUAL = re.compile(r"(o_proj|down_proj)\.weight$")

LLAMA_TEXT = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256, intermediate_size=512,
    num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, hidden_act="silu", rms_norm_eps=1e-5,
    max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=False, torch_dtype="bfloat16")
CLIP_VISION = dict(model_type="clip_vision_model", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                   num_attention_heads=2, image_size=28, patch_size=14, projection_dim=64, hidden_act="quick_gelu")


@lru_cache(maxsize=None)
def _corpus() -> tuple[str, ...]:
    """English text shipped with eyas (the Spec-Bench questions): the words toy prompts are drawn from."""
    text = resources.files("eyas.decode").joinpath("spec_bench/question.jsonl").read_text(encoding="utf-8")
    return tuple(t for line in text.splitlines() if line.strip() for t in json.loads(line)["turns"])


def toy_tokenizer():
    """Byte-level tokens and no merges: every byte one token, so the toy's greedy text re-tokenizes to exactly the
    ids it generated (a regenerated answer is what the model said, token for token); Kimi's chat/media tokens and
    chat template on top."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: _BYTE_OF[c])
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="[BOS]", eos_token=END, unk_token="[UNK]",
                                   pad_token="[PAD]")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _byte_level_map() -> dict[str, int]:
    """GPT-2's byte -> printable character map, inverted (the byte each byte-level character stands for)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_BYTE_OF = _byte_level_map()


def _silent_ids(tok) -> list[int]:
    """Token ids the toy never emits (zero lm_head rows): bytes outside printable ASCII and newline (a lone byte of
    a multi-byte character would not decode), the specials other than the end of turn, and the padding rows."""
    silent = [i for c, i in tok.get_vocab().items() if c in _BYTE_OF and not
              (0x20 <= _BYTE_OF[c] <= 0x7E or _BYTE_OF[c] == 0x0A)]
    silent += [tok.convert_tokens_to_ids(t) for t in SPECIALS if t != END]
    return sorted(set(silent) | set(range(len(tok), VOCAB)))


# ---------------------------------------------------------------- weights
def _draw(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A tensor of `shape` for checkpoint key `name`: weights with unit-variance outputs, norms near 1, small
    biases; the router's score bias small so routing depends on the token."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    leaf = name.rsplit(".", 2)
    if name.endswith("e_score_correction_bias"):
        return torch.randn(shape, generator=g) * 0.05
    if len(shape) == 1 and ("norm" in name or "ln" in leaf[-2] or "layrnorm" in name):
        return 1.0 + 0.1 * torch.randn(shape, generator=g) if name.endswith("weight") else \
            0.02 * torch.randn(shape, generator=g)
    if len(shape) == 1:
        return 0.02 * torch.randn(shape, generator=g)
    if "embed_tokens" in name or "pos_emb" in name or "position_embedding" in name:
        return torch.randn(shape, generator=g)
    scale = RESIDUAL_SCALE if _INTO_RESIDUAL.search(name) else 1.0
    return torch.randn(shape, generator=g) * (scale / math.sqrt(math.prod(shape[1:])))


def _meta_state(cls_name: str, config) -> dict[str, tuple[int, ...]]:
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, cls_name)(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _per_expert(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """transformers' fused experts as the checkpoint stores them: one gate/up/down matrix per expert."""
    out = {}
    for key, shape in shapes.items():
        base, _, leaf = key.rpartition(".")
        if base.endswith(".experts") and leaf == "gate_up_proj":       # [E, 2I, H]
            for e in range(shape[0]):
                out[f"{base}.{e}.gate_proj.weight"] = (shape[1] // 2, shape[2])
                out[f"{base}.{e}.up_proj.weight"] = (shape[1] // 2, shape[2])
        elif base.endswith(".experts") and leaf == "down_proj":        # [E, H, I]
            for e in range(shape[0]):
                out[f"{base}.{e}.down_proj.weight"] = (shape[1], shape[2])
        else:
            out[key] = shape
    return out


def _moonvit_shapes(v: dict, text_hidden: int) -> dict[str, tuple[int, ...]]:
    """vLLM's MoonViT tower + patch-merger projector under the real checkpoint's names."""
    h, i, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    merged = h * v["merge_kernel_size"][0] * v["merge_kernel_size"][1]
    out = {"vision_tower.patch_embed.proj.weight": (h, 3, p, p), "vision_tower.patch_embed.proj.bias": (h,),
           "vision_tower.patch_embed.pos_emb.weight": (v["init_pos_emb_height"], v["init_pos_emb_width"], h)}
    for j in range(v["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{j}"
        out.update({f"{b}.norm0.weight": (h,), f"{b}.norm0.bias": (h,), f"{b}.norm1.weight": (h,),
                    f"{b}.norm1.bias": (h,), f"{b}.wqkv.weight": (3 * h, h), f"{b}.wqkv.bias": (3 * h,),
                    f"{b}.wo.weight": (h, h), f"{b}.wo.bias": (h,), f"{b}.mlp.fc0.weight": (i, h),
                    f"{b}.mlp.fc0.bias": (i,), f"{b}.mlp.fc1.weight": (h, i), f"{b}.mlp.fc1.bias": (h,)})
    out.update({"vision_tower.encoder.final_layernorm.weight": (h,), "vision_tower.encoder.final_layernorm.bias": (h,),
                "mm_projector.pre_norm.weight": (h,), "mm_projector.pre_norm.bias": (h,),
                "mm_projector.proj.0.weight": (merged, merged), "mm_projector.proj.0.bias": (merged,),
                "mm_projector.proj.2.weight": (text_hidden, merged), "mm_projector.proj.2.bias": (text_hidden,)})
    return out


# Llava's transformers names -> the checkpoint layout shared with Kimi (`language_model.model.*`), CLIP under
# `vision_tower.vision_model.*` as vLLM's CLIPVisionModel names it (transformers 5 drops that level in the module).
LLAVA_LEGACY = (("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
                ("model.vision_tower.vision_model.", "vision_tower.vision_model."),
                ("model.vision_tower.", "vision_tower.vision_model."),
                ("model.multi_modal_projector.", "multi_modal_projector."))


def _legacy(key: str) -> str:
    for new, old in LLAVA_LEGACY:
        if key.startswith(new):
            return old + key[len(new):]
    raise KeyError(f"{key}: no checkpoint name for this Llava key (LLAVA_LEGACY)")


# ---------------------------------------------------------------- dirs
def _ids(tok) -> dict[str, int]:
    return {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}


def _kimi(tok, size: str) -> tuple[dict, dict[str, tuple[int, ...]], dict]:
    from transformers import DeepseekV3Config

    ids = _ids(tok)
    special = dict(bos_token_id=ids["[BOS]"], eos_token_id=ids[END], pad_token_id=ids["[PAD]"])
    text = dict(KIMI_TEXT, vocab_size=VOCAB, **special, **(TINY_TEXT if size == "tiny" else {}))
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", **special,
              "ignore_index": -100, "media_placeholder_token_id": ids["<|media_pad|>"],   # vLLM 0.26's name
              "image_token_id": ids["<|media_pad|>"], "text_config": text,                  # transformers' name
              "vision_config": dict(KIMI_VISION, text_hidden_size=text["hidden_size"]), "tie_word_embeddings": False,
              "torch_dtype": "bfloat16", "use_unified_vision_chunk": True,
              "video_placeholder": "<|kimi_k25_video_placeholder|>"}
    hf = DeepseekV3Config(**{k: v for k, v in text.items() if k not in ("architectures", "model_type")})
    shapes = {f"language_model.{k}": s for k, s in _per_expert(_meta_state("DeepseekV3ForCausalLM", hf)).items()}
    shapes.update(_moonvit_shapes(KIMI_VISION, text["hidden_size"]))
    return config, shapes, {"media_proc_cfg": dict(KIMI_MEDIA)}


def _llava(tok, size: str) -> tuple[dict, dict[str, tuple[int, ...]], dict]:
    from transformers import LlavaConfig

    ids = _ids(tok)
    special = dict(bos_token_id=ids["[BOS]"], eos_token_id=ids[END], pad_token_id=ids["[PAD]"])
    tiny = {k: TINY_TEXT[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads")}
    text = dict(LLAMA_TEXT, vocab_size=VOCAB, **special, **(dict(tiny, num_key_value_heads=1) if size == "tiny"
                                                           else {}))
    config = LlavaConfig(text_config=text, vision_config=dict(CLIP_VISION), image_token_index=ids["<image>"],
                         vision_feature_layer=-1, vision_feature_select_strategy="default",
                         projector_hidden_act="gelu", tie_word_embeddings=False, **special)
    config.architectures = ["LlavaForConditionalGeneration"]
    shapes = {_legacy(k): s for k, s in _meta_state("LlavaForConditionalGeneration", config).items()}
    doc = config.to_dict()
    doc.pop("transformers_version", None)
    doc["torch_dtype"] = "bfloat16"
    return doc, shapes, {}


def _write_llava_processor(out: Path, tok) -> None:
    """Llava's processor files (image processor + patch size), for engines that build the multimodal processor."""
    from transformers import CLIPImageProcessor, LlavaProcessor

    image = CLIPImageProcessor(size={"shortest_edge": CLIP_VISION["image_size"]},
                               crop_size={"height": CLIP_VISION["image_size"], "width": CLIP_VISION["image_size"]})
    LlavaProcessor(image_processor=image, tokenizer=tok, patch_size=CLIP_VISION["patch_size"],
                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                   chat_template=CHAT_TEMPLATE).save_pretrained(out)


def build_toy(out: str | Path, kind: str = "kimi-k2.5", *, seed: int = 0, size: str = "full",
              overwrite: bool = False) -> Path:
    """Write a toy target directory (config, safetensors, tokenizer, processor files); returns `out`.
    size: "full" (kernel-safe sizes for vLLM) or "tiny" (CPU tests)."""
    from safetensors.torch import save_file

    if kind not in TOYS:
        raise ValueError(f"toy {kind!r}: choose one of {', '.join(TOYS)}")
    if size not in SIZES:
        raise ValueError(f"toy size {size!r}: choose one of {', '.join(SIZES)}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty (pass overwrite=True to replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = toy_tokenizer()
    config, shapes, preprocessor = (_kimi if kind == "kimi-k2.5" else _llava)(tok, size)
    tensors = {}
    for name in sorted(shapes):
        t = _draw(name, shapes[name], seed)
        if name == "language_model.lm_head.weight":
            t[_silent_ids(tok)] = 0.0
        tensors[name] = t if name.endswith("e_score_correction_bias") else t.to(torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(out)
    text = config["text_config"]
    (out / "generation_config.json").write_text(json.dumps(
        {k: text[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}, indent=2) + "\n")
    if preprocessor:
        (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    if kind == "llava-llama":
        _write_llava_processor(out, tok)
    (out / "TOY.json").write_text(json.dumps({"toy": kind, "size": size, "seed": seed, "tensors": len(tensors),
                                              "parameters": sum(t.numel() for t in tensors.values())}) + "\n")
    return out


def toy_conversations(n: int, seed: int = 0) -> list[dict]:
    """`n` single-turn chats whose prompts are word salads from the shipped corpus (never its questions verbatim,
    so a draft evaluated on Spec-Bench did not see those prompts); the assistant turn is a placeholder that
    `eyas regenerate` replaces with the toy's own greedy answer."""
    import random

    words = sorted({w.strip(".,?!:;\"'()") for t in _corpus() for w in t.split() if w.isascii()} - {""})
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        rows.append({"id": f"toy-{i}", "messages": [{"role": "user", "content": prompt[:1].upper() + prompt[1:] + "?"},
                                                    {"role": "assistant", "content": "..."}]})
    return rows
