"""Reading a store: `HiddenStateStore` (validated random access) and `verify_store` (full check).

Every read checks what a silent mistake would otherwise turn into a bad draft: the manifest against
the target in use, the shard's sample ids against the manifest's index, shapes and dtypes against
the manifest, NaN/Inf, and (given the prepared dataset) the token ids against the data. Errors name
the shard file and the sample.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from eyas.data import PreparedDataset
from eyas.store.format import (FORMAT, FORMAT_VERSION, ID_DTYPE, MANIFEST, StoreError, decode_states,
                               expected_dtypes, identity_mismatches, read_json, sha256_file)


def load_manifest(root: Path) -> dict[str, Any]:
    m = read_json(root / MANIFEST, "store manifest")
    if m.get("format") != FORMAT:
        raise StoreError(f"{root / MANIFEST}: format is {m.get('format')!r}, expected {FORMAT!r}")
    if m.get("format_version") != FORMAT_VERSION:
        raise StoreError(f"{root / MANIFEST}: format_version {m.get('format_version')!r}; this eyas reads "
                         f"{FORMAT_VERSION}")
    for key in ("target", "shards", "num_samples"):
        if key not in m:
            raise StoreError(f"{root / MANIFEST}: missing key {key!r}")
    if not isinstance(m["shards"], list):
        raise StoreError(f"{root / MANIFEST}: 'shards' is not a list")
    from eyas.store.writer import check_entry
    for entry in m["shards"]:
        check_entry(root, entry, MANIFEST)  # no '../' or absolute paths: a store reads only itself
    return m


class HiddenStateStore:
    """`store[i] -> {input_ids, loss_mask, position_ids, aux [T,k,H], last [T,H]}` (bf16, dequantized).

    expect: target identity keys to check (e.g. `target_identity(...)` of the target in use, or a
    subset like {"config_hash": ..., "aux_layer_ids": [...]}); a mismatch raises at construction.
    prepared: a PREPARED dir or `PreparedDataset`; every read then compares token ids with the data.
    """

    def __init__(self, root: str | os.PathLike, expect: dict[str, Any] | None = None, *, prepared=None,
                 check_finite: bool = True, check_sha: bool = True):
        self.root = Path(root)
        self.manifest = load_manifest(self.root)
        self.target = self.manifest["target"]
        if expect:
            bad = identity_mismatches(self.target, expect)
            if bad:
                raise StoreError(f"{self.root / MANIFEST}: store was made for a different target:\n  " +
                                 "\n  ".join(bad))
        self.dtype = self.target["dtype"]
        self.check_finite, self.check_sha = check_finite, check_sha
        shards = sorted(self.manifest["shards"], key=lambda s: s["first"])
        self._firsts = [s["first"] for s in shards]
        self._shards = shards
        covered = sum(s["count"] for s in shards)
        if covered != self.manifest["num_samples"] or any(
                a["first"] + a["count"] != b["first"] for a, b in zip(shards, shards[1:])):
            raise StoreError(f"{self.root / MANIFEST}: shard index does not cover samples "
                             f"0..{self.manifest['num_samples'] - 1} exactly once")
        self._open: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}
        if isinstance(prepared, (str, os.PathLike)):
            prepared = PreparedDataset(prepared)
        self.prepared = prepared

    def __len__(self) -> int:
        return int(self.manifest["num_samples"])

    @property
    def aux_layer_ids(self) -> list[int]:
        return list(self.target["aux_layer_ids"])

    def _locate(self, i: int) -> tuple[dict[str, Any], int]:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range: the store at {self.root} has {len(self)} samples")
        s = self._shards[bisect.bisect_right(self._firsts, i) - 1]
        return s, i - s["first"]

    def _handle(self, s: dict[str, Any]):
        j = int(s["shard"])
        if j not in self._open:
            path = self.root / s["file"]
            # Each shard is hashed once, when first opened: a same-size bit flip would otherwise train.
            if self.check_sha and path.is_file():
                if path.is_symlink():
                    raise StoreError(f"{path}: is a symbolic link (to {os.readlink(path)}), not the shard extract "
                                     f"wrote; re-run `eyas extract` on this store to redo it")
                if path.stat().st_size != s["bytes"]:
                    raise StoreError(f"{path}: {path.stat().st_size} bytes on disk, the manifest says {s['bytes']} "
                                     f"(truncated or replaced); re-run `eyas extract` on this store to redo it")
                if sha256_file(path) != s["sha256"]:
                    raise StoreError(f"{path}: sha256 differs from the manifest (the file was altered); re-run "
                                     f"`eyas extract` on this store to redo the shard")
            try:
                h = safe_open(str(path), framework="pt")
                offsets, ids = h.get_tensor("offsets"), h.get_tensor("sample_ids")
            except FileNotFoundError:
                raise StoreError(f"{path}: shard file missing") from None
            except Exception as e:     # safetensors raises its own error types for a damaged header
                raise StoreError(f"{path}: unreadable shard ({e}); run verify_store") from None
            self._open[j] = (h, offsets, ids)
        return self._open[j]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = int(i)
        s, pos = self._locate(i)
        h, offsets, ids = self._handle(s)
        where = f"{s['file']} sample {i}"
        if pos >= len(ids) or int(ids[pos]) != i:
            raise StoreError(f"{where}: shard holds sample id {int(ids[pos]) if pos < len(ids) else None} "
                             f"at this position; the manifest index is inconsistent")
        a, b = int(offsets[pos]), int(offsets[pos + 1])
        try:
            t = {k: h.get_slice(k)[a:b] for k in h.keys() if k not in ("offsets", "sample_ids")}
        except Exception as e:
            raise StoreError(f"{where}: cannot read tensors ({e}); run verify_store") from None
        check_tensors(t, self.target, where, b - a)
        aux, last = decode_states(t)
        if self.check_finite and not (torch.isfinite(aux).all() and torch.isfinite(last).all()):
            raise StoreError(f"{where}: NaN or Inf in the stored hidden states")
        sample = {"input_ids": t["input_ids"].long(), "loss_mask": t["loss_mask"].bool(),
                  "position_ids": t["position_ids"].long(), "aux": aux, "last": last}
        if self.prepared is not None:
            ref = self.prepared[i]["input_ids"]
            if ref.shape != sample["input_ids"].shape or not torch.equal(ref.long(), sample["input_ids"]):
                raise StoreError(f"{where}: token ids differ from the prepared dataset's row {i} "
                                 f"(store has {b - a} tokens, data {ref.numel()}); was the data re-prepared "
                                 f"after extraction?")
        return sample


def check_tensors(t: dict[str, torch.Tensor], target: dict[str, Any], where: str, n: int) -> None:
    """Shapes and dtypes of one sample's (or one shard's) tensors against the manifest."""
    k, H = len(target["aux_layer_ids"]), int(target["hidden_size"])
    want_dtype = expected_dtypes(target["dtype"])
    shapes = {"input_ids": (n,), "position_ids": (n,), "loss_mask": (n,), "aux": (n, k, H), "last": (n, H),
              "aux_scale": (n, k), "last_scale": (n,)}
    missing = [name for name in want_dtype if name not in ("offsets", "sample_ids") and name not in t]
    if missing:
        raise StoreError(f"{where}: missing tensors {missing}")
    for name, x in t.items():
        if name not in want_dtype:
            raise StoreError(f"{where}: unexpected tensor {name!r}")
        if x.dtype != want_dtype[name]:
            raise StoreError(f"{where}: {name} has dtype {x.dtype}, expected {want_dtype[name]}")
        if name in shapes and tuple(x.shape) != shapes[name]:
            raise StoreError(f"{where}: {name} has shape {tuple(x.shape)}, expected {shapes[name]}")


def verify_store(root: str | os.PathLike, *, check_values: bool = True) -> list[str]:
    """Every problem found in the store (empty list = healthy): manifest, each shard's size and sha256,
    tensor shapes/dtypes, sample index, NaN/Inf. Reads every byte once."""
    root = Path(root)
    try:
        m = load_manifest(root)
    except StoreError as e:
        return [str(e)]
    problems: list[str] = []
    expected_first = 0
    for s in sorted(m["shards"], key=lambda s: s["first"]):
        path = root / s["file"]
        if s["first"] != expected_first:
            problems.append(f"{s['file']}: starts at sample {s['first']}, expected {expected_first}")
        expected_first = s["first"] + s["count"]
        if path.is_symlink() or not path.is_file():
            problems.append(f"{s['file']}: shard file missing (or a link)")
            continue
        size = path.stat().st_size
        if size != s["bytes"]:
            problems.append(f"{s['file']}: {size} bytes on disk, manifest says {s['bytes']} (truncated or replaced)")
            continue
        if sha256_file(path) != s["sha256"]:
            problems.append(f"{s['file']}: sha256 differs from the manifest (corrupted)")
            continue
        problems += _verify_shard(path, s, m["target"], check_values)
    if expected_first != m["num_samples"]:
        problems.append(f"{MANIFEST}: shards cover {expected_first} samples, manifest says {m['num_samples']}")
    return problems


def _verify_shard(path: Path, s: dict[str, Any], target: dict[str, Any], check_values: bool) -> list[str]:
    try:
        with safe_open(str(path), framework="pt") as h:
            t = {k: h.get_tensor(k) for k in h.keys()}
    except Exception as e:
        return [f"{s['file']}: unreadable safetensors ({e})"]
    offsets, ids = t.pop("offsets", None), t.pop("sample_ids", None)
    if offsets is None or ids is None:
        return [f"{s['file']}: missing offsets/sample_ids"]
    want = torch.arange(s["first"], s["first"] + s["count"], dtype=torch.int64)
    if not torch.equal(ids, want):
        return [f"{s['file']}: sample ids {ids[:3].tolist()}... differ from the manifest's "
                f"{s['first']}..{s['first'] + s['count'] - 1}"]
    n = int(offsets[-1]) if len(offsets) else -1
    if len(offsets) != s["count"] + 1 or int(offsets[0]) != 0 or (offsets.diff() <= 0).any() or n != s["tokens"]:
        return [f"{s['file']}: offsets inconsistent with {s['count']} samples / {s['tokens']} tokens"]
    try:
        check_tensors(t, target, s["file"], n)
    except StoreError as e:
        return [str(e)]
    if not check_values:
        return []
    aux, last = decode_states(t)
    bad = ~(torch.isfinite(aux).flatten(1).all(1) & torch.isfinite(last).all(1))
    if bad.any():
        tok = int(bad.nonzero()[0])
        sample = s["first"] + int(torch.searchsorted(offsets, tok, right=True)) - 1
        return [f"{s['file']} sample {sample}: NaN or Inf in the stored hidden states"]
    if t["input_ids"].dtype == ID_DTYPE and (t["input_ids"] < 0).any():
        return [f"{s['file']}: negative token ids"]
    return []
