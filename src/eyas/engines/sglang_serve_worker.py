"""Runs INSIDE the SGLang environment (stdlib + sglang only): `python sglang_serve_worker.py IN.json OUT.json`.

One offline SGLang engine, greedy, with SGLang's own per-request counters; used by serve-check
(eyas.engines.sglang.SglangAdapter.serve) and by the served-speedup sweep (eyas.engines.speedup, bench mode).
IN:  {"engine": {"draft": EXPORT | null, "kwargs": {Engine(**kwargs): model_path, dtype, random_seed,
      context_length, speculative_algorithm, speculative_draft_model_path, speculative_num_steps,
      speculative_eagle_topk, speculative_num_draft_tokens, ...}}, "prompts": [[token ids], ...], "max_tokens": N,
      "logprobs": n (0: none), and for bench mode the fields of serve_timing.py}
OUT: {"version", "startup_s", "speculative_config" (the server args it runs with), and either (serve) "outputs",
      "counters", "generate_s", with logprobs "logprobs" ([[token id, logprob], ...] per token, best first); or
      (bench mode) serve_timing.bench's fields}.
counters: totals over every request so far: spec_verify_ct (verification steps), spec_num_correct_drafts
(accepted drafted tokens, no bonus), spec_correct_drafts_histogram (steps by accepted drafts), completion_tokens.
"""

import importlib.util
import json
import os
import sys
import time

# This script's directory holds eyas's own `engines/sglang.py` adapter, which would shadow the real sglang package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

SERVER_ARGS = ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
               "speculative_eagle_topk", "speculative_num_draft_tokens", "attention_backend", "dtype", "model_path")


def load_timing():
    spec = importlib.util.spec_from_file_location("serve_timing", os.path.join(_HERE, "serve_timing.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Counters:
    """Running totals of the spec-decode fields SGLang puts in each request's meta_info."""

    def __init__(self):
        self.total = {"spec_verify_ct": 0, "spec_num_correct_drafts": 0, "completion_tokens": 0,
                      "spec_correct_drafts_histogram": []}

    def add(self, meta: dict) -> None:
        for k in ("spec_verify_ct", "spec_num_correct_drafts", "completion_tokens"):
            self.total[k] += int(meta.get(k) or 0)
        hist = self.total["spec_correct_drafts_histogram"]
        for k, n in enumerate(meta.get("spec_correct_drafts_histogram") or []):
            if k >= len(hist):
                hist.append(0)
            hist[k] += int(n)

    def __call__(self) -> dict:
        return {k: list(v) if isinstance(v, list) else v for k, v in self.total.items()}


def top_logprobs(position) -> list:
    """SGLang's [(logprob, token id, text), ...] for one token as [[id, logprob], ...], best first."""
    return [[int(t), float(lp)] for lp, t, *_ in sorted(position or [], key=lambda x: -float(x[0]))]


def main(inp: str, out: str) -> None:
    req = json.load(open(inp))
    import sglang
    from sglang.srt.entrypoints.engine import Engine

    t0 = time.perf_counter()
    engine = Engine(**req["engine"]["kwargs"])
    startup = time.perf_counter() - t0
    counters = Counters()

    def generate(prompts, max_tokens, logprobs=0):
        kw = {"return_logprob": True, "top_logprobs_num": logprobs} if logprobs else {}
        # eyas's stop ids join SGLang's own eos set (its ignore_eos would drop stop_token_ids as well)
        stop = {"stop_token_ids": req["stop_token_ids"]} if req.get("stop_token_ids") is not None else {}
        results = engine.generate(input_ids=[list(p) for p in prompts],
                                  sampling_params={"temperature": 0.0, "max_new_tokens": max_tokens, **stop}, **kw)
        for r in results:
            counters.add(r.get("meta_info") or {})
        return results

    try:
        try:
            info = engine.get_server_info()
            config = {k: info.get(k) for k in SERVER_ARGS}
        except Exception as e:  # noqa: BLE001 - what it runs with is reported, not required
            config = {"error": f"{type(e).__name__}: {e}"}
        doc = {"version": sglang.__version__, "startup_s": startup, "speculative_config": config}
        if req.get("batch_sizes"):
            ids = lambda prompts, n: [list(r["output_ids"]) for r in generate(prompts, n)]  # noqa: E731
            doc.update(load_timing().bench(req, ids, counters))
        else:
            t0 = time.perf_counter()
            results = generate(req["prompts"], req["max_tokens"], int(req.get("logprobs") or 0))
            doc.update(generate_s=time.perf_counter() - t0, counters=counters(),
                       outputs=[list(r["output_ids"]) for r in results])
            if req.get("logprobs"):
                doc["logprobs"] = [[top_logprobs(p) for p in (r["meta_info"].get("output_top_logprobs") or [])]
                                   for r in results]
    finally:
        engine.shutdown()
    json.dump(doc, open(out, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
