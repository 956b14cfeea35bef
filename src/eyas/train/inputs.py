"""Open what a run reads: the target (head only offline, whole model online), the rows, the draft vocab.

Every mismatch between the pieces (store vs target hidden size, aux ids, vocab sizes, row counts)
fails here, before the first step, with the file and key named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eyas.train.data import OfflineSource, OnlineSource


@dataclass
class Inputs:
    target: Any                      # eyas.target.Target
    target_name: str
    source: Any                      # OfflineSource | OnlineSource
    d2t: torch.Tensor
    t2d: torch.Tensor
    aux_ids: list[int]
    vocab_from: str

    @property
    def target_meta(self) -> dict:
        c = self.target.config
        return {"name": self.target_name, "model_type": getattr(c, "model_type", None),
                "architectures": list(getattr(c, "architectures", None) or []),
                "hidden_size": self.target.layout.hidden_size, "vocab_size": self.target.layout.vocab_size,
                "num_layers": self.target.layout.num_layers}

    def describe(self) -> dict:
        return {"mode": "online" if self.source.online else "offline", "rows": len(self.source),
                "vocab_from": self.vocab_from, "draft_vocab_size": int(self.d2t.numel())}


def _find(manifest: dict, *keys):
    """First value of any key, at the top level or under 'target' (the store's target identity)."""
    for where in (manifest, manifest.get("target") if isinstance(manifest.get("target"), dict) else {}):
        for k in keys:
            if where.get(k) is not None:
                return where[k]
    return None


def vocab_from_counts(freq: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `size` most frequent target ids as a draft vocab (ids ascending, as d2t offsets require)."""
    if size > freq.numel():
        raise ValueError(f"draft vocab size {size} exceeds the target vocab ({freq.numel()})")
    ids = torch.sort(torch.topk(freq.double(), size).indices).values
    t2d = torch.zeros(freq.numel(), dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(size), t2d


def load_vocab_file(path: Path, size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    from safetensors.torch import load_file
    v = load_file(str(path))
    for k in ("d2t", "t2d"):
        if k not in v:
            raise KeyError(f"{path}: no tensor {k!r}")
    if size is None or size == v["d2t"].numel():
        return v["d2t"].long(), v["t2d"].bool()
    if "freq" not in v:
        raise KeyError(f"{path}: --draft-vocab-size {size} needs token counts ('freq'), which this file lacks")
    return vocab_from_counts(v["freq"], size)


def _vocab(cfg, dataset, store_manifest: dict, store_dir: Path | None):
    """d2t/t2d: from the PREPARED dataset (--data), else a vocab file next to the store or named in its
    manifest. --draft-vocab-size rebuilds it from that file's token counts."""
    size = cfg.draft_vocab_size
    if dataset is not None:
        d2t, t2d = dataset.vocab()
        if size is None or size == d2t.numel():
            return d2t.long(), t2d.bool(), "prepared"
    candidates = []
    if cfg.data:
        candidates.append(Path(cfg.data) / "vocab.safetensors")
    if store_dir is not None:
        candidates.append(store_dir / "vocab.safetensors")
        named = _find(store_manifest, "prepared", "prepared_dir", "data")
        if isinstance(named, str):
            candidates.append(Path(named) / "vocab.safetensors")
    for c in candidates:
        if c.is_file():
            d2t, t2d = load_vocab_file(c, size)
            return d2t, t2d, str(c)
    raise FileNotFoundError("no draft vocabulary: pass --data PREPARED (its vocab.safetensors holds d2t/t2d"
                            f"{' and the token counts --draft-vocab-size needs' if size else ''}); "
                            f"looked at {[str(c) for c in candidates] or 'nothing'}")


def open_inputs(cfg, device: torch.device, *, target=None, store=None, dataset=None) -> Inputs:
    from eyas.target import default_aux_layer_ids, load_target, validate_aux_layer_ids

    if cfg.online and cfg.data is None and dataset is None:
        raise ValueError("--online needs --data PREPARED (the rows the target runs over)")
    if not cfg.online and cfg.store is None and store is None:
        raise ValueError("pass --store STORE (offline) or --data PREPARED --online")
    if dataset is None and cfg.data is not None:
        from eyas.data import PreparedDataset
        dataset = PreparedDataset(cfg.data)
    loaded = target is None
    if loaded:
        gpu = device.type == "cuda"
        # Online the target runs every step (bf16 on GPU); offline only its head is used.
        bf16 = cfg.target_dtype == "bf16" or (cfg.target_dtype == "auto" and gpu)
        target = load_target(cfg.target, dtype=torch.bfloat16 if bf16 else torch.float32,
                             device=device if cfg.online else "cpu")
    layout = target.layout
    if not cfg.online and store is None:
        from eyas.store import HiddenStateStore
        from eyas.store.format import config_hash
        # The store must come from this very network (config hash), not just the same shapes.
        from eyas.store.format import StoreError
        try:
            store = HiddenStateStore(cfg.store, expect={"config_hash": config_hash(target.config)})
        except StoreError as e:  # one clear CLI line, like every other input error
            raise ValueError(str(e)) from None
    if store is not None and dataset is not None and not cfg.online and len(store) != len(dataset):
        raise ValueError(f"store {cfg.store} has {len(store)} rows but the prepared data {cfg.data} has "
                         f"{len(dataset)}; store row i must be prepared row i")
    manifest = dict(getattr(store, "manifest", None) or {}) if store is not None else {}
    store_aux = _find(manifest, "aux_layer_ids", "aux_ids")
    aux = cfg.aux_layer_ids or store_aux or default_aux_layer_ids(layout.num_layers)
    aux = validate_aux_layer_ids(list(aux), layout.num_layers)
    if store is not None and not cfg.online and store_aux is not None and list(store_aux) != aux:
        raise ValueError(f"--aux-layer-ids {aux} differ from the store's aux ids {list(store_aux)} "
                         f"({cfg.store}/manifest.json)")
    d2t, t2d, vocab_from = _vocab(cfg, dataset, manifest, Path(cfg.store) if cfg.store else None)
    if t2d.numel() != layout.vocab_size:
        raise ValueError(f"draft vocab ({vocab_from}) covers {t2d.numel()} target ids; the target has {layout.vocab_size}")
    if int(t2d.sum()) != d2t.numel():
        raise ValueError(f"draft vocab ({vocab_from}): t2d marks {int(t2d.sum())} ids but d2t has {d2t.numel()}")

    pad_to = None
    if cfg.pad_to is not None:
        pad_to = cfg.pad_to or None
    elif device.type == "cuda":  # compiled flex attention: one static T (the data's row length)
        src_manifest = getattr(dataset, "manifest", None) or {}
        pad_to = cfg.max_length or src_manifest.get("max_length") or manifest.get("max_length")
    if cfg.online:
        target.model.to(device)
        source = OnlineSource(dataset, target.model, layout, aux, cfg.max_length, pad_to)
    else:
        source = OfflineSource(store, cfg.max_length, pad_to)
        if len(store) == 0:
            raise ValueError(f"store {cfg.store} has no rows")
        row = store[0]
        if tuple(row["aux"].shape[1:]) != (len(aux), layout.hidden_size):
            raise ValueError(f"store {cfg.store} row 0: aux has shape {tuple(row['aux'].shape)}, expected "
                             f"[T, {len(aux)}, {layout.hidden_size}] for target {cfg.target} with aux ids {aux}")
        # The decoder layers are not needed offline: free them (the head and embedding stay).
        for i in range(len(layout.layers) if loaded else 0):
            layout.layers[i] = torch.nn.Identity()
    return Inputs(target=target, target_name=str(getattr(target.source, "name", cfg.target)), source=source,
                  d2t=d2t, t2d=t2d, aux_ids=aux, vocab_from=vocab_from)
