"""CLI glue for `eyas export` and `eyas import` (the library functions live in eyas.export)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from eyas.config import StageConfig
from eyas.devices import Dtype
from eyas.draft.io import read_draft_meta
from eyas.export import export_sglang, export_vllm, read_export
from eyas.export import import_draft
from eyas.flags import AuxLayerIds, Target


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
    overwrite: bool = Field(False, description="--out holds something else eyas wrote (a run, a store, ...): "
                                               "replace it")


class ImportConfig(StageConfig):
    src: Path = Field(description="published draft dir: speculators/vLLM export, research EAGLE-3, SpecForge or SGLang")
    out: Path = Field(description="eyas draft directory to write")
    target: Target | None = Field(None, description="the target, for a missing embed_tokens or absent aux layer "
                                                   "ids (default: the verifier named in the checkpoint)")
    aux_layer_ids: AuxLayerIds | None = Field(None, description="override aux layer ids (eyas convention: residual "
                                                              "entering layer k)")
    overwrite: bool = Field(False, description="--out holds something else eyas wrote (a training run, an "
                                               "export, ...): replace it")


def run_export(cfg: ExportConfig) -> dict:
    fn = export_vllm if cfg.format == "vllm" else export_sglang
    out = fn(cfg.draft, cfg.out, chain=cfg.chain, verifier=cfg.verifier, embed=cfg.embed, dtype=cfg.dtype,
             overwrite=cfg.overwrite)
    config, tensors = read_export(out)
    return {"out": str(out), "format": cfg.format, "tensors": len(tensors),
            "verifier": (config.get("speculators_config") or {}).get("verifier", {}).get("name_or_path"),
            "embed_tokens": config["eyas"]["embed_tokens"]}


def run_import(cfg: ImportConfig) -> dict:
    out = import_draft(cfg.src, cfg.out, target=cfg.target, aux_layer_ids=cfg.aux_layer_ids, overwrite=cfg.overwrite)
    meta = read_draft_meta(out)
    return {"out": str(out), "format": meta["imported_from"]["format"], "target": meta.get("target"),
            "aux_layer_ids": meta["draft"]["aux_layer_ids"],
            "norm_before_residual": meta["draft"]["norm_before_residual"]}
