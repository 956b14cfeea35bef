"""Runs INSIDE the vLLM environment (stdlib + vllm only): `python vllm_serve_worker.py IN.json OUT.json`.

One engine, greedy, with vLLM's own counters; used by serve-check and by the speedup bench.
IN:  {"model": DIR, "speculative_config": {...} | null, "prompts": [[token ids], ...], "max_tokens": N,
      "dtype": "auto"|"float32"|..., "max_model_len": N, "seed": 0,
      optional: "enforce_eager" (default true), "gpu_memory_utilization" (0.9), "tensor_parallel_size" (1),
                "enable_expert_parallel" (false: an MoE target's experts split over the TP ranks), "kv_cache_memory_bytes" (an
                explicit KV cache: vLLM then skips its free-memory profiling; see vllm_speedup),
                "logprobs": n (serve-check: vLLM's top-n logprobs of each generated token come back),
                "batch_sizes": [1, 8, 32] (bench mode), "rounds": R (bench mode, default 1), "barrier": {...},
                "measure_lock": PATH (both below)}
     With a speculators export as "model", vLLM reads the verifier and K from the export's config.json: the
     zero-flag path eyas promises (vLLM locks method, model and K; a num_speculative_tokens override is ignored).
OUT (serve-check): {"vllm_version", "outputs": [[generated ids], ...], "metrics": {name: value | [values]},
      "startup_s", "generate_s", "speculative_config"}, and with "logprobs": "logprobs": per prompt, per generated
      token, [[token id, logprob], ...] best first (vLLM's top-n, plus its own token should it not be among them)
OUT (bench mode, "batch_sizes" given): {"vllm_version", "startup_s", "speculative_config", "wait_s", "measure_s",
      "rounds", "runs": [{"batch_size", "seconds", "generated_tokens", "requests", "metrics" (deltas over this run),
      "outputs", "round_seconds"}]}: each batch size timed in R rounds after one warm-up pass over every batch size
      (16 tokens each), the fastest round reported.
     `batch_size` b means b requests in flight at a time. Several engines may share a GPU (each its memory share,
     "gpu_memory_utilization") and start side by side. Bench mode then takes, in this order:
       "barrier": {"dir": PATH, "count": n, "timeout_s": 900, "name": id (default: the pid)}: once its engine is up,
           the worker writes `<dir>/<name>.ready` and waits until n distinct names have a `.ready` or `.failed`
           file there (the caller writes `<name>.failed` for an engine that died), so no engine times while another
           of its wave still starts; OUT's "barrier_timed_out" is true when it went on after timeout_s instead;
       "start_after": PATH: no engine times before this file exists (untimed work sharing the GPU, e.g. a Spec-Bench
           tau eval, finishes first while the engines start up); OUT's "start_after_s" is the wait, up to the
           barrier's timeout_s (then it goes on, "start_after_timed_out": true);
       "measure_lock": PATH: an exclusive flock around each round (the first with the warm-up), so one engine times
           at once and the engines of a wave take turns round by round.
     wait_s: seconds from engine up to holding the lock, summed over rounds; measure_s: seconds holding it.
"""

import contextlib
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


def wait_for_file(path: str, timeout_s: float) -> tuple[float, bool]:
    """Wait until `path` exists: (seconds waited, whether it timed out)."""
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > timeout_s:
            return time.monotonic() - t0, True
        time.sleep(0.2)
    return time.monotonic() - t0, False


def wait_at_barrier(barrier: dict) -> bool:
    """Say this engine is up, then wait for the rest of its wave (ready or failed); True if the wait timed out."""
    d = barrier["dir"]
    open(os.path.join(d, f"{barrier.get('name', os.getpid())}.ready"), "w").close()
    deadline = time.monotonic() + barrier.get("timeout_s", 900)
    # distinct names: an engine that timed out here and then died has both a .ready and a .failed file
    while len({os.path.splitext(f)[0] for f in os.listdir(d)}) < barrier["count"]:
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def exclusive(lock_path):
    """Hold an exclusive flock on `lock_path` (nothing when None), released on leaving, even on an error.

    The release is an explicit unlock, not the file's close: vLLM forks its engine-core process while the lock is
    held, the child inherits the descriptor, and a close here would leave the lock held for the engine's whole
    life (two replicas on an H200 waited forever so)."""
    if not lock_path:
        yield
        return
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def top_logprobs(position) -> list:
    """One generated token's {token id: Logprob} as [[id, logprob], ...], best first (on equal logprobs, by
    vLLM's rank, so the token it picked comes first)."""
    def key(item):
        lp = item[1]
        return -float(getattr(lp, "logprob", lp)), getattr(lp, "rank", None) or 1 << 30

    return [[int(t), float(getattr(lp, "logprob", lp))] for t, lp in sorted((position or {}).items(), key=key)]


