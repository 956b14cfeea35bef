"""CLI glue for `eyas export` and `eyas import` (the library functions live in eyas.export)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from eyas.config import StageConfig
from eyas.devices import Dtype
from eyas.draft.io import read_draft_meta
from eyas.export import export_sglang, export_vllm, read_export
from eyas.export import import_draft
from eyas.flags import AuxLayerIds


class ExportConfig(StageConfig):
    draft: Path = Field(description="eyas draft / run directory (config.json with format: eyas-draft)")
    format: Literal["vllm", "sglang"] = Field("vllm", description="vllm = speculators format served with zero flags; "
                                                                  "sglang = LlamaForCausalLMEagle3 directory")
    out: Path = Field(description="output directory (written atomically; an earlier export there is replaced, "
                                  "anything else is refused)")
    chain: int | None = Field(None, ge=1, description="speculative tokens per step written into the config (vLLM "
                              "reads it; default: the kind's: EAGLE-3 3, parallel kinds the tokens they were "
                              "trained to draft)")
    verifier: str | None = Field(None, description="target name_or_path the engine should load "
                                                   "(default: the draft's target, as an absolute path if local)")
    embed: Literal["auto", "include", "omit"] = Field(
        "auto", description="embed_tokens in the export: auto omits it only when bit-identical to the target's "
                            "(the engine then shares the target's)")
    dtype: Dtype = Field("auto", description="weight dtype on disk (auto: keep the draft's)")


class ImportConfig(StageConfig):
    src: Path = Field(description="published draft dir: speculators/vLLM export, research EAGLE-3, SpecForge or SGLang")
    out: Path = Field(description="eyas draft directory to write")
    target: str | None = Field(None, description="the target (for a missing embed_tokens or absent aux layer ids); "
                                                 "default: the verifier named in the checkpoint")
    aux_layer_ids: AuxLayerIds | None = Field(None, description="override aux layer ids (eyas convention: residual "
                                                              "entering layer k)")


# What an export dir holds (export/writers.py): only such a dir may be replaced by a new export.
_EXPORT_FILES = {"config.json", "model.safetensors", "README.md"}


def check_export_out(draft: Path, out: Path) -> None:
    """Refuse an --out whose replacement would delete something that is not an earlier export: the draft
    or run itself (or a dir holding it), or any directory with other files in it."""
    d, o = Path(draft).resolve(), Path(out).resolve()
    if o == d or o in d.parents:
        raise ValueError(f"--out {out} is the draft/run dir --draft {draft} (or holds it): exporting there would "
                         f"delete the run; choose another --out, e.g. {Path(out) / 'export-vllm'}")
    if not os.path.lexists(out):
        return
    if Path(out).is_symlink() or not Path(out).is_dir():
        raise ValueError(f"--out {out} exists and is not a directory; choose another --out")
    names = {p.name for p in Path(out).iterdir()}
    try:
        ours = "eyas" in json.loads((Path(out) / "config.json").read_text())
    except (OSError, ValueError):
        ours = False
    if names and not (ours and names <= _EXPORT_FILES):
        extra = sorted(names - _EXPORT_FILES) or sorted(names)
        raise ValueError(f"--out {out} exists and is not an earlier eyas export (it holds {', '.join(extra[:5])}"
                         f"{' ...' if len(extra) > 5 else ''}); nothing was deleted: choose a new or empty --out")


def run_export(cfg: ExportConfig) -> dict:
    check_export_out(cfg.draft, cfg.out)
    fn = export_vllm if cfg.format == "vllm" else export_sglang
    out = fn(cfg.draft, cfg.out, chain=cfg.chain, verifier=cfg.verifier, embed=cfg.embed, dtype=cfg.dtype)
    config, tensors = read_export(out)
    return {"out": str(out), "format": cfg.format, "tensors": len(tensors),
            "verifier": (config.get("speculators_config") or {}).get("verifier", {}).get("name_or_path"),
            "embed_tokens": config["eyas"]["embed_tokens"]}


def run_import(cfg: ImportConfig) -> dict:
    out = import_draft(cfg.src, cfg.out, target=cfg.target, aux_layer_ids=cfg.aux_layer_ids)
    meta = read_draft_meta(out)
    return {"out": str(out), "format": meta["imported_from"]["format"], "target": meta.get("target"),
            "aux_layer_ids": meta["draft"]["aux_layer_ids"],
            "norm_before_residual": meta["draft"]["norm_before_residual"]}
