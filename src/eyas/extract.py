"""`eyas extract`: the command. Checks the flags against the target's config, then hands the PREPARED rows
to one backend: hf (transformers in this process, eyas.store.extract) or vllm (vLLM in its own
environment, eyas.engines.vllm_extract). The choice lives here so that neither backend imports the other.

Under torchrun each rank extracts shards j % WORLD_SIZE == RANK (see eyas.store.writer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from eyas.aux_layers import resolve_aux_layer_ids
from eyas.config import StageConfig
from eyas.data import PreparedDataset
from eyas.devices import StoreDtype, dist_env, fast_bf16, resolve_device
from eyas.flags import AuxLayerIds, CacheDir, Device, Target, TextOnly, TrustRemoteCode
from eyas.outputs import claim
from eyas.store.extract import extract_to_store
from eyas.store.format import StoreError, target_identity
from eyas.target import load_config, load_target, text_config
from eyas.target.compiled import compile_layers


class ExtractConfig(StageConfig):
    target: Target
    data: Path = Field(description="PREPARED dataset directory written by `eyas prepare`")
    out: Path = Field(description="STORE directory to write (resumes when it holds a partial store)")
    store_dtype: StoreDtype = Field("bf16", description="storage dtype of the hidden states "
                                    "(fp8 = e4m3 with one scale per token and layer; half the disk)")
    aux_layer_ids: AuxLayerIds | None = Field(None, description="aux layer ids, strictly increasing "
                                                                "(default 2, N//2, N-3)")
    backend: Literal["hf", "vllm"] = Field("hf", description="hf: transformers in this process; vllm: vLLM in "
                                           "its own environment (see --python)")
    python: str | None = Field(None, description="vLLM environment's python for --backend vllm "
                               "(default $EYAS_VLLM_PYTHON)")
    tensor_parallel_size: int = Field(1, ge=1, description="--backend vllm: GPUs vLLM shards the target over")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="--backend vllm: the engine's share "
                                                 "of the GPU's memory (vLLM's gpu_memory_utilization, default 0.9); "
                                                 "lower it when other jobs share the GPU (vLLM refuses to start "
                                                 "with less free)")
    engine_timeout: float | None = Field(None, gt=0, description="--backend vllm: seconds the engine may run once "
                                         "it holds eyas's vLLM lock (start-up and prefill); past them its "
                                         "processes' stacks go to its log and it is stopped (default: no bound)")
    text_only: TextOnly = False
    device: Device = "auto"
    attn_implementation: str = Field("sdpa", description="transformers attention: sdpa | flash_attention_2 "
                                     "(packs each batch into one row) | flex_attention | eager")
    token_budget: int = Field(16384, gt=0, description="tokens per forward batch (padding included)")
    shard_mb: float = Field(256.0, gt=0, description="target size of one shard file in MiB")
    writer_threads: int = Field(4, ge=1, description="threads hashing and writing shards (each ~0.4 GB/s "
                                "on an H200 host; the store needs bytes/token x tokens/s)")
    compile: bool = Field(False, description="torch.compile the target's decoder layers (faster forward on GPUs; "
                          "the first batches pay the compile)")
    max_samples: int | None = Field(None, ge=1, description="extract only the first N prepared rows")
    overwrite: bool = Field(False, description="delete an existing store in --out first (single process only)")
    cache_dir: CacheDir = None
    trust_remote_code: TrustRemoteCode = False


def run(cfg: ExtractConfig) -> dict[str, Any]:
    rank, world, _ = dist_env()
    if not 0 <= rank < world:
        raise StoreError(f"RANK={rank} is outside WORLD_SIZE={world}")
    # Every flag is checked against the target's config before any weight loads.
    device = resolve_device(cfg.device) if cfg.backend == "hf" else None
    config = load_config(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code)
    text = text_config(config)
    aux_ids = resolve_aux_layer_ids(cfg.aux_layer_ids, int(text.num_hidden_layers))
    if cfg.overwrite and world > 1:
        raise StoreError("--overwrite with several ranks would race; delete the --out directory first")
    if not Path(cfg.data).is_dir():
        raise FileNotFoundError(f"prepared dataset directory not found: {cfg.data}")
    # The store's own per-rank locks (eyas.store.writer) guard its writers: the claim takes none of its own.
    with claim(cfg.out, "store", overwrite=cfg.overwrite, lock=None, cache=cfg.cache_dir,
               inputs={"target": cfg.target, "data": cfg.data},
               settings={"store_dtype": cfg.store_dtype, "aux_layer_ids": aux_ids, "max_samples": cfg.max_samples,
                         "shard_mb": cfg.shard_mb}):
        return _extract(cfg, config, aux_ids, device, rank, world)


def _extract(cfg: ExtractConfig, config, aux_ids: list[int], device, rank: int, world: int) -> dict[str, Any]:
    dataset = PreparedDataset(cfg.data, verify=True)  # a flipped token byte must not become a silent store
    if cfg.backend == "vllm":
        from eyas.engines.vllm_extract import extract_with_vllm

        return extract_with_vllm(cfg, dataset, config, aux_ids, rank=rank, world=world)
    # bf16 where it is native (GPUs, AMX CPUs); fp32 on CPUs that would emulate it many times slower. The store
    # holds bf16 or fp8 either way.
    t = load_target(cfg.target, dtype=torch.bfloat16 if fast_bf16(device) else torch.float32, device=device,
                    cache=cfg.cache_dir,
                    trust_remote_code=cfg.trust_remote_code, attn_implementation=cfg.attn_implementation)
    if cfg.compile:
        compile_layers(t.layout)
    identity = target_identity(cfg.target, t.config, aux_ids, cfg.store_dtype, hidden_size=t.layout.hidden_size,
                               num_layers=t.layout.num_layers, vocab_size=t.layout.vocab_size)
    summary = extract_to_store(t.model, t.layout, dataset, cfg.out, identity=identity, token_budget=cfg.token_budget,
                               shard_mb=cfg.shard_mb, writer_threads=cfg.writer_threads, limit=cfg.max_samples,
                               rank=rank, world=world, packed=cfg.attn_implementation == "flash_attention_2",
                               device=device)
    return {"data": str(cfg.data), **summary}
