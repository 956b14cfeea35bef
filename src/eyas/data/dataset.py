"""The PREPARED directory: packed rows in safetensors shards, a draft vocabulary, rejects, and a manifest.

Layout (CONTRIBUTING.md "On-disk formats"):
  manifest.json          format eyas-prepared, target identity, max_length, shards, summary (written last)
  rows-NNNNN.safetensors input_ids int32 [N], loss_mask bool [N], doc_lengths int32 [D],
                         row_offsets int64 [R+1] (token offsets), row_docs int64 [R+1] (offsets into doc_lengths)
  vocab.safetensors      d2t int64 [Vd], t2d bool [V], freq int64 [V]
  rejects.jsonl          {row, id, reason} per rejected source row
Position ids are not stored: they restart at 0 at every document boundary and are rebuilt from doc_lengths.
Shards are written to a temporary name and renamed, and the manifest comes last, so a crashed run leaves
no directory that reads as complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from bisect import bisect_right
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file

FORMAT = "eyas-prepared"
VERSION = 1
MANIFEST = "manifest.json"
VOCAB = "vocab.safetensors"
REJECTS = "rejects.jsonl"


class PreparedError(ValueError):
    """A PREPARED directory that is missing, incomplete or inconsistent; the message names the file/key."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def positions_from_lengths(doc_lengths) -> torch.Tensor:
    """Position ids restarting at 0 for each document: [3, 2] -> [0, 1, 2, 0, 1]."""
    lengths = torch.as_tensor(doc_lengths, dtype=torch.int64)
    total = int(lengths.sum())
    starts = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    return torch.arange(total, dtype=torch.int64) - starts


class PreparedWriter:
    """Accumulates packed rows and writes a shard every `shard_rows` rows."""

    def __init__(self, out: Path, shard_rows: int = 4096):
        self.out = Path(out)
        self.shard_rows = shard_rows
        self.shards: list[dict[str, Any]] = []
        self._reset()

    def _reset(self):
        self._ids: list[np.ndarray] = []
        self._mask: list[np.ndarray] = []
        self._docs: list[int] = []
        self._row_docs = [0]
        self._row_offsets = [0]

    def add(self, docs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """One packed row made of several (input_ids, loss_mask) documents."""
        for ids, mask in docs:
            self._ids.append(ids.astype(np.int32, copy=False))
            self._mask.append(mask.astype(bool, copy=False))
            self._docs.append(len(ids))
        self._row_docs.append(len(self._docs))
        self._row_offsets.append(self._row_offsets[-1] + sum(len(d[0]) for d in docs))
        if len(self._row_offsets) - 1 >= self.shard_rows:
            self.flush()

    def flush(self) -> None:
        rows = len(self._row_offsets) - 1
        if rows == 0:
            return
        name = f"rows-{len(self.shards):05d}.safetensors"
        tmp = self.out / (name + ".tmp")
        tensors = {
            "input_ids": np.concatenate(self._ids),
            "loss_mask": np.concatenate(self._mask),
            "doc_lengths": np.asarray(self._docs, dtype=np.int32),
            "row_offsets": np.asarray(self._row_offsets, dtype=np.int64),
            "row_docs": np.asarray(self._row_docs, dtype=np.int64),
        }
        # one metadata key only: safetensors writes metadata in hash-map order, so two keys make the bytes
        # (and the manifest's sha256) differ between identical runs
        save_file(tensors, str(tmp), metadata={"format": FORMAT + "-shard"})
        os.replace(tmp, self.out / name)
        self.shards.append({"file": name, "rows": rows, "tokens": int(self._row_offsets[-1]),
                            "masked_tokens": int(tensors["loss_mask"].sum()),
                            "sha256": sha256_file(self.out / name)})
        self._reset()


def write_vocab(out: Path, d2t: torch.Tensor, t2d: torch.Tensor, freq: torch.Tensor) -> None:
    from safetensors.torch import save_file as save_torch

    tmp = Path(out) / (VOCAB + ".tmp")
    save_torch({"d2t": d2t.to(torch.int64).contiguous(), "t2d": t2d.to(torch.bool).contiguous(),
                "freq": freq.to(torch.int64).contiguous()}, str(tmp), metadata={"format": FORMAT + "-vocab"})
    os.replace(tmp, Path(out) / VOCAB)


def write_manifest(out: Path, manifest: dict) -> None:
    tmp = Path(out) / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, Path(out) / MANIFEST)


