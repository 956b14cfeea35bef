"""eyas's autoregressive baseline against vLLM's, at batch 1, on the same prompts and GPU.

    PYTHONPATH=src python bench/ar_pace.py --target qwen2.5-coder-1.5b --device cuda --per-category 2 \
        --max-new-tokens 256 --vllm-python /tmp/vpy --out ar_pace.json

Both sides generate greedily from the first turn of `--per-category` Spec-Bench questions per category (chat
template), one request at a time, stopping at EOS or `--max-new-tokens`, and report generated tokens / wall seconds
with prefill included (what vLLM's `LLM.generate` at batch 1 costs a user); eyas's decode-only rate and its prefill
of a `--prefill-tokens` prompt (median of 5) are reported beside it, with a profile of one more prefill (the ops
that take its time, by device and by host time: where a prefill's milliseconds go); on the GPU the same for the
eager prefill that the graphed one replaces (`eager_*`), and a profile of 64 decoded tokens (device time and kernels
per token: what a decode step is made of). vLLM runs in its own environment (one engine,
`eyas.engines.speedup.measure` with no drafts) after eyas has released the GPU's memory.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def prompts_for(tokenizer, bench: str, per_category: int) -> list[list[int]]:
    from eyas.decode.bench import load_bench
    from eyas.decode.session import turn_prompt

    return [turn_prompt(tokenizer, {"turns": q["turns"][:1]}, []) for q in load_bench(bench, None, per_category)]


def _as_list(x) -> list:
    return [] if x is None else list(x) if isinstance(x, (list, tuple, set)) else [x]


def time_prefill(runner, prompt: list[int]) -> float:
    """Seconds of one prefill of `prompt` as the decoders run it (eyas.decode.prefill: CUDA graphs of padded
    chunks on the GPU unless EYAS_PREFILL_GRAPHS=0, eager at the prompt's length elsewhere)."""
    from eyas.decode.prefill import prefill

    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    prefill(runner, prompt)
    sync()
    return time.perf_counter() - t


def profile_call(fn, device: torch.device, top: int = 15) -> dict:
    """fn() under torch.profiler: its wall ms, the summed device (CUDA) and host self times, and the `top` ops by
    each (kernels inside replayed CUDA graphs included)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        wall = fn()
    ev = prof.key_averages()
    dev = [e for e in ev if getattr(e, "self_device_time_total", 0) > 0]

    def rows(key):
        return [{"op": e.key, "calls": e.count, "ms": round(getattr(e, key) / 1e3, 3)}
                for e in sorted(ev, key=lambda e: -getattr(e, key, 0))[:top] if getattr(e, key, 0) > 0]

    return {"wall_ms": round(1e3 * wall, 3), "ops": sum(e.count for e in ev if e.key.startswith("aten::")),
            "kernels": sum(e.count for e in dev),
            "device_ms": round(sum(e.self_device_time_total for e in dev) / 1e3, 3),
            "host_self_ms": round(sum(e.self_cpu_time_total for e in ev) / 1e3, 3),
            "by_device": rows("self_device_time_total") if dev else [], "by_host": rows("self_cpu_time_total")}


def profile_prefill(runner, prompt: list[int], top: int = 15) -> dict:
    """One prefill under the profiler (`profile_call`): where a prefill's milliseconds go."""
    return profile_call(lambda: time_prefill(runner, prompt), runner.device, top)


def profile_decode(runner, prompt: list[int], tokens: int = 64, top: int = 15) -> dict:
    """One generation of `tokens` tokens (no EOS) under the profiler, prefill included, and its device time and
    kernel count per decoded token: what a decode step is made of."""
    from eyas.decode.speculative import ar_generate

    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)

    def run() -> float:
        sync()
        t = time.perf_counter()
        ar_generate(runner, prompt, tokens, eos_ids=())
        sync()
        return time.perf_counter() - t
    prof = profile_call(run, runner.device, top)
    return {**prof, "tokens": tokens, "device_ms_per_token": round(prof["device_ms"] / tokens, 4),
            "kernels_per_token": round(prof["kernels"] / tokens, 1)}


