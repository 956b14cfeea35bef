"""Runs INSIDE the vLLM environment (stdlib + vllm only): `python vllm_bench_worker.py IN.json OUT.json`.

Times greedy generation in vLLM at several batch sizes with one engine: the tokens/s eyas reports as vLLM's
speed with and without an EAGLE-3 draft (`eyas.engines.vllm_speedup` builds the payload and the report).

IN:  {"model": DIR, "speculative_config": {...} | null, "prompts": [[token ids], ...], "max_tokens": N,
      "batch_sizes": [1, 8, 32], "dtype": "bfloat16", "max_model_len": N, "enforce_eager": false, "seed": 0}
     With a speculators export as "model", vLLM reads the verifier and K from the export (the zero-flag path);
     speculative_config may override K ({"num_speculative_tokens": K}).
OUT: {"vllm_version", "startup_s", "speculative_config", "runs": [{"batch_size", "seconds", "generated_tokens",
      "requests", "metrics": {name: value | [values]} (deltas over this run), "outputs": [[ids], ...]}]}
"""

import json
import os
import sys
import time

# This script's directory holds eyas's own `engines/vllm.py` adapter, which would shadow the real vllm package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

SPEC_METRICS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos",
                "vllm:generation_tokens", "vllm:prompt_tokens")


def snapshot(llm) -> dict:
    got = {}
    for m in llm.get_metrics():
        if m.name in SPEC_METRICS:
            got[m.name] = list(m.values) if hasattr(m, "values") and not hasattr(m, "value") else getattr(m, "value", 0)
    return got


def delta(after: dict, before: dict) -> dict:
    out = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, list):
            b = b or [0] * len(v)
            out[k] = [x - y for x, y in zip(v, b)]
        else:
            out[k] = v - (b or 0)
    return out


def main(inp: str, out: str) -> None:
    req = json.load(open(inp))
    import vllm
    from vllm import LLM, SamplingParams

    kw = dict(model=req["model"], dtype=req.get("dtype", "bfloat16"), seed=req.get("seed", 0),
              max_model_len=req.get("max_model_len", 2048), disable_log_stats=False,
              enforce_eager=req.get("enforce_eager", False))
    if req.get("speculative_config"):
        kw["speculative_config"] = req["speculative_config"]
    t0 = time.perf_counter()
    llm = LLM(**kw)
    startup = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=False)
    prompts = [{"prompt_token_ids": ids} for ids in req["prompts"]]
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    runs = []
    for b in req["batch_sizes"]:
        before = snapshot(llm)
        outputs, t0 = [], time.perf_counter()
        for i in range(0, len(prompts), b):  # b requests in flight at a time: batch size b
            outputs += [list(r.outputs[0].token_ids) for r in llm.generate(prompts[i:i + b], params, use_tqdm=False)]
        seconds = time.perf_counter() - t0
        runs.append({"batch_size": b, "seconds": seconds, "requests": len(outputs),
                     "generated_tokens": sum(len(o) for o in outputs), "metrics": delta(snapshot(llm), before),
                     "outputs": outputs})
        print(f"batch {b}: {runs[-1]['generated_tokens'] / seconds:.1f} tok/s", flush=True)
    spec = llm.llm_engine.vllm_config.speculative_config
    json.dump({"vllm_version": vllm.__version__, "startup_s": startup, "runs": runs,
               "speculative_config": None if spec is None else {
                   "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
                   "model": spec.model}}, open(out, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