def read_manifest(path: str | os.PathLike) -> dict:
    d = Path(path)
    mf = d / MANIFEST
    if not mf.is_file():
        raise PreparedError(f"{d}: no {MANIFEST} (not a prepared dataset, or `eyas prepare` did not finish)")
    try:
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError as e:
        raise PreparedError(f"{mf}: invalid JSON: {e}") from None
    if manifest.get("format") != FORMAT:
        raise PreparedError(f"{mf}: key 'format' is {manifest.get('format')!r}, expected {FORMAT!r}")
    # `format_version`, as in the store's manifest (PREPARED dirs written before the rename say `version`).
    version = manifest.get("format_version", manifest.get("version"))
    if version != VERSION:
        raise PreparedError(f"{mf}: key 'format_version' is {version!r}; this eyas reads {VERSION}")
    for key in ("target", "max_length", "shards", "summary"):
        if key not in manifest:
            raise PreparedError(f"{mf}: missing key {key!r}")
    return manifest


class PreparedDataset:
    """Random access to packed rows: `ds[i] -> {input_ids, loss_mask, position_ids}` (1-D tensors)."""

    def __init__(self, path: str | os.PathLike, verify: bool = False):
        self.dir = Path(path)
        self.manifest = read_manifest(self.dir)
        self._starts = [0]
        for k, sh in enumerate(self.manifest["shards"]):
            name = sh.get("file", "") if isinstance(sh, dict) else ""
            if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
                raise PreparedError(f"{self.dir / MANIFEST}: shards[{k}] file {name!r} is not a file name inside "
                                    f"the dataset (no paths); the manifest is damaged, re-run `eyas prepare`")
            f = self.dir / name
            if not f.is_file():
                raise PreparedError(f"{self.dir / MANIFEST}: shards[{k}] file {sh.get('file')!r} is missing")
            if verify and sha256_file(f) != sh.get("sha256"):
                raise PreparedError(f"{f}: sha256 differs from the manifest (file changed or corrupt)")
            self._starts.append(self._starts[-1] + int(sh["rows"]))
        self._cache: tuple[int, dict[str, torch.Tensor]] | None = None

    def __len__(self) -> int:
        return self._starts[-1]

    def _shard(self, k: int) -> dict[str, torch.Tensor]:
        if self._cache is None or self._cache[0] != k:
            f = self.dir / self.manifest["shards"][k]["file"]
            try:
                t = load_file(str(f))
            except Exception as e:  # noqa: BLE001 - safetensors raises its own types for a damaged file
                raise PreparedError(f"{f}: unreadable shard ({type(e).__name__}: {e}); the file is damaged, "
                                    f"re-run `eyas prepare --overwrite`") from None
            rows = int(self.manifest["shards"][k]["rows"])
            missing = {"input_ids", "loss_mask", "doc_lengths", "row_offsets", "row_docs"} - set(t)
            if missing:
                raise PreparedError(f"{f}: missing tensors {sorted(missing)}")
            if t["row_offsets"].numel() != rows + 1 or int(t["row_offsets"][-1]) != t["input_ids"].numel():
                raise PreparedError(f"{f}: row_offsets disagree with the manifest's {rows} rows / token count")
            self._cache = (k, t)
        return self._cache[1]

    def _locate(self, i: int) -> tuple[dict[str, torch.Tensor], int]:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} out of range for {len(self)} rows in {self.dir}")
        k = bisect_right(self._starts, i) - 1
        return self._shard(k), i - self._starts[k]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        t, j = self._locate(i)
        a, b = int(t["row_offsets"][j]), int(t["row_offsets"][j + 1])
        return {"input_ids": t["input_ids"][a:b].to(torch.int64),
                "loss_mask": t["loss_mask"][a:b].to(torch.bool),
                "position_ids": positions_from_lengths(self.doc_lengths(i))}

    def doc_lengths(self, i: int) -> list[int]:
        """Lengths of the documents packed into row i (they sum to the row's length)."""
        t, j = self._locate(i)
        return t["doc_lengths"][int(t["row_docs"][j]):int(t["row_docs"][j + 1])].tolist()

    def vocab(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(d2t int64 [Vd], t2d bool [V]) as vLLM consumes them."""
        t = self._vocab_file()
        return t["d2t"], t["t2d"]

    def freq(self) -> torch.Tensor:
        return self._vocab_file()["freq"]

    def _vocab_file(self) -> dict[str, torch.Tensor]:
        f = self.dir / VOCAB
        if not f.is_file():
            raise PreparedError(f"{self.dir}: {VOCAB} is missing")
        t = load_file(str(f))
        for key in ("d2t", "t2d", "freq"):
            if key not in t:
                raise PreparedError(f"{f}: missing tensor {key!r}")
        return t

    def rejects(self) -> list[dict]:
        f = self.dir / REJECTS
        return [json.loads(line) for line in f.read_text(encoding="utf-8").split("\n") if line.strip()] if f.is_file() else []