def warm_up(llm, prompts, batch_sizes) -> None:
    """Every batch size once with a few tokens: shapes first met here (sampler, rejection sampler, any lazily
    compiled kernel) are not paid inside the first timed run."""
    from vllm import SamplingParams

    for b in batch_sizes:
        llm.generate(prompts[:b], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)


def bench(llm, prompts, params, batch_sizes) -> list:
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
    return runs


def fastest(rounds: list) -> list:
    """Per batch size the round with the fewest seconds (greedy: every round generates the same tokens), with every
    round's seconds beside it: a neighbour's burst slows one round, not the best of them."""
    out = []
    for per_b in zip(*rounds):
        best = dict(min(per_b, key=lambda r: r["seconds"]))
        best["round_seconds"] = [r["seconds"] for r in per_b]
        out.append(best)
    return out


def main(inp: str, out: str) -> None:
    req = json.load(open(inp))
    import vllm
    from vllm import LLM, SamplingParams

    kw = dict(model=req["model"], dtype=req.get("dtype", "auto"), seed=req.get("seed", 0),
              max_model_len=req.get("max_model_len", 2048), disable_log_stats=False,
              enforce_eager=req.get("enforce_eager", True),
              gpu_memory_utilization=req.get("gpu_memory_utilization", 0.9))
    if req.get("kv_cache_memory_bytes"):
        kw["kv_cache_memory_bytes"] = int(req["kv_cache_memory_bytes"])
    if req.get("tensor_parallel_size", 1) > 1:
        kw["tensor_parallel_size"] = int(req["tensor_parallel_size"])
    if req.get("enable_expert_parallel"):
        kw["enable_expert_parallel"] = True
    if req.get("speculative_config"):
        kw["speculative_config"] = req["speculative_config"]
    t0 = time.perf_counter()
    llm = LLM(**kw)
    startup = time.perf_counter() - t0
    extra = {"logprobs": int(req["logprobs"])} if req.get("logprobs") and not req.get("batch_sizes") else {}
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=False, **extra)
    prompts = [{"prompt_token_ids": ids} for ids in req["prompts"]]
    spec = llm.llm_engine.vllm_config.speculative_config
    doc = {"vllm_version": vllm.__version__, "startup_s": startup,
           "speculative_config": None if spec is None else {
               "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
               "model": spec.model, "target": llm.llm_engine.vllm_config.model_config.model}}
    if req.get("batch_sizes"):
        t0 = time.perf_counter()
        if req.get("barrier"):
            doc["barrier_timed_out"] = wait_at_barrier(req["barrier"])
        if req.get("start_after"):
            doc["start_after_s"], doc["start_after_timed_out"] = wait_for_file(
                req["start_after"], (req.get("barrier") or {}).get("timeout_s", 900))
        rounds, waited, measured = [], 0.0, 0.0
        for r in range(max(1, int(req.get("rounds", 1)))):
            # the lock is taken per round, so the engines of a GPU take turns round by round (each timed at
            # several moments of the wave, none of them always first)
            with exclusive(req.get("measure_lock")):
                t1 = time.perf_counter()
                if r == 0:
                    warm_up(llm, prompts, req["batch_sizes"])
                rounds.append(bench(llm, prompts, params, req["batch_sizes"]))
                t2 = time.perf_counter()
            if r + 1 < int(req.get("rounds", 1)):
                time.sleep(1.0)  # flock is not fair: a pause lets an engine waiting for the lock take its turn
            waited, measured, t0 = waited + t1 - t0, measured + t2 - t1, time.perf_counter()
        doc["runs"] = fastest(rounds)
        doc.update(wait_s=waited, measure_s=measured, rounds=len(rounds))
    else:
        t0 = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        doc.update(generate_s=time.perf_counter() - t0, metrics=metrics(llm),
                   outputs=[list(r.outputs[0].token_ids) for r in results])
        if extra:
            doc["logprobs"] = [[top_logprobs(p) for p in (r.outputs[0].logprobs or [])] for r in results]
    json.dump(doc, open(out, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
