"""Reading draft checkpoints in any of the engine formats, and the contract check over (config, tensors)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eyas.draft.kinds import PACKAGES, get_kind, kind_for_speculators_type
from eyas.draft.model import DraftConfig
from eyas.export.contract import MIDLAYER, SPECULATORS, check_tensors
from eyas.export.formats import from_midlayer


class ContractError(ValueError):
    """A draft that an engine would load wrongly (or not at all); the message lists every bad key."""

    def __init__(self, where: str, errors: list[str]):
        self.errors = errors
        super().__init__(f"{where}: the draft's key contract is violated:\n  " + "\n  ".join(errors))


def read_export_config(path: Path) -> dict[str, Any]:
    """A draft/export dir's config.json as a mapping; a missing file, bad JSON or non-mapping is one line."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path}: no config.json (not a draft/export directory)")
    try:
        config = json.loads(cfg_file.read_text())
    except ValueError as e:
        raise ValueError(f"{cfg_file}: not JSON ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{cfg_file}: holds a JSON {type(config).__name__}, not a config mapping")
    return config


def read_export(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config dict, {key: tensor}) of a draft dir: model.safetensors, sharded safetensors (with or without
    an index), or pytorch_model.bin (loaded with weights_only=True: plain tensors, no pickled code)."""
    path = Path(path)
    config = read_export_config(path)
    shards = sorted(path.glob("*.safetensors"))
    bins = sorted(path.glob("pytorch_model*.bin"))
    tensors: dict[str, torch.Tensor] = {}
    if shards:
        for s in shards:
            part = load_file(str(s))
            dup = set(part) & set(tensors)
            if dup:
                raise ValueError(f"{s}: keys {sorted(dup)[:5]} also appear in another shard")
            tensors.update(part)
    elif bins:
        budget = weight_budget(config)
        for b in bins:
            check_bin(b, budget)
            part = torch.load(b, map_location="cpu", weights_only=True, mmap=True)
            if not isinstance(part, dict):
                raise ValueError(f"{b}: expected a state dict, found {type(part).__name__}")
            tensors.update(part)
    else:
        raise FileNotFoundError(f"{path}: no *.safetensors or pytorch_model*.bin weights")
    return config, tensors


# Sizes no draft has (a vocabulary past 4M tokens, a hidden size past 65536): a config claiming one is refused.
_MAX_DIM = {"hidden_size": 1 << 16, "vocab_size": 1 << 22, "intermediate_size": 1 << 18, "draft_vocab_size": 1 << 22,
            "target_hidden_size": 1 << 16}


def weight_budget(config: dict[str, Any]) -> int:
    """Bytes a draft with this config can hold at most (every tensor the contract names, 8 bytes an element,
    generous factors): a .bin whose records add up to more is refused before anything is allocated."""
    layer = config.get("transformer_layer_config") if isinstance(config.get("transformer_layer_config"), dict) \
        else config
    fallback = {"intermediate_size": "4h", "draft_vocab_size": "vocab_size", "target_hidden_size": "hidden_size"}
    dims: dict[str, int] = {}
    for k, cap in _MAX_DIM.items():
        v = config.get(k, layer.get(k))
        if v is None and k in fallback:
            v = 4 * dims["hidden_size"] if fallback[k] == "4h" else dims[fallback[k]]
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= cap:
            raise ValueError(f"config.json: {k} {v!r} is not a size a draft can have (1..{cap:,})")
        dims[k] = v
    H, I, V = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    Vd, Ht = dims["draft_vocab_size"], dims["target_hidden_size"]
    elements = V * H + Vd * H + 8 * Ht * H + 16 * H * H + 6 * H * I + 2 * (V + Vd) + 64 * H
    return 8 * elements + (1 << 20)


def check_bin(path: Path, budget: int) -> None:
    """A PyTorch zip checkpoint whose records are stored (torch.save never compresses) and add up to at most
    `budget` bytes: checked from the zip's directory alone, so a crafted file cannot inflate in memory."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            records = z.infolist()
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{path}: not a PyTorch zip checkpoint ({e}); re-save it with torch.save, or convert it to "
                         f"safetensors") from None
    packed = [r.filename for r in records if r.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise ValueError(f"{path}: records {packed[:3]} are compressed, which torch.save never writes; refused "
                         f"before inflating them (convert the checkpoint to safetensors)")
    big = max(records, key=lambda r: r.file_size, default=None)
    total = sum(r.file_size for r in records)
    if total > budget:
        raise ValueError(f"{path}: its records hold {total:,} bytes (largest {big.filename}: {big.file_size:,}), more "
                         f"than the {budget:,} a draft of this config.json can need; refused before loading")


@dataclass(frozen=True)
class TensorHeader:
    """A tensor as a safetensors header describes it: what the key contract checks, without the bytes."""
    shape: torch.Size
    dtype: torch.dtype

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_export_headers(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """read_export without the weights: (config dict, {key: TensorHeader}), the small vocabulary map (d2t/t2d)
    read for real, so check_contract runs in full. Safetensors only (what eyas writes and vLLM serves best)."""
    path = Path(path)
    config = read_export_config(path)
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{path}: no *.safetensors weights")
    tensors: dict[str, Any] = {}
    for s in shards:
        with safe_open(str(s), framework="pt") as f:
            for k in f.keys():
                if k in tensors:
                    raise ValueError(f"{s}: key {k} also appears in another shard")
                sl = f.get_slice(k)
                tensors[k] = (f.get_tensor(k) if k in ("d2t", "t2d") else
                              TensorHeader(torch.Size(sl.get_shape()), _DTYPES.get(sl.get_dtype(), torch.uint8)))
    return config, tensors


def detect_format(config: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None) -> str:
    if "speculators_config" in config or "speculators_model_type" in config:
        return SPECULATORS
    archs = config.get("architectures") or []
    if any("Eagle3" in a for a in archs) or any(k.startswith("midlayer.") for k in (tensors or {})):
        return MIDLAYER
    if config.get("format") == "eyas-draft":
        raise ValueError("this is an eyas draft dir already (format: eyas-draft); it needs no import")
    raise ValueError(f"unrecognised draft format: config.json has neither speculators_config nor an Eagle3 "
                     f"architecture (architectures={archs}); weight keys start with "
                     f"{sorted({k.split('.')[0] for k in (tensors or {})})}")


def parse_config(config: dict[str, Any], fmt: str, *, strict: bool,
                 default_aux: list[int] | None = None) -> tuple[DraftConfig | None, list[str]]:
    if fmt == SPECULATORS:
        kind = kind_for_speculators_type(config.get("speculators_model_type"))
        if kind is None:
            known = [get_kind(k).speculators_type for k in PACKAGES]
            return None, [f"speculators_model_type: {config.get('speculators_model_type')!r}; eyas reads {known}"]
        dc, errors = kind.from_speculators(config, strict=strict, default_aux=default_aux)
    else:
        dc, errors = from_midlayer(config, default_aux=default_aux)
    if dc is not None:
        errors = errors + get_kind(dc).check(dc)
    return (dc if not errors else None), errors


def check_contract(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> list[str]:
    """All contract violations of an export (config + tensors, in the format's own key names).
    Empty list = an engine loads exactly what eyas trained. Every message names the key."""
    try:
        fmt = detect_format(config, tensors)
    except ValueError as e:
        return [str(e)]
    dc, errors = parse_config(config, fmt, strict=(fmt == SPECULATORS))
    if dc is None:
        return errors or ["config: could not be read"]
    return errors + check_tensors(dc, tensors, fmt)
