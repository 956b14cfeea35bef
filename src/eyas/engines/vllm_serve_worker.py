"""Runs INSIDE the vLLM environment (stdlib + vllm only): `python vllm_serve_worker.py IN.json OUT.json`.

One engine, greedy, with vLLM's own counters; used by serve-check and by the speedup bench.
IN:  {"model": DIR, "speculative_config": {...} | null, "prompts": [[token ids], ...], "max_tokens": N,
      "dtype": "auto"|"float32"|..., "max_model_len": N, "seed": 0,
      optional: "enforce_eager" (default true), "gpu_memory_utilization" (0.9),
                "batch_sizes": [1, 8, 32] (bench mode), "measure_lock": PATH}
     With a speculators export as "model", vLLM reads the verifier and K from the export's config.json: the
     zero-flag path eyas promises (vLLM locks method, model and K; a num_speculative_tokens override is ignored).
OUT (serve-check): {"vllm_version", "outputs": [[generated ids], ...], "metrics": {name: value | [values]},
      "startup_s", "generate_s", "speculative_config"}
OUT (bench mode, "batch_sizes" given): {"vllm_version", "startup_s", "speculative_config", "runs": [{"batch_size",
      "seconds", "generated_tokens", "requests", "metrics" (deltas over this run), "outputs"}]}. `batch_size` b means b
     requests in flight at a time. Several engines may share a GPU (each its memory share) and start side by side;
     with `measure_lock`, only one of them times at once (an exclusive flock around the timed part).
"""

import fcntl
import json
import os
import sys
import time

# Python puts this script's directory first on sys.path, and that directory holds eyas's own
# `engines/vllm.py` adapter, which would shadow the real vllm package. Drop it before importing vllm.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def metrics(llm) -> dict:
    """vLLM's speculative-decoding counters and token counts (cumulative since the engine started)."""
    got = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode") or m.name in ("vllm:generation_tokens", "vllm:prompt_tokens"):
            got[m.name] = list(m.values) if hasattr(m, "values") and not hasattr(m, "value") else getattr(m, "value", None)
    return got


def delta(after: dict, before: dict) -> dict:
    out = {}
    for k, v in after.items():
        if isinstance(v, list):
            out[k] = [x - y for x, y in zip(v, before.get(k) or [0] * len(v))]
        else:
            out[k] = (v or 0) - (before.get(k) or 0)
    return out


def bench(llm, prompts, params, batch_sizes, lock_path) -> list:
    from vllm import SamplingParams

    lock = open(lock_path, "w") if lock_path else None
    if lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    runs = []
    for b in batch_sizes:
        before = metrics(llm)
        outputs, t0 = [], time.perf_counter()
        for i in range(0, len(prompts), b):
            outputs += [list(r.outputs[0].token_ids) for r in llm.generate(prompts[i:i + b], params, use_tqdm=False)]
        seconds = time.perf_counter() - t0
        runs.append({"batch_size": b, "seconds": seconds, "requests": len(outputs),
                     "generated_tokens": sum(len(o) for o in outputs), "metrics": delta(metrics(llm), before),
                     "outputs": outputs})
        print(f"batch {b}: {runs[-1]['generated_tokens'] / seconds:.1f} tok/s", flush=True)
    if lock:
        lock.close()
    return runs


def main(inp: str, out: str) -> None:
    req = json.load(open(inp))
    import vllm
    from vllm import LLM, SamplingParams

    kw = dict(model=req["model"], dtype=req.get("dtype", "auto"), seed=req.get("seed", 0),
              max_model_len=req.get("max_model_len", 2048), disable_log_stats=False,
              enforce_eager=req.get("enforce_eager", True),
              gpu_memory_utilization=req.get("gpu_memory_utilization", 0.9))
    if req.get("speculative_config"):
        kw["speculative_config"] = req["speculative_config"]
    t0 = time.perf_counter()
    llm = LLM(**kw)
    startup = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=False)
    prompts = [{"prompt_token_ids": ids} for ids in req["prompts"]]
    spec = llm.llm_engine.vllm_config.speculative_config
    doc = {"vllm_version": vllm.__version__, "startup_s": startup,
           "speculative_config": None if spec is None else {
               "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
               "model": spec.model, "target": llm.llm_engine.vllm_config.model_config.model}}
    if req.get("batch_sizes"):
        doc["runs"] = bench(llm, prompts, params, req["batch_sizes"], req.get("measure_lock"))
    else:
        t0 = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        doc.update(generate_s=time.perf_counter() - t0, metrics=metrics(llm),
                   outputs=[list(r.outputs[0].token_ids) for r in results])
    json.dump(doc, open(out, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
