"""What the run needs against what is there: an existing store verified against the target and data, else the
planned store's disk; the GPU memory of extraction and training, estimated from the meta-device target and draft."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from eyas.doctor.config import Check, DoctorConfig
from eyas.doctor.target import TargetFacts
from eyas.draft.kinds import build_draft, draft_config
from eyas.outputs import input_id, recorded_input, same_input
from eyas.store import HiddenStateStore, bytes_per_token, config_hash, verify_store
from eyas.store.format import MANIFEST as STORE_MANIFEST, identity_mismatches


def planned_tokens(cfg: DoctorConfig, prepared: dict | None) -> int | None:
    if cfg.tokens:
        return cfg.tokens
    if cfg.max_samples:
        return cfg.max_samples * cfg.max_length
    return (prepared or {}).get("tokens")


def check_store(cfg: DoctorConfig, facts: TargetFacts, ids: list[int], prepared: dict | None,
                out: list[Check]) -> None:
    if cfg.store is not None and (Path(cfg.store) / STORE_MANIFEST).is_file():
        problems = verify_store(cfg.store)
        if not problems:
            m = HiddenStateStore(cfg.store).manifest
            tgt = m.get("target", {})
            have, want_data = m.get("data", {}).get("manifest_sha256"), (prepared or {}).get("fingerprint", {})
            if have and want_data and have != want_data.get("manifest_sha256"):
                out.append(Check("store vs data", "warn", f"{cfg.store} was extracted from other PREPARED data "
                                 f"than {cfg.data}", "re-run `eyas extract` if the data changed"))
            want = {"hidden_size": facts.hidden_size, "num_layers": facts.num_layers,
                    "vocab_size": facts.vocab_size, "aux_layer_ids": list(ids),
                    "config_hash": config_hash(facts.config)}
            problems = identity_mismatches(tgt, {k: v for k, v in want.items() if k in tgt})
            have, now = recorded_input(cfg.store, "target"), input_id(cfg.target, cache=cfg.cache_dir)
            if have is not None and not same_input(have, now):
                problems.append(f"the store was extracted from target {have.get('spec')} (content "
                                f"{str(have.get('sha256'))[:12]}), --target {cfg.target} has content "
                                f"{str(now.get('sha256'))[:12]}: other weights give other hidden states")
        out.append(Check("store", "fail" if problems else "pass", "; ".join(problems[:5]) +
                         (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "") or
                         f"{cfg.store}: every shard verified (sha256, shapes, finite values)",
                         "re-run `eyas extract` into this dir (it redoes only the bad shards)" if problems else ""))
        return
    tokens = planned_tokens(cfg, prepared)
    if not tokens:
        out.append(Check("disk for store", "skip", "no --tokens / --max-samples / PREPARED dir to size the store"))
        return
    bpt = bytes_per_token(facts.hidden_size, len(ids), cfg.store_dtype)
    need = bpt * tokens
    where = Path(cfg.store or ".").expanduser().resolve()
    while not where.exists():
        where = where.parent
    if cfg.store is not None and not os.access(where, os.W_OK | os.X_OK):
        out.append(Check("store location", "fail", f"--store {cfg.store}: {where} is not writable by this user",
                         "choose a --store under a directory you can write"))
    free = shutil.disk_usage(where).free
    gib = 1 << 30
    status = "fail" if need > free else "warn" if need > 0.8 * free else "pass"
    out.append(Check("disk for store", status, f"{tokens:,} tokens x {bpt:,} B/token ({cfg.store_dtype}, "
                     f"{len(ids)} aux + last) = {need / gib:,.1f} GiB; {free / gib:,.1f} GiB free at {where}",
                     "free disk, use --store-dtype fp8 (about half), extract fewer samples, or train online"))


def draft_parameters(facts: TargetFacts, ids: list[int], vd: int, kind: str = "eagle3") -> tuple[int, int]:
    """(trainable, frozen) parameters of the draft this target gets, counted on the meta device."""
    parallel = kind != "eagle3"
    with torch.device("meta"):
        d = build_draft(draft_config(facts.config, kind, aux_layer_ids=ids, draft_vocab_size=vd,
                                     parallel_tokens=1 if parallel else None,   # counts do not depend on it
                                     mask_token_id=facts.vocab_size - 1 if parallel else None))
    frozen = sum(p.numel() for p in d.parameters() if not p.requires_grad)   # the kind's recipe decides
    return sum(p.numel() for p in d.parameters()) - frozen, frozen


def check_memory(cfg: DoctorConfig, facts: TargetFacts, ids: list[int], vd: int, out: list[Check],
                 kind: str = "eagle3") -> None:
    gib, H, k, T = 1 << 30, facts.hidden_size, len(ids), cfg.max_length
    t = getattr(facts.config, "text_config", None) or facts.config
    inter = max(int(getattr(t, "intermediate_size", 4 * H) or 4 * H), 4 * H)
    weights = facts.num_parameters * facts.dtype_bytes / max(cfg.gpus, 1)
    # Extraction: weights + captured states (k+1 bf16 vectors/token) + the widest transient (MLP) per batch.
    extract = weights + cfg.token_budget * (k + 1) * H * 2 + cfg.token_budget * (inter + 4 * H) * 2 * 2
    trainable, frozen = draft_parameters(facts, ids, vd, kind)
    # Training: fp32 master + grad + 2 Adam moments (16 B) per trainable, bf16 frozen embedding, and per TTT step
    # the draft-vocab logits in fp32 (value + softmax + grad) and the layer activations of one row.
    train = trainable * 16 + frozen * 2 + cfg.ttt_steps * T * (vd * 4 * 3 + 24 * H * 2) + T * k * H * 2
    avail = cfg.gpu_memory_gib * gib if cfg.gpu_memory_gib else None
    if avail is None:
        try:
            if torch.cuda.is_available():
                avail = float(torch.cuda.get_device_properties(0).total_memory)
        except Exception:  # noqa: BLE001 - no usable CUDA means nothing to compare against
            avail = None
    for name, need, fix in (("GPU memory: extraction", extract, "spread the target over more GPUs (--gpus), use a "
                             "smaller --token-budget, or a quantized target"),
                            ("GPU memory: training (offline)", train, "shorten --max-length or the draft vocabulary"),
                            ("GPU memory: training (online)", train + weights, "train offline from a store, or "
                             "spread the target over more GPUs")):
        detail = f"~{need / gib:,.1f} GiB per GPU (estimate)"
        if avail is None:
            out.append(Check(name, "pass", detail + "; no GPU visible here (pass --gpu-memory-gib to compare)"))
        else:
            status = "fail" if need > avail else "warn" if need > 0.9 * avail else "pass"
            out.append(Check(name, status, detail + f" of {avail / gib:,.0f} GiB", fix))
