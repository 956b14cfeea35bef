"""GGUF -> plain HF directory (bf16 safetensors, config, tokenizer), the GGUF's header parsed once.

target/gguf_header.py parses the header (metadata, tensor infos) in a fraction of a second; target/gguf_meta.py
builds the config and the tokenizer from it (equal to what transformers builds from the file, without its
repeated parses of the vocabulary). Each tensor's raw bytes go to `device` (the GPU when there is one) and are
dequantised there in torch (target/dequant.py, equal to the reference bit for bit), renamed by the tables
below, cast to `dtype` and handed to target/st_write.py, whose threads write it at its place in
model.safetensors while the next one is dequantised. Architectures outside the tables convert through
transformers' own GGUF loader (numpy, slower).

llama.cpp stores Llama's q/k rows interleaved for its RoPE (pairs 2i, 2i+1); HF pairs i with i + d/2, so
those rows are put back per head (`unpermute`, as transformers' loader does). Qwen2's are stored as HF has
them, with q/k/v biases.

The tokenizer names as bos/eos/pad the tokens of the GGUF's own `tokenizer.ggml.*_token_id` (as the config
does), whichever tokens this transformers' GGUF converter picked (5.17 picks others: target/special.py).
"""

from __future__ import annotations

import re
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch

from eyas.target.dequant import dequantize
from eyas.target.gguf_header import GGUFHeader, TensorInfo, read_header
from eyas.target.special import align_tokenizer

GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# GGUF architecture -> whether its q/k rows are stored in llama.cpp's interleaved RoPE order
ARCHITECTURES = {"llama": True, "qwen2": False}
# llama.cpp's precomputed RoPE scaling factors: the model computes them from its config (transformers skips it too)
SKIPPED = {"rope_freqs.weight"}
# What a converted dir was written by: a built-in target converted by an older one is converted again (version 2:
# the tokenizer names the GGUF's own bos/eos/pad ids, whatever transformers' GGUF reader assigns).
CONVERTER_VERSION = 2
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")


def hf_name(name: str, arch: str) -> str:
    """The HF state-dict key of a GGUF tensor; an unknown name is an error naming it."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    m = _LAYER.fullmatch(name)
    if m and m[2] in LAYER_NAMES:
        return f"model.layers.{m[1]}.{LAYER_NAMES[m[2]]}"
    raise KeyError(f"GGUF tensor {name!r} has no HF name for a {arch} model (known: {', '.join(GLOBAL_NAMES)}, "
                   f"blk.N.{{{', '.join(LAYER_NAMES)}}})")


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's interleaved q/k rows ([d/2, 2] per head) back to HF's half-split order ([2, d/2])."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def tensor_names(h: GGUFHeader) -> list[tuple[TensorInfo, str]]:
    """Every tensor of the GGUF with its HF name (llama.cpp's precomputed RoPE factors left out)."""
    named, seen = [], set()
    for t in h.tensors:
        if t.name in SKIPPED:
            continue
        key = hf_name(t.name, h.arch)
        if key in seen:
            raise ValueError(f"{h.path}: two GGUF tensors map to {key} (the second is {t.name!r})")
        seen.add(key)
        named.append((t, key))
    return named


def iter_tensors(h: GGUFHeader, *, dtype: torch.dtype | None, device, counts: Counter | None = None
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) for every tensor of the GGUF, dequantised on `device`, cast to `dtype`, left there."""
    arch = h.arch
    permuted = ARCHITECTURES[arch]
    heads = int(h.get(f"{arch}.attention.head_count", 0))
    kv_heads = int(h.get(f"{arch}.attention.head_count_kv", heads) or heads)
    device = torch.device(device)
    for t, key in tensor_names(h):
        raw = torch.from_numpy(h.data(t)).to(device)
        w = dequantize(raw, t.qtype, t.shape, name=f"{h.path}: {t.name}")
        if permuted and ".attn_q." in t.name:
            w = unpermute(w, heads)
        elif permuted and ".attn_k." in t.name:
            w = unpermute(w, kv_heads)
        if counts is not None:
            counts[t.qtype.name] += 1
        yield key, (w.to(dtype) if dtype is not None else w)


def read_tensors(h: GGUFHeader, *, dtype: torch.dtype | None, device, counts: Counter | None = None
                 ) -> dict[str, torch.Tensor]:
    """Every tensor of the GGUF under its HF name, dequantised on `device`, cast to `dtype`, left on `device`."""
    return dict(iter_tensors(h, dtype=dtype, device=device, counts=counts))


def as_checkpoint_config(config, dtype: torch.dtype):
    """The HF config of a GGUF as a plain checkpoint's: no quantization_config, `dtype`, the causal-LM class."""
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = dtype
    if not getattr(config, "architectures", None):   # what save_pretrained of the model class would record
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    return config


def _config(gguf: Path, dtype: torch.dtype):
    """transformers' own reading of a GGUF's config (a full parse of the file)."""
    from transformers import AutoConfig

    return as_checkpoint_config(AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name), dtype)


