"""Runs INSIDE the vLLM environment (stdlib + vllm only): `python vllm_serve_worker.py IN.json OUT.json`.

One engine, greedy, with vLLM's own counters; used by serve-check (eyas.engines.vllm.VllmAdapter.serve) and by
the served-speedup sweep (eyas.engines.speedup, bench mode).
IN:  {"engine": {"draft": EXPORT | null, "kwargs": {LLM(**kwargs): model, dtype, seed, max_model_len,
      enforce_eager, gpu_memory_utilization, kv_cache_memory_bytes, speculative_config, tensor_parallel_size,
      enable_expert_parallel, ...}},
      "prompts": [[token ids], ...], "max_tokens": N, "logprobs": n (0: none), "stop_token_ids": [ids] (optional:
      the only tokens that end generation), and for bench mode the fields of serve_timing.py ("batch_sizes", "rounds", "barrier", "start_after", "measure_lock")}
     With a speculators export as the model, vLLM reads the verifier and K from the export's config.json: the
     zero-flag path eyas promises (vLLM locks method, model and K; a num_speculative_tokens override is ignored).
OUT: {"version", "startup_s", "speculative_config", and either (serve) "outputs": [[generated ids], ...],
      "counters": {name: value | [values]}, "generate_s", with logprobs "logprobs": per prompt, per generated
      token, [[token id, logprob], ...] best first (vLLM's top-n, plus its own token should it not be among
      them); or (bench mode) serve_timing.bench's fields.
"""

import importlib.util
import json
import os
import sys
import time

# Python puts this script's directory first on sys.path, and that directory holds eyas's own
# `engines/vllm.py` adapter, which would shadow the real vllm package. Drop it before importing vllm.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def load_timing():
    spec = importlib.util.spec_from_file_location("serve_timing", os.path.join(_HERE, "serve_timing.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def metrics(llm) -> dict:
    """vLLM's speculative-decoding counters and token counts (cumulative since the engine started)."""
    got = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode") or m.name in ("vllm:generation_tokens", "vllm:prompt_tokens"):
            got[m.name] = list(m.values) if hasattr(m, "values") and not hasattr(m, "value") else getattr(m, "value", None)
    return got


def top_logprobs(position) -> list:
    """One generated token's {token id: Logprob} as [[id, logprob], ...], best first (on equal logprobs, by
    vLLM's rank, so the token it picked comes first)."""
    def key(item):
        lp = item[1]
        return -float(getattr(lp, "logprob", lp)), getattr(lp, "rank", None) or 1 << 30

    return [[int(t), float(getattr(lp, "logprob", lp))] for t, lp in sorted((position or {}).items(), key=key)]


def main(inp: str, out: str) -> None:
    req = json.load(open(inp))
    import vllm
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(**req["engine"]["kwargs"])
    startup = time.perf_counter() - t0
    bench_mode = bool(req.get("batch_sizes"))
    extra = {"logprobs": int(req["logprobs"])} if req.get("logprobs") and not bench_mode else {}

    # eyas's stop set (eyas.target.special), when sent, is the only one: ignore_eos drops vLLM's tokenizer-side eos
    stop = req.get("stop_token_ids")
    stops = {} if stop is None else {"stop_token_ids": stop, "ignore_eos": True}

    def generate(prompts, max_tokens, **kw):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, **{"ignore_eos": False, **stops, **kw})
        return llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)

    spec = llm.llm_engine.vllm_config.speculative_config
    doc = {"version": vllm.__version__, "startup_s": startup,
           "speculative_config": None if spec is None else {
               "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
               "model": spec.model, "target": llm.llm_engine.vllm_config.model_config.model}}
    if bench_mode:
        ids = lambda prompts, n: [list(r.outputs[0].token_ids) for r in generate(prompts, n)]  # noqa: E731
        doc.update(load_timing().bench(req, ids, lambda: metrics(llm)))
    else:
        t0 = time.perf_counter()
        results = generate(req["prompts"], req["max_tokens"], **extra)
        doc.update(generate_s=time.perf_counter() - t0, counters=metrics(llm),
                   outputs=[list(r.outputs[0].token_ids) for r in results])
        if extra:
            doc["logprobs"] = [[top_logprobs(p) for p in (r.outputs[0].logprobs or [])] for r in results]
    json.dump(doc, open(out, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
