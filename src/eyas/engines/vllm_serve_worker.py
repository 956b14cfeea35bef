"""Runs INSIDE the vLLM environment (stdlib + vllm only): `python vllm_serve_worker.py IN.json OUT.json`.

IN:  {"model": DIR, "speculative_config": {...} | null, "prompts": [[token ids], ...], "max_tokens": N,
      "dtype": "auto"|"float32"|..., "max_model_len": N, "seed": 0}
     With a speculators export as "model" and no speculative_config, vLLM reads the verifier and K from the
     export's config.json: the zero-flag path eyas promises. speculative_config, when given, is merged into
     what the export dictates (vLLM locks method and model).
OUT: {"vllm_version", "outputs": [[generated ids], ...], "metrics": {name: value | [values]},
      "startup_s", "generate_s", "speculative_config"}
"""

import json
import os
import sys
import time

# Python puts this script's directory first on sys.path, and that directory holds eyas's own
# `engines/vllm.py` adapter, which would shadow the real vllm package. Drop it before importing vllm.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def main(inp: str, out: str) -> None:
    req = json.load(open(inp))
    import vllm
    from vllm import LLM, SamplingParams

    kw = dict(model=req["model"], dtype=req.get("dtype", "auto"), seed=req.get("seed", 0),
              max_model_len=req.get("max_model_len", 2048), disable_log_stats=False, enforce_eager=True)
    if req.get("speculative_config"):
        kw["speculative_config"] = req["speculative_config"]
    t0 = time.perf_counter()
    llm = LLM(**kw)
    startup = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=False)
    prompts = [{"prompt_token_ids": ids} for ids in req["prompts"]]
    t0 = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    generate = time.perf_counter() - t0
    metrics = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode") or m.name in ("vllm:generation_tokens", "vllm:prompt_tokens"):
            metrics[m.name] = list(m.values) if hasattr(m, "values") and not hasattr(m, "value") else getattr(m, "value", None)
    spec = llm.llm_engine.vllm_config.speculative_config
    doc = {"vllm_version": vllm.__version__, "outputs": [list(r.outputs[0].token_ids) for r in results],
           "metrics": metrics, "startup_s": startup, "generate_s": generate,
           "speculative_config": None if spec is None else {
               "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
               "model": spec.model, "target": llm.llm_engine.vllm_config.model_config.model}}
    json.dump(doc, open(out, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
