"""Open what a run reads: the target (head only offline, whole model online), the rows, the draft vocab.

Every mismatch between the pieces (store vs target hidden size, aux ids, vocab sizes, row counts)
fails here, before the first step, with the file and key named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from eyas.aux_layers import KEY as AUX_KEY, check_aux_layer_ids, resolve_aux_layer_ids
from eyas.data import PreparedDataset
from eyas.data.dataset import VOCAB
from eyas.devices import resolve_dtype
from eyas.outputs import input_id, recorded_input, same_input
from eyas.store import HiddenStateStore, StoreError, config_hash
from eyas.store.format import MANIFEST
from eyas.target import load_config, load_target, text_config
from eyas.train.data import OfflineSource, OnlineSource
from eyas.vocab import build_draft_vocab, require_draft_vocab


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


def load_vocab_file(path: Path, size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    v = load_file(str(path))
    for k in ("d2t", "t2d"):
        if k not in v:
            raise KeyError(f"{path}: no tensor {k!r}")
    if size is None or size == v["d2t"].numel():
        return v["d2t"].long(), v["t2d"].bool()
    if "freq" not in v:
        raise KeyError(f"{path}: --draft-vocab-size {size} needs token counts ('freq'), which this file lacks")
    return build_draft_vocab(v["freq"], size)[:2]


def _vocab(cfg, dataset, store_dir: Path | None):
    """d2t/t2d: from the PREPARED dataset (--data), else a vocab file next to the store.
    --draft-vocab-size rebuilds it from that file's token counts."""
    size = cfg.draft_vocab_size
    if dataset is not None:
        d2t, t2d = dataset.vocab()
        if size is None or size == d2t.numel():
            return d2t.long(), t2d.bool(), "prepared"
    candidates = []
    if cfg.data:
        candidates.append(Path(cfg.data) / VOCAB)
    if store_dir is not None:
        candidates.append(store_dir / VOCAB)
    for c in candidates:
        if c.is_file():
            d2t, t2d = load_vocab_file(c, size)
            return d2t, t2d, str(c)
    raise FileNotFoundError("no draft vocabulary: pass --data PREPARED (its vocab.safetensors holds d2t/t2d"
                            f"{' and the token counts --draft-vocab-size needs' if size else ''}); "
                            f"looked at {[str(c) for c in candidates] or 'nothing'}")


def token_counts(cfg) -> torch.Tensor | None:
    """The PREPARED token counts (vocab.safetensors 'freq'), from --data or next to the store; None without one."""
    for d in (cfg.data, cfg.store):
        f = Path(d) / VOCAB if d else None
        if f is not None and f.is_file():
            v = load_file(str(f))
            if "freq" in v:
                return v["freq"]
    return None


def check_same_data(store, dataset, cfg) -> None:
    """Store row i must be prepared row i: the store records which prepared data it was extracted
    from (rows + manifest hash); --data must be that very dataset, not one that merely has as many rows."""
    if len(store) != len(dataset):
        raise ValueError(f"store {cfg.store} has {len(store)} rows but the prepared data {cfg.data} has "
                         f"{len(dataset)}; store row i must be prepared row i")
    recorded = (getattr(store, "manifest", None) or {}).get("data")
    if isinstance(recorded, dict) and getattr(dataset, "manifest", None):
        from eyas.store.extract import data_fingerprint
        now = data_fingerprint(dataset)
        if recorded.get("manifest_sha256") != now["manifest_sha256"]:
            raise ValueError(f"store {cfg.store} was extracted from other prepared data than --data {cfg.data} "
                             f"(manifest.json data.manifest_sha256 {str(recorded.get('manifest_sha256'))[:12]}..., "
                             f"--data has {now['manifest_sha256'][:12]}...); pass the --data the store was made "
                             f"from, or re-run `eyas extract` on this data")


def check_store_target(store: Path, target: str) -> None:
    """The store's record names the target it was extracted from by content: another target's weights (even of
    the same config) give hidden states this target never makes."""
    have = recorded_input(store, "target")
    now = input_id(target)
    if have is not None and not same_input(have, now):
        raise ValueError(f"store {store} was extracted from target {have.get('spec')} (content "
                         f"{str(have.get('sha256'))[:12]}), not from --target {target} (content "
                         f"{str(now.get('sha256'))[:12]}); pass the store's target, or extract a store for this one")


def open_inputs(cfg, device: torch.device, *, target=None, store=None, dataset=None) -> Inputs:
    if cfg.online and cfg.data is None and dataset is None:
        raise ValueError("--online needs --data PREPARED (the rows the target runs over)")
    if not cfg.online and cfg.store is None and store is None:
        raise ValueError("pass --store STORE (offline) or --data PREPARED --online")
    if dataset is None and cfg.data is not None:
        # online every row is read from it: a shard that changed since `prepare` must fail here, as in extract
        dataset = PreparedDataset(cfg.data, verify=cfg.online)
    # The flags and the draft vocab are checked against the target's config before any weight loads.
    loaded = target is None
    tcfg = text_config(load_config(cfg.target)) if loaded else None
    if cfg.aux_layer_ids:
        check_aux_layer_ids(cfg.aux_layer_ids, int(tcfg.num_hidden_layers) if loaded else target.layout.num_layers,
                            key="--aux-layer-ids")
    d2t, t2d, vocab_from = _vocab(cfg, dataset, Path(cfg.store) if cfg.store else None)
    require_draft_vocab(d2t, t2d, vocab_size=int(tcfg.vocab_size) if loaded else target.layout.vocab_size,
                        where=f"draft vocab ({vocab_from})")
    if loaded:
        # Online the target runs every step (auto: bf16 on GPU); offline only its head is used.
        target = load_target(cfg.target, dtype=resolve_dtype(cfg.target_dtype, device),
                             device=device if cfg.online else "cpu")
    layout = target.layout
    if not cfg.online and store is None:
        # The store must come from this very network (config hash) and these weights (its record), not just the
        # same shapes.
        try:
            store = HiddenStateStore(cfg.store, expect={"config_hash": config_hash(target.config)})
        except StoreError as e:  # one clear CLI line, like every other input error
            raise ValueError(str(e)) from None
        check_store_target(cfg.store, cfg.target)
    if store is not None and dataset is not None and not cfg.online:
        check_same_data(store, dataset, cfg)
    manifest = dict(getattr(store, "manifest", None) or {}) if store is not None else {}
    offline = store is not None and not cfg.online
    aux = resolve_aux_layer_ids(cfg.aux_layer_ids, layout.num_layers,
                                recorded=manifest.get("target", {}).get(AUX_KEY) if offline else None,
                                recorded_where=f"the store's {cfg.store}/{MANIFEST}")

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
