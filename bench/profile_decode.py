"""Where a speculative round's time goes on the GPU: torch.profiler over whole generations (AR baseline,
chain-3, tree), reduced per round to GPU kernel time vs gaps (GPU idle between kernels: launch,
host work, syncs), plus the top kernels. About 60-90 s on an H200:

    PYTHONPATH=src python bench/profile_decode.py --target /tmp/smol-hf --draft /tmp/draft --out profile.json

It only uses what every decoder version has (evaluate.Session, session.decoder(spec).generate, ar_generate,
and the pair loader / prompt builder under their old or new names), so putting an older eyas first on PYTHONPATH
profiles the older decoder
(the before/after of BENCHMARKS.md). CPU smoke: --device cpu --tokens 8 (no kernel times there).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from eyas.decode.bench import load_bench
from eyas.decode.session import Session

evaluate = importlib.import_module("eyas.decode.evaluate")  # the package exports a function of that name

# The decoder before issue 14 (commit 6baea35) named the pair loader and prompt builder privately.
load_pair = getattr(evaluate, "load_pair", None) or getattr(evaluate, "_load")
turn_prompt = getattr(evaluate, "turn_prompt", None) or getattr(evaluate, "_prompts")
from eyas.decode.speculative import ar_generate
from eyas.decode.tree import TreeSpec


def kernel_intervals(prof) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every device-side event (kernels, memcpy, memset)."""
    out = []
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        if dt is not None and dt != torch.autograd.DeviceType.CPU:
            out.append((e.time_range.start, e.time_range.end, e.name))
    return sorted(out)


def per_round(intervals, rounds: int, wall_s: float) -> dict:
    """Kernel time (union of busy intervals) vs gaps inside the first-to-last kernel window, per round."""
    busy, window, cur_s, cur_e = 0.0, 0.0, None, None
    for s, e, _ in intervals:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
        window = cur_e - intervals[0][0]
    n = max(1, rounds)
    names: dict[str, list[float]] = {}
    for s, e, name in intervals:
        names.setdefault(name, [0.0, 0])
        names[name][0] += e - s
        names[name][1] += 1
    top = sorted(names.items(), key=lambda kv: -kv[1][0])[:15]
    return {"rounds": rounds, "wall_ms": wall_s * 1e3 / n, "kernel_ms": busy / 1e3 / n,
            "gap_ms": (window - busy) / 1e3 / n, "kernels": len(intervals) / n,
            "busy_fraction": busy / window if window else None,
            "top_kernels": [{"name": k[:90], "ms_per_round": v[0] / 1e3 / n, "calls_per_round": v[1] / n}
                            for k, v in top]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--bench", default="spec-bench")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--tree", default="total=60,depth=7,topk=10")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    target, draft = load_pair(a.target, a.draft, a.device, None)
    qs = load_bench(a.bench, ["writing"], 1)  # positional: the keyword differs across versions
    s = Session(target, draft, qs, max_new_tokens=a.tokens, device=a.device)
    specs = {"chain-3": TreeSpec.chain(3), "tree": TreeSpec.parse(a.tree)}
    for spec in specs.values():
        s.warmup(spec)  # compile / capture outside the profile
    prompt = turn_prompt(target.tokenizer, qs[0], [])
    sync = torch.cuda.synchronize if s.device.type == "cuda" else (lambda: None)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if s.device.type == "cuda" else [])
    res = {"target": a.target, "tokens": a.tokens, "device": str(s.device), "torch": torch.__version__,
           "grouped_steps": getattr(s.runner, "grouped", False),   # EYAS_GROUPED_STEPS=1 (older eyas: no such switch)
           "switches": {k: v for k, v in os.environ.items() if k.startswith("EYAS_")}}
    jobs = [("ar", lambda: ar_generate(s.runner, prompt, a.tokens))]
    jobs += [(name, (lambda spec=spec: s.decoder(spec).generate(prompt, a.tokens))) for name, spec in specs.items()]
    for name, job in jobs:
        job()  # one unprofiled run: lazily built state (buffers, graphs) is not in the trace
        sync()
        with profile(activities=acts) as prof:
            w0 = time.perf_counter()
            out, st = job()
            sync()
            wall = time.perf_counter() - w0
        rounds = st.steps if name != "ar" else max(1, st.new_tokens - 1)
        r = per_round(kernel_intervals(prof), rounds, wall - st.t_prefill)
        if name != "ar":
            r.update(tau=st.tau, draft_ms=st.t_draft / max(1, st.steps) * 1e3,
                     verify_ms=st.t_verify / max(1, st.steps) * 1e3)
        res[name] = r
        print(f"== {name}: {rounds} rounds/steps; per round: wall {r['wall_ms']:.3f} ms, GPU kernels "
              f"{r['kernel_ms']:.3f} ms, gaps {r['gap_ms']:.3f} ms, {r['kernels']:.0f} kernels", flush=True)
        for k in r["top_kernels"][:8]:
            print(f"     {k['ms_per_round']:8.3f} ms {k['calls_per_round']:6.1f}x  {k['name']}")
        res[name]["cpu_table"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    res["seconds"] = time.perf_counter() - t0
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2))
    print(f"wrote {a.out} ({res['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
