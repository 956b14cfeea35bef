"""GGUF -> plain HF directory (bf16 safetensors, config, tokenizer) with eyas's own tensor reader.

The `gguf` package's GGUFReader parses the header and maps the file; each tensor's raw bytes go to
`device` (the GPU when there is one) and are dequantised there in torch (target/dequant.py, equal to the
reference bit for bit), renamed by the tables below and cast to `dtype`. transformers still builds the
config and the tokenizer from the GGUF's metadata (cheap next to the weights). Architectures outside the
tables convert through transformers' own GGUF loader (numpy, slower).

llama.cpp stores Llama's q/k rows interleaved for its RoPE (pairs 2i, 2i+1); HF pairs i with i + d/2, so
those rows are put back per head (`unpermute`, as transformers' loader does). Qwen2's are stored as HF has
them, with q/k/v biases.
"""

from __future__ import annotations

import re
import time
import warnings
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from eyas.target.dequant import dequantize

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


def field_value(reader, key: str, default=None):
    """A scalar or string metadata value of an open GGUF, read from the parts every gguf release has."""
    from gguf import GGUFValueType

    f = reader.fields.get(key)
    if f is None or not f.data:
        return default
    part = f.parts[f.data[0]]
    return bytes(part).decode("utf-8") if f.types[0] == GGUFValueType.STRING else part.tolist()[0]


def open_gguf(path: str | Path):
    """The GGUFReader of `path` (copy-on-write map: tensors can be wrapped by torch without a copy, the file is
    never written) and its architecture; a file that is not a GGUF is an error naming it."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path), "c")
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: not a readable GGUF file: {e}") from e
    return reader, str(field_value(reader, "general.architecture", ""))


def read_tensors(reader, arch: str, *, dtype: torch.dtype | None, device, counts: Counter | None = None,
                 name: str = "gguf") -> dict[str, torch.Tensor]:
    """Every tensor of an open GGUF under its HF name, dequantised on `device`, cast to `dtype`, left on `device`."""
    permuted = ARCHITECTURES[arch]
    heads = int(field_value(reader, f"{arch}.attention.head_count", 0))
    kv_heads = int(field_value(reader, f"{arch}.attention.head_count_kv", heads) or heads)
    device = torch.device(device)
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name in SKIPPED:
            continue
        key = hf_name(t.name, arch)
        if key in state:
            raise ValueError(f"{name}: tensor {t.name!r} appears twice")
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))   # GGUF lists dims innermost first
        raw = torch.from_numpy(np.asarray(t.data).reshape(-1).view(np.uint8)).to(device)
        w = dequantize(raw, t.tensor_type, shape, name=f"{name}: {t.name}")
        if permuted and ".attn_q." in t.name:
            w = unpermute(w, heads)
        elif permuted and ".attn_k." in t.name:
            w = unpermute(w, kv_heads)
        state[key] = w.to(dtype) if dtype is not None else w
        if counts is not None:
            counts[t.tensor_type.name] += 1
    return state


def _config(gguf: Path, dtype: torch.dtype):
    """The HF config of a GGUF as a plain checkpoint's: no quantization_config, `dtype`, the causal-LM class."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = dtype
    if not getattr(config, "architectures", None):   # what save_pretrained of the model class would record
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    return config


def _tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def write_metadata(part: str, gguf: str, out: str, dtype: str) -> float:
    """Write the config (config.json, generation_config.json) or the tokenizer files of `gguf` into `out`; returns
    its seconds. Each runs in a child process beside the tensors for a large GGUF: transformers parses the whole
    GGUF header again for each (the 150k-entry vocabulary arrays cost seconds)."""
    from transformers import GenerationConfig

    t0 = time.perf_counter()
    Path(out).mkdir(parents=True, exist_ok=True)
    if part == "config":
        config = _config(Path(gguf), getattr(torch, dtype))
        config.save_pretrained(out)
        GenerationConfig.from_model_config(config).save_pretrained(out)
    else:
        _tokenizer(Path(gguf)).save_pretrained(out)
    return time.perf_counter() - t0


def check_state(state: dict[str, torch.Tensor], config, where: str) -> None:
    """The converted tensors are exactly the model's (names and shapes), the tied lm_head aside."""
    from eyas.target.layers import build_meta, text_config

    own = {k: tuple(v.shape) for k, v in build_meta(config).state_dict().items()}
    if getattr(text_config(config), "tie_word_embeddings", False):
        own.pop("lm_head.weight", None)
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"{where}: the GGUF's tensors are not the model's: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    for k, shape in own.items():
        if tuple(state[k].shape) != shape:
            raise ValueError(f"{where}: tensor {k} has shape {list(state[k].shape)}, the model's is {list(shape)}")


# A GGUF this large has a vocabulary whose metadata takes transformers seconds to parse: worth a child process
SIDE_PROCESS_BYTES = 64 << 20


def gguf_to_hf(gguf: Path, out: Path, *, dtype: torch.dtype = torch.bfloat16, device=None,
               side_process: bool | None = None) -> dict:
    """De-quantize a GGUF into a plain HF dir (no quantization_config, so every tool reads it).

    device: where to dequantise (default: cuda when available). side_process: write the config and the tokenizer
    from two child processes while the tensors are read (default: for files over SIDE_PROCESS_BYTES, where it
    saves more than a child's start-up). Returns seconds per phase (parse, dequant, write; config and tokenizer
    are the time each took, `wait_metadata` what the tensors waited for them) and counts."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from safetensors.torch import save_file
    from transformers import AutoConfig

    gguf, out = Path(gguf), Path(out)
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    clock = [time.perf_counter()]

    def lap() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        clock.append(time.perf_counter())
        return round(clock[-1] - clock[-2], 3)

    seconds: dict[str, float] = {}
    reader, arch = open_gguf(gguf)
    if arch not in ARCHITECTURES:
        del reader
        _via_transformers(gguf, out, dtype)
        return {"reader": "transformers", "arch": arch, "seconds": {"total": lap()}}
    out.mkdir(parents=True, exist_ok=True)
    seconds["parse"] = lap()
    if side_process is None:
        side_process = gguf.stat().st_size > SIDE_PROCESS_BYTES
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=spawn) if side_process else nullcontext() as pool:
        args = (str(gguf), str(out), str(dtype).replace("torch.", ""))
        side = {p: pool.submit(write_metadata, p, *args) for p in ("config", "tokenizer")} if pool else {}
        counts: Counter = Counter()
        state = read_tensors(reader, arch, dtype=dtype, device=device, counts=counts, name=str(gguf))
        state = {k: v.cpu() for k, v in state.items()}
        seconds["dequant"] = lap()
        for p in ("config", "tokenizer"):
            seconds[p] = round(side[p].result() if side else write_metadata(p, *args), 3)
        seconds["wait_metadata"] = lap()
    check_state(state, AutoConfig.from_pretrained(out), str(gguf))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    seconds["write"] = lap()
    seconds["total"] = round(clock[-1] - clock[0], 3)
    return {"reader": "eyas", "arch": arch, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
            "tensors": sum(counts.values()), "types": dict(counts),
            "parameters": sum(v.numel() for v in state.values()), "seconds": seconds}


def _via_transformers(gguf: Path, out: Path, dtype: torch.dtype) -> None:
    """Any architecture transformers' GGUF loader knows: load in float32, save in `dtype`."""
    from transformers import AutoModelForCausalLM

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
    tokenizer.save_pretrained(out)
