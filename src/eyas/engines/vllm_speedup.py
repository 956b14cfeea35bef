"""vLLM's own speedup with an eyas draft: greedy tokens/s with and without speculative decoding.

Each configuration (the plain target, then the export of each chain length K) is one vLLM engine started by
`vllm_serve_worker.py` (bench mode) in vLLM's environment; engines start side by side and take turns timing,
so start-ups overlap and timings do not. The report is what a user
asks before serving a draft: tokens/s at batch 1, 8, 32 for each K, the speedup over the plain target at the
same batch, vLLM's own τ and per-position acceptance, and whether the outputs equal the plain target's.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eyas.engines.base import run_in_env

WORKER = Path(__file__).with_name("vllm_serve_worker.py")  # its bench mode (batch_sizes)


def spec_stats(metrics: dict) -> dict:
    """τ (1 + accepted / drafts) and per-position acceptance from one run's vLLM counter deltas."""
    drafts = int(metrics.get("vllm:spec_decode_num_drafts") or 0)
    if drafts == 0:
        return {"drafts": 0, "tau": None, "accept_per_position": []}
    acc = int(metrics.get("vllm:spec_decode_num_accepted_tokens") or 0)
    per_pos = metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos") or []
    return {"drafts": drafts, "tau": 1.0 + acc / drafts, "accept_per_position": [p / drafts for p in per_pos]}


def summarize(base: dict, spec: dict[int, dict]) -> dict:
    """Rows of (K, batch) against the plain target's run at the same batch; `base`/`spec[K]` are worker outputs."""
    base_runs = {r["batch_size"]: r for r in base["runs"]}
    rows = []
    for k, doc in sorted(spec.items()):
        for r in doc["runs"]:
            b = base_runs[r["batch_size"]]
            tps, base_tps = r["generated_tokens"] / r["seconds"], b["generated_tokens"] / b["seconds"]
            same = sum(o == p for o, p in zip(r["outputs"], b["outputs"]))
            rows.append({"chain": k, "batch_size": r["batch_size"], "tok_s": tps, "base_tok_s": base_tps,
                         "speedup": tps / base_tps, **spec_stats(r["metrics"]),
                         "identical_to_base": f"{same}/{len(r['outputs'])}"})
    best = {}
    for row in rows:
        b = row["batch_size"]
        if b not in best or row["speedup"] > best[b]["speedup"]:
            best[b] = row
    return {"rows": rows, "best_by_batch": {str(b): {"chain": r["chain"], "speedup": r["speedup"], "tau": r["tau"]}
                                            for b, r in sorted(best.items())}}


def measure(python: Path, target: str, export: str, prompts: list[list[int]], chains: list[int],
            batch_sizes: list[int], max_tokens: int, gpus: list[str], log_dir: Path,
            max_model_len: int = 2048) -> dict:
    """Run the plain target and each K, spread round-robin over `gpus` (one engine per GPU at a time)."""
    # vLLM takes K from a speculators export's own config (a speculative_config override of K is ignored), so
    # each K is its own export: `export` may name them as a pattern, e.g. "/tmp/export-k{k}".
    jobs = [("base", target, None)] + [(f"k{k}", export.format(k=k), None) for k in chains]
    log_dir.mkdir(parents=True, exist_ok=True)

    def one(i_job):
        i, (name, model, spec) = i_job
        payload = {"model": model, "speculative_config": spec, "prompts": prompts, "max_tokens": max_tokens,
                   "batch_sizes": batch_sizes, "dtype": "bfloat16", "max_model_len": max_model_len,
                   "enforce_eager": False, "seed": 0}
        env = {"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)], "VLLM_HOST_IP": os.environ.get("VLLM_HOST_IP",
                                                                                            "127.0.0.1")}
        return name, run_in_env(python, WORKER, payload, env=env, log=log_dir / f"{name}.log")

    # A GPU runs one engine at a time: job i waits for job i - len(gpus) by running in the same lane.
    lanes = [[(i, j) for i, j in enumerate(jobs) if i % len(gpus) == g] for g in range(len(gpus))]
    with ThreadPoolExecutor(len(gpus)) as pool:
        done = dict(x for lane in pool.map(lambda lane: [one(j) for j in lane], lanes) for x in lane)
    base = done.pop("base")
    spec = {int(name[1:]): doc for name, doc in done.items()}
    out = summarize(base, spec)
    out["startup_s"] = {"base": base["startup_s"], **{f"k{k}": d["startup_s"] for k, d in spec.items()}}
    out["vllm_version"] = base["vllm_version"]
    return out
