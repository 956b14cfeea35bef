"""`import_draft`: a published draft -> an eyas draft dir that `eyas eval` / `eyas export` accept.

Understood layouts (detected from config.json + key names):
  - speculators / vLLM exports of every registered kind (`speculators_model_type` eagle3, peagle, dflash:
    eyas.draft.kinds), keys `layers.N.*` (also eyas's own vLLM exports);
  - research EAGLE-3 (EAGLE authors), SpecForge and SGLang dirs: `LlamaForCausalLMEagle3`, keys `midlayer.*`;
    their layer keeps the residual before hidden_norm (norm_before_residual=false) and their optional
    `eagle_config.eagle_aux_hidden_state_layer_ids` name layer *outputs* (eyas id - 1).
Every weight must come from the checkpoint or, for the frozen token embedding only, from the target —
a missing or unknown key fails with its name, never a silently random-initialised tensor.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from eyas.aux_layers import aux_layer_id_problems, default_aux_layer_ids
from eyas.draft.io import save_draft
from eyas.draft.kinds import build_draft, get_kind
from eyas.draft.model import rope_inv_freq
from eyas.export.contract import IGNORABLE_SUFFIXES, SPECULATORS, check_tensors, rename, to_eyas_key
from eyas.export.files import ContractError, detect_format, parse_config, read_export
from eyas.export.writers import target_embedding
from eyas.cache import cache_dir
from eyas.outputs import claim
from eyas.target import load_config, resolve, text_config
from eyas.target.load import BUILTIN_TARGETS


def _target_dir(spec: str | None, *, fetch: bool) -> Path | None:
    """The target's local directory. A built-in name is fetched and converted only when the user named it
    (`fetch`): a name read from the checkpoint uses the converted copy if there is one, and nothing else."""
    if not spec:
        return None
    if spec in BUILTIN_TARGETS and not fetch:
        built = cache_dir() / "models" / spec
        return built if (built / ".complete").is_file() else None
    try:
        p = Path(resolve(spec).path)
    except FileNotFoundError:
        return None
    return p if p.is_dir() else None


def _target_layers(tdir: Path | None) -> int | None:
    if tdir is None:
        return None
    return int(text_config(load_config(str(tdir))).num_hidden_layers)


def import_draft(src: str | os.PathLike, out: str | os.PathLike, *, target: str | None = None,
                 aux_layer_ids: list[int] | None = None, overwrite: bool = False) -> Path:
    """Import `src` into the eyas draft dir `out` (claimed through eyas.outputs: never the source, a target or
    another command's output unless --overwrite)."""
    with claim(out, "draft", overwrite=overwrite, inputs={"src": src, "target": target}) as held:
        _import(Path(src), held.path, target, aux_layer_ids)
    return Path(out)


def _import(src: Path, out: Path, target: str | None, aux_layer_ids: list[int] | None) -> Path:
    config, tensors = read_export(src)
    fmt = detect_format(config, tensors)
    sc = config.get("speculators_config") if isinstance(config.get("speculators_config"), dict) else {}
    verifier = (sc.get("verifier") if isinstance(sc.get("verifier"), dict) else {}).get("name_or_path")
    eyas_meta = config.get("eyas") if isinstance(config.get("eyas"), dict) else {}
    spec = target or eyas_meta.get("target") or verifier
    tdir = _target_dir(spec, fetch=bool(target)) or _target_dir(verifier, fetch=False)

    n_layers = _target_layers(tdir)
    default_aux = list(aux_layer_ids) if aux_layer_ids else None
    if default_aux is None and n_layers is not None:
        default_aux = default_aux_layer_ids(n_layers)
    dc, errors = parse_config(config, fmt, strict=False, default_aux=default_aux)
    if aux_layer_ids and dc is not None:
        dc.aux_layer_ids = list(aux_layer_ids)  # explicit override wins over the file
    if dc is not None and n_layers is not None:
        errors += aux_layer_id_problems(dc.aux_layer_ids, n_layers, key="aux_layer_ids")
    if errors or dc is None:
        raise ContractError(f"cannot import {src}", errors)

    notes: dict[str, Any] = {}
    tensors = {k: v for k, v in tensors.items() if not k.endswith(IGNORABLE_SUFFIXES)}
    emb_key = rename("embed_tokens.weight", fmt)
    if emb_key not in tensors:
        emb = target_embedding(str(tdir)) if tdir is not None else None
        if emb is None:
            raise ContractError(f"cannot import {src}", [
                f"{emb_key}: not in the checkpoint (engines share the target's); pass --target so eyas can copy "
                f"the target's token embedding (looked for {spec!r})"])
        tensors[emb_key] = emb.to(next(v.dtype for v in tensors.values() if v.is_floating_point()))
        notes["embed_tokens"] = f"copied from target {tdir}"
    errors = check_tensors(dc, tensors, fmt)
    if errors:
        raise ContractError(f"cannot import {src}", errors)
    if dc.draft_vocab_size == dc.vocab_size and "d2t" not in tensors:
        # Full-vocab drafts ship no map (vLLM refuses one): the identity is the only meaning it can have.
        tensors["d2t"] = torch.zeros(dc.vocab_size, dtype=torch.int64)
        tensors["t2d"] = torch.ones(dc.vocab_size, dtype=torch.bool)
        notes["vocab_map"] = "identity (full-vocab draft without d2t/t2d)"

    sd = {to_eyas_key(k, fmt): v for k, v in tensors.items()}
    fdtype = next(v.dtype for v in sd.values() if v.is_floating_point())
    dc.extra = {**dc.extra, "imported_format": fmt}
    if fmt == SPECULATORS:
        archs = ((config.get("speculators_config") or {}).get("verifier") or {}).get("architectures")
        if archs:
            dc.extra["target_architectures"] = list(archs)
    sd = get_kind(dc).from_export(dc, sd)
    with torch.device("meta"):
        model = build_draft(dc)
    model.load_state_dict(sd, strict=True, assign=True)
    model.inv_freq = rope_inv_freq(dc)
    meta = {"target": spec or (str(tdir) if tdir is not None else None),
            "imported_from": {"path": str(src.resolve()), "format": fmt, **notes}}
    if isinstance(config.get("eyas"), dict):
        meta["imported_from"]["eyas"] = config["eyas"]
    return save_draft(model, out, meta, dtype=fdtype)