def _tokenizer(gguf: Path):
    """transformers' own GGUF tokenizer (it parses the file again, twice)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def check_state(state: dict, config, where: str) -> None:
    """The converted tensors (or their shapes) are exactly the model's (names and shapes), the tied lm_head aside."""
    from eyas.target.layers import build_meta, text_config

    own = {k: tuple(v.shape) for k, v in build_meta(config).state_dict().items()}
    if getattr(text_config(config), "tie_word_embeddings", False):
        own.pop("lm_head.weight", None)
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"{where}: the GGUF's tensors are not the model's: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    for k, shape in own.items():
        got = tuple(getattr(state[k], "shape", state[k]))
        if got != shape:
            raise ValueError(f"{where}: tensor {k} has shape {list(got)}, the model's is {list(shape)}")


def gguf_to_hf(gguf: Path, out: Path, *, dtype: torch.dtype = torch.bfloat16, device=None,
               write_threads: int = 4) -> dict:
    """De-quantize a GGUF into a plain HF dir (no quantization_config, so every tool reads it).

    device: where to dequantise (default: cuda when available). write_threads: threads writing model.safetensors
    while the tensors are dequantised. Returns seconds per phase (parse, config, tokenizer, dequant; write is
    what was left to write once the last tensor was dequantised) and counts."""
    from transformers import GenerationConfig

    from eyas.target.gguf_meta import fast_path_problem, gguf_special_ids, hf_config, hf_tokenizer
    from eyas.target.st_write import SafetensorsWriter

    gguf, out = Path(gguf), Path(out)
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    clock = [time.perf_counter()]

    def lap(sync: bool = False) -> float:
        if sync and device.type == "cuda":   # the dequant lap: the GPU's queue, and its start-up, are its own
            torch.cuda.synchronize(device)
        clock.append(time.perf_counter())
        return round(clock[-1] - clock[-2], 3)

    seconds: dict[str, float] = {}
    h = read_header(gguf)
    if h.arch not in ARCHITECTURES:
        _via_transformers(gguf, out, dtype, h)
        return {"reader": "transformers", "arch": h.arch, "seconds": {"total": lap()}}
    out.mkdir(parents=True, exist_ok=True)
    named = tensor_names(h)
    seconds["parse"] = lap()
    problem = fast_path_problem(h)
    config = as_checkpoint_config(hf_config(h) if problem is None else _config(gguf, dtype), dtype)
    check_state({key: t.shape for t, key in named}, config, str(gguf))
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    seconds["config"] = lap()
    tokenizer = hf_tokenizer(h, config) if problem is None else _tokenizer(gguf)
    align_tokenizer(tokenizer, gguf_special_ids(h)).save_pretrained(out)
    seconds["tokenizer"] = lap()
    counts: Counter = Counter()
    layout = {key: (dtype, t.shape) for t, key in named}
    with SafetensorsWriter(out / "model.safetensors", layout, {"format": "pt"}, workers=write_threads) as writer:
        for key, w in iter_tensors(h, dtype=dtype, device=device, counts=counts):
            writer.put(key, w)
        seconds["dequant"] = lap(sync=True)
    seconds["write"] = lap()
    seconds["total"] = round(clock[-1] - clock[0], 3)
    return {"reader": "eyas", "metadata": problem or "header", "arch": h.arch, "device": str(device),
            "dtype": str(dtype).replace("torch.", ""), "tensors": sum(counts.values()), "types": dict(counts),
            "parameters": sum(t.numel for t, _ in named), "write_threads": write_threads, "seconds": seconds}


def _via_transformers(gguf: Path, out: Path, dtype: torch.dtype, h: GGUFHeader) -> None:
    """Any architecture transformers' GGUF loader knows: load in float32, save in `dtype`."""
    from transformers import AutoModelForCausalLM

    from eyas.target.gguf_meta import gguf_special_ids

    config, tokenizer = _config(gguf, dtype), _tokenizer(gguf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise RuntimeError(f"GGUF conversion of {gguf}: missing {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out)
    align_tokenizer(tokenizer, gguf_special_ids(h)).save_pretrained(out)
