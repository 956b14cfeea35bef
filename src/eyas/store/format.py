"""STORE on-disk format: shard layout, bf16/fp8 codecs, target identity, atomic writes.

A store directory holds `shard-NNNNN.safetensors` files and `manifest.json`. One store sample is
one PREPARED row, and sample i is prepared row i, so token ids can be checked against the data.
Samples of a shard are concatenated along the token axis (no per-sample keys, no padding):

    input_ids     int32 [N]          position_ids int32 [N]        loss_mask bool [N]
    offsets       int64 [n+1]        sample_ids   int64 [n]        (sample s = tokens offsets[s]:offsets[s+1])
    aux           bf16 [N,k,H]  | float8_e4m3fn [N,k,H] + aux_scale  float32 [N,k]
    last          bf16 [N,H]    | float8_e4m3fn [N,H]   + last_scale float32 [N]

fp8 keeps one scale per token and per aux layer (absmax / 448), which holds the relative error of
every vector near e4m3's 2^-4 step no matter how large the residual stream grows in deep layers.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, get_args

import torch

from eyas.devices import StoreDtype, dtype_bytes

FORMAT = "eyas-store"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DTYPES = get_args(StoreDtype)   # ("bf16", "fp8"): the --store-dtype values of eyas.devices
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0                      # largest finite e4m3fn value
ID_DTYPE = torch.int32               # token/position ids; vocabularies fit easily
STATE_DTYPE = torch.bfloat16         # what the reader hands out, whatever the storage dtype


class StoreError(ValueError):
    """A store that cannot be used as asked; the message names the file, shard, sample or key.
    A ValueError so the CLI reports it as one line, like the other bad-input errors."""


def shard_name(j: int) -> str:
    return f"shard-{j:05d}.safetensors"


def bytes_per_token(hidden: int, num_aux: int, dtype: str) -> int:
    """Disk bytes one token costs: states (+ fp8 scales) + input id + position id + loss-mask byte."""
    if dtype not in DTYPES:
        raise ValueError(f"store dtype {dtype!r}: choose one of {DTYPES}")
    vectors = num_aux + 1                      # k aux layers + the last hidden state
    states = vectors * hidden * dtype_bytes(dtype)
    scales = vectors * 4 if dtype == "fp8" else 0
    return states + scales + 4 + 4 + 1


# ---------------------------------------------------------------- codecs
def fp8_encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., H] -> (q float8_e4m3fn [..., H], scale float32 [...]); x ≈ q * scale per vector."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp_min(1e-12) / FP8_MAX
    q = (xf / scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def fp8_decode(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = STATE_DTYPE) -> torch.Tensor:
    return (q.float() * scale.float().unsqueeze(-1)).to(dtype)


def encode_states(aux: torch.Tensor, last: torch.Tensor, dtype: str) -> dict[str, torch.Tensor]:
    """Tensors to store for aux [..., k, H] and last [..., H] in the store dtype (runs on any device)."""
    if dtype == "bf16":
        return {"aux": aux.to(torch.bfloat16), "last": last.to(torch.bfloat16)}
    qa, sa = fp8_encode(aux)
    ql, sl = fp8_encode(last)
    return {"aux": qa, "aux_scale": sa, "last": ql, "last_scale": sl}


def decode_states(t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    if "aux_scale" in t:
        return fp8_decode(t["aux"], t["aux_scale"]), fp8_decode(t["last"], t["last_scale"])
    return t["aux"].to(STATE_DTYPE), t["last"].to(STATE_DTYPE)


def expected_dtypes(dtype: str) -> dict[str, torch.dtype]:
    states = torch.bfloat16 if dtype == "bf16" else FP8
    out = {"input_ids": ID_DTYPE, "position_ids": ID_DTYPE, "loss_mask": torch.bool, "offsets": torch.int64,
           "sample_ids": torch.int64, "aux": states, "last": states}
    if dtype == "fp8":
        out.update(aux_scale=torch.float32, last_scale=torch.float32)
    return out


# ---------------------------------------------------------------- identity
_VOLATILE_CONFIG_KEYS = {"transformers_version", "dtype", "torch_dtype", "use_cache", "architectures"}


def config_hash(config: Any) -> str:
    """sha256 of the model config minus keys that do not change the network (paths, versions, dtype), at every
    level: a wrapper's text_config carries its own dtype and attention implementation, set by whoever loaded it."""
    def stable(d):
        if not isinstance(d, dict):
            return d
        return {k: stable(v) for k, v in d.items() if not str(k).startswith("_") and k not in _VOLATILE_CONFIG_KEYS}

    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return hashlib.sha256(json.dumps(stable(d), sort_keys=True, default=str).encode()).hexdigest()


def target_identity(name: str, config: Any, aux_layer_ids: list[int], dtype: str, *,
                    hidden_size: int, num_layers: int, vocab_size: int) -> dict[str, Any]:
    """What a store was made from; `HiddenStateStore(dir, expect=...)` compares the keys it is given."""
    return {"name": str(name), "config_hash": config_hash(config), "aux_layer_ids": [int(i) for i in aux_layer_ids],
            "dtype": dtype, "hidden_size": int(hidden_size), "num_layers": int(num_layers),
            "vocab_size": int(vocab_size)}


def identity_mismatches(have: dict[str, Any], expect: dict[str, Any]) -> list[str]:
    return [f"target.{k}: store has {have.get(k)!r}, expected {v!r}" for k, v in expect.items() if have.get(k) != v]


# ---------------------------------------------------------------- atomic files
def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_new(path: Path) -> int:
    """A fresh file at `path` for writing: whatever is there (a stale temp file, a planted symlink) is
    removed first, and O_EXCL|O_NOFOLLOW make sure the bytes land in a new regular file, never through a link."""
    if os.path.lexists(path):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temp name, fsync, rename, fsync the directory: the file is whole or absent.
    The temp name is per process and thread, so two writers (ranks merging at once) never share one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    with os.fdopen(open_new(tmp), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise StoreError(f"{path}: no {what} (is this an eyas store directory?)") from None
    except (OSError, ValueError) as e:
        raise StoreError(f"{path}: unreadable {what}: {e}") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path}: {what} is not a JSON object")
    return data


def sha256_file(path: Path, chunk: int = 16 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- streaming safetensors writer
_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64",
              torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL", FP8: "F8_E4M3"}


def _raw(t: torch.Tensor) -> memoryview:
    """The bytes of a CPU tensor without copying (bf16/fp8 have no numpy dtype, so view them as bytes)."""
    t = t.contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def write_safetensors(f, parts: dict[str, list[torch.Tensor]], metadata: dict[str, str]) -> tuple[int, str]:
    """Write a safetensors file whose tensor `name` is the concatenation of `parts[name]` along dim 0,
    straight from the parts (no concatenated copy, no in-memory file); return (bytes, sha256).

    Layout (the safetensors spec): u64 little-endian header size, JSON header (dtype, shape,
    data_offsets per tensor, __metadata__) padded with spaces to 8 bytes, then the raw data."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, ps in parts.items():
        shape = [sum(int(p.shape[0]) for p in ps), *ps[0].shape[1:]]
        nbytes = sum(p.numel() * p.element_size() for p in ps)
        header[name] = {"dtype": _ST_DTYPES[ps[0].dtype], "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    h = hashlib.sha256()
    for block in (len(head).to_bytes(8, "little"), head):
        f.write(block)
        h.update(block)
    for ps in parts.values():
        for p in ps:
            mv = _raw(p)
            f.write(mv)
            h.update(mv)
    return 8 + len(head) + offset, h.hexdigest()