def eyas_ar(target, prompts: list[list[int]], max_new: int, prefill_tokens: int, compile_: bool) -> dict:
    from eyas.aux_layers import default_aux_layer_ids
    from eyas.decode.speculative import ar_generate, warm_ar
    from eyas.decode.target_step import TargetRunner

    capacity = max(max(len(p) for p in prompts) + max_new, prefill_tokens) + 64
    runner = TargetRunner(target.model, target.layout, default_aux_layer_ids(target.layout.num_layers), capacity,
                          min_bucket=1024)
    t0 = time.perf_counter()
    if compile_:
        runner.compile_inner()
    eos = {target.tokenizer.eos_token_id} | set(_as_list(getattr(target.model.generation_config, "eos_token_id", None)))
    eos.discard(None)
    for _ in range(2):
        ar_generate(runner, prompts[0], 16, eos_ids=())
    warm_ar(runner)
    warm_s = time.perf_counter() - t0
    gen = tot = dec = 0.0
    n_tok = 0
    for p in prompts:
        out, st = ar_generate(runner, p, max_new, eos_ids=eos)
        n_tok += st.new_tokens
        tot += st.t_total
        dec += st.t_total - st.t_prefill
        gen += st.new_tokens - 1
    long = torch.randint(0, target.layout.vocab_size, (prefill_tokens,), generator=torch.Generator().manual_seed(0))
    prefill = {"tokens": prefill_tokens, "graphed": runner.graph_prefill}
    modes = [("", runner.graph_prefill)] + ([("eager_", False)] if runner.graph_prefill else [])
    for tag, graphed in modes:   # the decoders' prefill, then (on the GPU) the eager one it replaces, same process
        runner.graph_prefill = graphed
        times = [time_prefill(runner, long.tolist()) for _ in range(6)]
        prefill.update({f"{tag}median": 1e3 * statistics.median(times[1:]),
                        f"{tag}all": [round(1e3 * x, 3) for x in times],
                        f"{tag}profile": profile_prefill(runner, long.tolist())})
    runner.graph_prefill = modes[0][1]
    return {"tok_s": n_tok / tot, "decode_tok_s": gen / dec, "ms_per_token_decode": 1e3 * dec / gen,
            "generated_tokens": n_tok, "seconds": tot, "warm_s": warm_s, "prefill_ms": prefill,
            "decode_profile": profile_decode(runner, prompts[0])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--bench", default="spec-bench")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--prefill-tokens", type=int, default=1024)
    ap.add_argument("--no-compile", action="store_true", help="eager target step (diagnosis)")
    ap.add_argument("--vllm-python", default=None, help="vLLM's interpreter: also time vLLM's AR (one engine)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from eyas.decode.evaluate import hardware
    from eyas.target import load_target

    target = load_target(a.target, dtype=torch.bfloat16, device=a.device)
    prompts = prompts_for(target.tokenizer, a.bench, a.per_category)
    from eyas import env
    doc = {"target": a.target, "hardware": hardware(torch.device(a.device)), "switches": env.changed(),
           "prompts": len(prompts),
           "max_new_tokens": a.max_new_tokens, "batch_size": 1,
           "eyas": eyas_ar(target, prompts, a.max_new_tokens, a.prefill_tokens, not a.no_compile)}
    print(json.dumps(doc["eyas"]), flush=True)
    out = Path(a.out)
    out.write_text(json.dumps(doc, indent=1))
    if a.vllm_python:
        from eyas.engines.adapters import ADAPTERS
        from eyas.engines.speedup import measure

        model_dir = target.source.path
        del target
        gc.collect()
        torch.cuda.empty_cache()
        res = measure(ADAPTERS["vllm"](a.vllm_python), model_dir, "", prompts, [], [1], a.max_new_tokens, ["0"],
                      out.with_suffix(".logs"))
        doc["vllm"] = {"tok_s": res["base_tok_s"].get("1"), "version": res.get("engine_version"),
                       "failed": res.get("failed"), "engines": res.get("engines")}
        if doc["vllm"]["tok_s"]:
            doc["eyas_over_vllm"] = doc["eyas"]["tok_s"] / doc["vllm"]["tok_s"]
        out.write_text(json.dumps(doc, indent=1))
        print(json.dumps({k: doc[k] for k in ("vllm", "eyas_over_vllm") if k in doc}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
