"""vLLM's own speedup with an eyas draft: greedy tokens/s with and without speculative decoding.

Each configuration (the plain target, then the export of each chain length K) is one vLLM engine started by
`vllm_serve_worker.py` (bench mode) in vLLM's environment. Jobs go round-robin over the GPUs; on each GPU they run
in waves of `engines_per_gpu` engines that share its memory. An engine's start-up (compile, graph capture) takes
minutes and its timing well under one, so a wave's engines start side by side, wait at a barrier until all of the
wave are up (or have failed), then take turns timing under one lock per GPU; the next wave starts when the last
one has finished. Start-ups overlap; a timing never overlaps another engine's start-up or timing on its GPU.

The report is what a user asks before serving a draft: tokens/s at batch 1, 8, 32 for each K, the speedup over the
plain target at the same batch, vLLM's own τ and per-position acceptance, whether the outputs equal the plain
target's, and each engine's seconds (start-up, waiting, timing, in all) plus the whole sweep's. `on_result` hears
of each engine as it finishes, so a caller can keep what is done when the sweep is cut short; `report` summarises
any subset (no base: tokens/s without speedups; a failed engine: listed under "failed").

Engines side by side on one GPU get an explicit KV cache (`kv_cache_memory_bytes`, from `engine_memory`): the
target's and the draft's K/V bytes per token x the largest batch x (max_model_len + slack), with a margin. vLLM's
default sizing cannot be shared: it profiles free memory at start-up and takes `gpu_memory_utilization` x total
minus what it measured in use, so a neighbour allocating during the profile leaves it nothing ("No available memory
for the cache blocks", as K=5 did on an H200 with 0.26). In vLLM 0.26 `Worker.determine_available_memory`
(v1/worker/gpu_worker.py) returns `kv_cache_memory_bytes` when set, before `memory_profiling`: the profile run
still compiles but nothing is measured, and the "free memory rose during profiling" assert is skipped. One check
still reads free memory: `request_memory` (v1/worker/utils.py, at `init_device`) refuses to start unless
free >= gpu_memory_utilization x total. So each engine keeps its share 0.85/N there: it passes while every
neighbour stays within its own share, which a fixed KV size (not "whatever was free") makes true.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from eyas.engines.base import run_in_env

WORKER = Path(__file__).with_name("vllm_serve_worker.py")  # its bench mode (batch_sizes)


# K/V element bytes of each dtype the payload may name (kv_cache_dtype "auto" = the model's dtype).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Per sequence beyond max_model_len: rounding up to 16-token blocks, plus spec decode's lookahead slots (K each).
SLACK_TOKENS = 64
# vLLM rounds blocks down per layer group and keeps a few for itself; 10% keeps the largest batch from preempting.
KV_MARGIN = 1.10


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    """K and V of every attention layer of one HF config dict (its text part), for one token. Full attention is
    assumed for every layer: sliding-window layers need less, so the estimate only errs on the safe side."""
    c = config.get("text_config") or config
    if c.get("kv_lora_rank"):   # MLA: one latent of kv_lora_rank plus the shared rope key per token and layer
        return int(c["num_hidden_layers"]) * (int(c["kv_lora_rank"]) + int(c.get("qk_rope_head_dim") or 0)) * \
            DTYPE_BYTES[dtype]
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or c["hidden_size"] // heads)
    return int(c["num_hidden_layers"]) * 2 * kv_heads * head_dim * DTYPE_BYTES[dtype]


def draft_layers(export_config: dict | None, target_config: dict) -> dict:
    """The draft's attention as vLLM allocates it: the export's transformer_layer_config (one layer), else one
    layer shaped like the target's (eyas's drafts copy the target's heads; only reached when the export is
    unreadable, and then its engine fails anyway)."""
    tlc = (export_config or {}).get("transformer_layer_config")
    return tlc if tlc else {**(target_config.get("text_config") or target_config), "num_hidden_layers": 1}


def engine_memory(engines_per_gpu: int, target_config: dict, draft_config: dict | None, batch: int,
                  max_model_len: int, dtype: str) -> dict:
    """The memory settings of one engine's payload: {} alone on its GPU (vLLM's own profiling is right there);
    side by side, its share of the GPU (vLLM's start-up free-memory check) and an explicit KV cache for `batch`
    full-length sequences of the target plus the draft's layer (`draft_config`, None for the plain target)."""
    if engines_per_gpu <= 1:
        return {}
    per_token = kv_bytes_per_token(target_config, dtype)
    if draft_config is not None:
        per_token += kv_bytes_per_token(draft_config, dtype)
    tokens = batch * (max_model_len + SLACK_TOKENS)
    return {"gpu_memory_utilization": min(0.9, 0.85 / engines_per_gpu),
            "kv_cache_memory_bytes": math.ceil(per_token * tokens * KV_MARGIN)}


def read_config(model: str) -> dict | None:
    """A model dir's config.json (an export's, or the target's); the target may also be a hub id or a built-in
    name, read through transformers. None when there is none (an export that is missing)."""
    path = Path(model) / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    if Path(model).exists():
        return None
    from eyas.target.load import load_config

    return load_config(model).to_dict()


def plan_memory(jobs: list[tuple[str, str]], target: str, engines_per_gpu: int, batch: int, max_model_len: int,
                dtype: str) -> dict[str, dict]:
    """Each job's `engine_memory` (job "base" is the plain target; the others serve an export's draft too)."""
    if engines_per_gpu <= 1:
        return {name: {} for name, _ in jobs}
    target_cfg = read_config(target)
    if target_cfg is None:
        raise FileNotFoundError(f"{target}: no config.json; {engines_per_gpu} engines per GPU need the target's "
                                "config to size each one's KV cache")
    return {name: engine_memory(engines_per_gpu, target_cfg,
                                None if name == "base" else draft_layers(read_config(model), target_cfg),
                                batch, max_model_len, dtype) for name, model in jobs}


def spec_stats(metrics: dict) -> dict:
    """τ (1 + accepted / drafts) and per-position acceptance from one run's vLLM counter deltas."""
    drafts = int(metrics.get("vllm:spec_decode_num_drafts") or 0)
    if drafts == 0:
        return {"drafts": 0, "tau": None, "accept_per_position": []}
    acc = int(metrics.get("vllm:spec_decode_num_accepted_tokens") or 0)
    per_pos = metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos") or []
    return {"drafts": drafts, "tau": 1.0 + acc / drafts, "accept_per_position": [p / drafts for p in per_pos]}


def tok_s(run: dict) -> float:
    return run["generated_tokens"] / run["seconds"]


def summarize(base: dict | None, spec: dict[int, dict]) -> dict:
    """Rows of (K, batch) against the plain target's run at the same batch; `base`/`spec[K]` are worker outputs.
    Without `base` (its engine failed or has not finished) rows have tokens/s and τ but no speedup."""
    base_runs = {r["batch_size"]: r for r in base["runs"]} if base else {}
    rows = []
    for k, doc in sorted(spec.items()):
        for r in doc["runs"]:
            row = {"chain": k, "batch_size": r["batch_size"], "tok_s": tok_s(r), **spec_stats(r["metrics"])}
            if len(r.get("round_seconds", ())) > 1:  # every round's rate: how far a neighbour moved the slowest
                row["round_tok_s"] = [r["generated_tokens"] / t for t in r["round_seconds"]]
            b = base_runs.get(r["batch_size"])
            if b:
                same = sum(o == p for o, p in zip(r["outputs"], b["outputs"]))
                row.update(base_tok_s=tok_s(b), speedup=tok_s(r) / tok_s(b),
                           identical_to_base=f"{same}/{len(r['outputs'])}")
            rows.append(row)
    best = {}
    for row in rows:
        b = row["batch_size"]
        if "speedup" in row and (b not in best or row["speedup"] > best[b]["speedup"]):
            best[b] = row
    out = {"base_tok_s": {str(b): tok_s(r) for b, r in sorted(base_runs.items())}}
    if any(len(r.get("round_seconds", ())) > 1 for r in base_runs.values()):
        out["base_round_tok_s"] = {str(b): [r["generated_tokens"] / t for t in r["round_seconds"]]
                                   for b, r in sorted(base_runs.items())}
    return {**out, "rows": rows,
            "best_by_batch": {str(b): {"chain": r["chain"], "speedup": r["speedup"], "tau": r["tau"]}
                              for b, r in sorted(best.items())}}


PER_ENGINE = ("gpu", "startup_s", "wait_s", "measure_s", "rounds", "wall_s", "barrier_timed_out", "start_after_s",
              "start_after_timed_out", "gpu_memory_utilization", "kv_cache_memory_bytes")


def report(done: dict[str, dict]) -> dict:
    """The summary of the engines finished so far ({job: worker output or {"error": ...}}), partial or whole."""
    ok = {name: doc for name, doc in done.items() if "error" not in doc}
    out = summarize(ok.get("base"), {int(name[1:]): doc for name, doc in ok.items() if name != "base"})
    out["failed"] = {name: doc["error"] for name, doc in done.items() if "error" in doc}
    out["engines"] = {name: {t: doc[t] for t in PER_ENGINE if t in doc} for name, doc in done.items()}
    out["vllm_version"] = next((doc["vllm_version"] for doc in ok.values()), None)
    return out


def measure(python: Path, target: str, export: str, prompts: list[list[int]], chains: list[int],
            batch_sizes: list[int], max_tokens: int, gpus: list[str], log_dir: Path,
            max_model_len: int = 2048, engines_per_gpu: int = 1,
            on_result: Callable[[str, dict], None] | None = None, barrier_timeout_s: float = 900.0,
            rounds: int = 1, start_after: str | None = None) -> dict:
    """Run the plain target and each K, round-robin over `gpus`, up to `engines_per_gpu` engines per GPU at once.
    `on_result(job, doc)` is called (one call at a time) as each engine finishes: doc is the worker's output, or
    {"error": ...} when its engine failed; either way with "gpu" and "wall_s". A failed engine does not stop the
    sweep: it is listed under "failed". start_after: a file; no engine times before it exists (the engines start
    while untimed work on the same GPU finishes). Returns `report` of all engines plus "sweep_s"."""
    # vLLM takes K from a speculators export's own config (a speculative_config override of K is ignored), so
    # each K is its own export: `export` may name them as a pattern, e.g. "/tmp/export-k{k}".
    jobs = [("base", target)] + [(f"k{k}", export.format(k=k)) for k in chains]
    log_dir.mkdir(parents=True, exist_ok=True)
    n, dtype = max(1, engines_per_gpu), "bfloat16"
    memory = plan_memory(jobs, target, n, max(batch_sizes), max_model_len, dtype)  # before any engine starts
    done, one_at_a_time, t_sweep = {}, threading.Lock(), time.perf_counter()

    def one(name: str, model: str, g: int, wave_dir: Path, count: int) -> None:
        payload = {"model": model, "speculative_config": None, "prompts": prompts, "max_tokens": max_tokens,
                   "batch_sizes": batch_sizes, "rounds": rounds, "dtype": dtype, "max_model_len": max_model_len,
                   "enforce_eager": False, "seed": 0, **memory[name],
                   "measure_lock": str(wave_dir.parent / f"gpu{g}.lock"), "start_after": start_after,
                   "barrier": {"dir": str(wave_dir), "name": name, "count": count, "timeout_s": barrier_timeout_s}}
        env = {"CUDA_VISIBLE_DEVICES": gpus[g], "VLLM_HOST_IP": os.environ.get("VLLM_HOST_IP", "127.0.0.1")}
        t0 = time.perf_counter()
        try:
            doc = run_in_env(python, WORKER, payload, env=env, log=log_dir / f"{name}.log")
        except Exception as e:  # noqa: BLE001 - any failure is this engine's result, not the sweep's end
            (wave_dir / f"{name}.failed").touch()  # counts at the barrier: the rest of the wave need not wait for it
            doc = {"error": str(e) or repr(e)}
        doc.update(gpu=gpus[g], wall_s=time.perf_counter() - t0, **memory[name])  # what it was given
        with one_at_a_time:
            done[name] = doc
            if on_result:
                on_result(name, doc)

    def lane(g: int, tmp: Path) -> None:
        """GPU g's jobs in waves: a wave starts when the one before has finished, so no start-up meets a timing."""
        mine = jobs[g::len(gpus)]
        for w in range(0, len(mine), n):
            wave, wave_dir = mine[w:w + n], tmp / f"gpu{g}-wave{w // n}"
            wave_dir.mkdir()
            with ThreadPoolExecutor(len(wave)) as pool:
                list(pool.map(lambda job: one(*job, g, wave_dir, len(wave)), wave))

    with tempfile.TemporaryDirectory(prefix="eyas-vllm-speedup-") as tmp, ThreadPoolExecutor(len(gpus)) as pool:
        list(pool.map(lambda g: lane(g, Path(tmp)), range(len(gpus))))
    return {**report(done), "sweep_s": time.perf_counter() - t_sweep}
