"""Fast target load: meta-device build, mmap'd safetensors read by parallel threads, direct assignment.

`from_pretrained` is general (key renames, quantizers, device maps) but serial. For the common case,
a model whose checkpoint keys are its own state-dict keys, this is the shortest path from disk to device:
  1. build the architecture on the meta device (no init, no bytes);
  2. read every tensor of every shard through safetensors' mmap with `workers` threads (the page cache
     fills in parallel; each tensor goes straight to `device` in `dtype`);
  3. `load_state_dict(assign=True)`: the read tensors become the parameters, nothing is copied again;
  4. re-tie tied weights and rebuild the non-persistent buffers (RoPE inv_freq) that meta left empty.
A GGUF goes through the same steps with eyas's GGUF reader (target/gguf_convert.py; transformers' for other
architectures).
Anything this cannot prove complete (a missing or unexpected key, a buffer it cannot rebuild) raises
`FastLoadUnsupported`, and `load_target` falls back to `from_pretrained`.
tests/target/test_fastload.py checks weights, buffers and logits equal `from_pretrained`'s.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

from eyas.target.keys import fuse_experts
from eyas.target.layers import model_class_for
from eyas.target.wrapped import WrappedTextLM


class FastLoadUnsupported(RuntimeError):
    """The fast path cannot load this checkpoint exactly; use from_pretrained."""


def safetensors_files(path: str | os.PathLike) -> list[Path]:
    """The shard files of an HF dir: from model.safetensors.index.json, or the single model.safetensors."""
    d = Path(path)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise FastLoadUnsupported(f"{index}: not a safetensors index (no weight_map): {e}") from e
        files = [d / f for f in sorted(set(weight_map.values()))]
    elif (d / "model.safetensors").is_file():
        files = [d / "model.safetensors"]
    else:
        raise FastLoadUnsupported(f"{d}: no model.safetensors or model.safetensors.index.json")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{d}: shard files named by the index are missing: {missing[:3]}")
    return files


def weight_file_problems(d: str | os.PathLike) -> list[str]:
    """A dir's safetensors files whose size is not what their own header says (a copy cut short, a full disk),
    read from the headers alone."""
    problems = []
    for f in sorted(Path(d).glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n)) if 0 < n < (1 << 27) else None
        except (OSError, ValueError):
            header = None
        if not isinstance(header, dict):
            problems.append(f"{f.name}: no readable safetensors header")
            continue
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
                and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2]
        want = 8 + n + max(ends, default=0)
        if f.stat().st_size != want:
            problems.append(f"{f.name}: {f.stat().st_size:,} bytes on disk, its header needs {want:,} (cut short?)")
    return problems


def read_safetensors(files: list[Path], *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                     workers: int = 8, keep=None, fp32=()) -> dict[str, torch.Tensor]:
    """All tensors of `files` (those `keep(key)` accepts), read in parallel (each thread its own mmap handle and
    slice of keys); keys naming a module in `fp32` stay float32."""
    from safetensors import safe_open

    in_fp32 = re.compile("|".join(rf"(^|\.){re.escape(m)}($|\.)" for m in fp32)) if fp32 else None
    jobs = []
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            keys = [k for k in h.keys() if keep is None or keep(k)]
        per = max(1, -(-len(keys) // max(1, workers // len(files) or 1)))
        jobs += [(f, keys[i:i + per]) for i in range(0, len(keys), per)]
    device = torch.device(device)

    def read(job):
        f, keys = job
        out = {}
        with safe_open(str(f), framework="pt", device="cpu") as h:
            for k in keys:
                t = h.get_tensor(k)
                if dtype is not None and t.is_floating_point():
                    t = t.to(torch.float32 if in_fp32 is not None and in_fp32.search(k) else dtype)
                out[k] = t.to(device, non_blocking=False) if device.type != "cpu" else t
        return out

    state: dict[str, torch.Tensor] = {}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for part in pool.map(read, jobs):
            dup = state.keys() & part.keys()
            if dup:
                raise FastLoadUnsupported(f"tensor {sorted(dup)[0]} appears in two shard files")
            state.update(part)
    return state


def read_gguf(path: Path, meta_model: nn.Module, dtype: torch.dtype | None, device) -> dict[str, torch.Tensor]:
    """Dequantised GGUF tensors under the model's own names: eyas's reader (torch, on `device`) for the
    architectures it maps, else transformers' reader and name map."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from eyas.target.gguf_convert import ARCHITECTURES, read_tensors
    from eyas.target.gguf_header import read_header

    header = read_header(path)
    if header.arch in ARCHITECTURES:
        try:
            return read_tensors(header, dtype=dtype, device=device)
        except KeyError as e:   # a tensor the name tables do not know
            raise FastLoadUnsupported(str(e)) from e

    try:
        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=meta_model)["tensors"]
    except TypeError as e:  # an older reader without model_to_load
        raise FastLoadUnsupported(f"{path}: this transformers' GGUF reader cannot map names: {e}") from e
    return {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).to(device)
            for k, v in tensors.items()}


