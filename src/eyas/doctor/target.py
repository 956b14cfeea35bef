"""The target, from its config alone: built on the meta device (decoder layers, block kinds, sizes, --layers-path),
its weight files' sizes and the planned aux layer ids. TargetFacts carries the numbers every later check uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eyas.aux_layers import aux_layer_id_problems, choose_aux_layer_ids, default_aux_layer_ids
from eyas.devices import dtype_bytes
from eyas.doctor.config import Check, DoctorConfig
from eyas.target import LayoutError, build_meta, find_layout, load_config
from eyas.target.fastload import weight_file_problems
from eyas.target.inspect import architecture_name, block_kinds


@dataclass
class TargetFacts:
    """What every check needs to know about the target, from its config alone."""
    config: Any
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_parameters: int
    dtype_bytes: float
    paths: dict[str, str]


def _dtype_bytes(config) -> float:
    """Bytes per weight as served: an fp8 checkpoint (e.g. DeepSeek-V3 / Kimi-K2) stays fp8 on the GPU; a
    compressed-tensors int4 one (Kimi-K2.5's experts) half a byte (its few unquantized layers ignored); a dtype
    the table does not know (auto, a quantized int type) is planned as 2 bytes."""
    t = getattr(config, "text_config", None) or config
    q = getattr(config, "quantization_config", None) or getattr(t, "quantization_config", None) or {}
    q = q if isinstance(q, dict) else q.to_dict()
    if "fp8" in str(q.get("quant_method", "")) or "float8" in str(q.get("fmt", "")) or q.get("fmt") == "e4m3":
        return dtype_bytes("fp8")
    bits = [g.get("weights", {}).get("num_bits") for g in (q.get("config_groups") or {}).values()
            if isinstance(g, dict)] if q.get("quant_method") == "compressed-tensors" else []
    if bits and all(isinstance(b, int) for b in bits):
        return max(bits) / 8
    d = getattr(t, "dtype", None) or getattr(t, "torch_dtype", None) or getattr(config, "dtype", None) or "bf16"
    try:
        return dtype_bytes(d)
    except ValueError:
        return dtype_bytes("bf16")


def check_target(cfg: DoctorConfig, out: list[Check]) -> TargetFacts | None:
    try:
        config = load_config(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any loader failure is this check's finding
        out.append(Check("target config", "fail", f"{cfg.target}: {type(e).__name__}: {e}",
                         "pass a HF model dir with config.json, a hub id, a .gguf or a built-in name"))
        return None
    try:
        model = build_meta(config)
    except Exception as e:  # noqa: BLE001
        out.append(Check("target architecture", "fail", f"cannot build {getattr(config, 'architectures', None)} "
                         f"from its config: {type(e).__name__}: {e}",
                         "upgrade transformers, or pass --trust-remote-code for custom architectures"))
        return None
    try:
        layout = find_layout(model)
    except LayoutError as e:
        out.append(Check("decoder layers", "fail", str(e), "eyas finds the decoder by structure; a model whose "
                         "text decoder is not a ModuleList next to the token embedding is not supported yet"))
        return None
    n, H, V = layout.num_layers, layout.hidden_size, layout.vocab_size
    out.append(Check("decoder layers", "pass", f"{layout.paths['layers']} ({n} x {type(layout.layers[0]).__name__}"
                     f" in {architecture_name(model)}); norm {layout.paths['norm']}, lm_head {layout.paths['lm_head']}"))
    kinds = block_kinds(config)
    out.append(Check("decoder blocks", "pass", f"attention {kinds['attention']}; mlp {kinds['mlp']}"))
    if cfg.layers_path:
        try:
            found = model.get_submodule(cfg.layers_path)
        except AttributeError:
            found = None
        if found is not layout.layers:
            what = "does not exist" if found is None else f"is a {type(found).__name__}, not the decoder layers"
            out.append(Check("layer path", "fail", f"--layers-path {cfg.layers_path} {what} in "
                             f"{architecture_name(model)}; the decoder layers are at {layout.paths['layers']}",
                             f"use {layout.paths['layers']} (a wrapper moves the text model one level down)"))
        else:
            out.append(Check("layer path", "pass", f"{cfg.layers_path} is the decoder"))
    t = getattr(config, "text_config", None) or config
    problems = []
    if getattr(t, "hidden_size", H) != H:
        problems.append(f"config hidden_size {t.hidden_size} != embedding width {H}")
    if getattr(t, "vocab_size", V) != V:
        problems.append(f"config vocab_size {t.vocab_size} != lm_head rows {V}")
    params = sum(p.numel() for p in model.parameters())
    check_weight_files(cfg.target, out)
    out.append(Check("hidden size / vocab", "fail" if problems else "pass",
                     "; ".join(problems) or f"hidden {H}, vocab {V}, {params / 1e9:,.2f}B parameters",
                     "fix the target's config.json" if problems else ""))
    return TargetFacts(config, n, H, V, params, _dtype_bytes(config), layout.paths)


def check_weight_files(spec: str, out: list[Check]) -> None:
    """A local target's weight files are whole (the config alone cannot tell; loading would fail hours later)."""
    d = Path(str(spec)).expanduser()
    if not d.is_dir() or not list(d.glob("*.safetensors")):
        return
    problems = weight_file_problems(d)
    out.append(Check("target weights", "fail" if problems else "pass", "; ".join(problems[:3]) or
                     f"{len(list(d.glob('*.safetensors')))} safetensors file(s) whole (sizes match their headers)",
                     "copy the target's weights again" if problems else ""))


def check_aux(cfg: DoctorConfig, facts: TargetFacts, draft_aux: list[int] | None, out: list[Check]) -> list[int]:
    ids, source = choose_aux_layer_ids(cfg.aux_layer_ids, facts.num_layers, recorded=draft_aux,
                                       recorded_where="the draft")
    problems = aux_layer_id_problems(ids, facts.num_layers, key=source)
    if problems:
        out.append(Check("aux layer ids", "fail", "; ".join(problems),
                         f"pick ids in 0..{facts.num_layers - 1}, e.g. "
                         f"{default_aux_layer_ids(facts.num_layers)}"))
        return ids
    out.append(Check("aux layer ids", "pass", f"{ids} from {source}, valid for {facts.num_layers} layers"))
    return ids