def _rebuild_meta_buffers(model: nn.Module, device) -> None:
    """Non-persistent buffers (RoPE frequencies) are computed in __init__ and were left on meta."""
    for name, mod in model.named_modules():
        bufs = [b for b, t in mod.named_buffers(recurse=False) if t.is_meta]
        if not bufs:
            continue
        config = getattr(mod, "config", None)
        if config is None:
            raise FastLoadUnsupported(f"module {name or type(mod).__name__}: buffers {bufs} are computed at init "
                                      "and it has no config to rebuild them from")
        try:
            with torch.device("cpu"):
                fresh = type(mod)(config=config)
        except TypeError as e:
            raise FastLoadUnsupported(f"module {name}: cannot rebuild buffers {bufs}: {e}") from e
        for b in bufs:
            setattr(mod, b, getattr(fresh, b).to(device))
        for attr, v in vars(fresh).items():      # e.g. attention_scaling, computed with the buffers
            if not attr.startswith("_") and isinstance(v, (int, float)):
                setattr(mod, attr, v)


def fast_load_model(model_dir: str | os.PathLike, config, *, dtype: torch.dtype = torch.bfloat16,
                    device: str | torch.device = "cpu", attn_implementation: str | None = None,
                    gguf_file: str | None = None, workers: int = 8) -> nn.Module:
    """Weights of an HF dir (single or sharded safetensors) or a GGUF file on `device`, in eval mode."""
    if getattr(config, "quantization_config", None):
        raise FastLoadUnsupported(f"{model_dir}: quantized checkpoint ({type(config.quantization_config).__name__}); "
                                  "from_pretrained runs its quantizer")
    cls = model_class_for(config)
    wrapped = cls is WrappedTextLM
    if not wrapped and (getattr(cls, "_keep_in_fp32_modules", None) or getattr(cls, "_keep_in_fp32_modules_strict",
                                                                               None)):
        raise FastLoadUnsupported(f"{cls.__name__} keeps some modules in fp32; from_pretrained knows which")
    if attn_implementation:
        config._attn_implementation = attn_implementation
    config.dtype = dtype
    with torch.device("meta"):
        # Auto* classes only have from_config; model classes have _from_config (no init of weights' values)
        build = cls._from_config if issubclass(cls, nn.Module) else cls.from_config
        model = build(config, dtype=dtype)
    device = torch.device(device)
    if gguf_file:
        state = read_gguf(Path(model_dir) / gguf_file, model, dtype, device)
    else:
        # A wrapper's text model reads only its own keys, in the dtypes its class keeps (the router in fp32).
        state = read_safetensors(safetensors_files(model_dir), device=device, dtype=dtype, workers=workers,
                                 keep=model.owns if wrapped else None, fp32=model.keep_in_fp32 if wrapped else ())
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    try:
        state = fuse_experts(state, shapes)
    except KeyError as e:
        raise FastLoadUnsupported(f"{model_dir}: {e.args[0]}") from e
    own = set(shapes)
    unexpected = sorted(set(state) - own)
    tied = {k for k in own - set(state) if k.endswith("lm_head.weight")} if getattr(
        config.get_text_config() if hasattr(config, "get_text_config") else config, "tie_word_embeddings", False) \
        else set()
    missing = sorted(own - set(state) - tied)
    if unexpected or missing:
        raise FastLoadUnsupported(f"{model_dir}: checkpoint keys are not the model's (missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]}); from_pretrained maps them")
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.tie_weights()
    _rebuild_meta_buffers(model, device)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise FastLoadUnsupported(f"{model_dir}: tensors {left[:3]} were not loaded")
    model.eval()
    model.requires_grad_(False)
    return model
