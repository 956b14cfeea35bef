"""Where a speculative round's time goes on the GPU: graph-replay cost of one target step per width,
and a torch.profiler table over whole chain / tree generations.

    python bench/profile_decode.py --target T --draft RUN --bench spec-bench --out profile.json

Prints the tables; writes the per-width step times (ms) and the profiler's top ops as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from eyas.decode.bench import load_bench
from eyas.decode.evaluate import Session, _load, _prompts
from eyas.decode.tree import TreeSpec


def step_ms(runner, width: int, ctx: int, iters: int = 50) -> float:
    """Mean ms of runner.step at `width` tokens with device-resident inputs (pure replay + launch)."""
    dev = runner.device
    toks = torch.zeros(width, dtype=torch.long, device=dev)
    pos = torch.arange(ctx, ctx + width, device=dev)
    anc = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
    ctx_len = torch.tensor(ctx, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(3):
        runner.step(toks, pos, pos, ctx_len, anc)
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        runner.step(toks, pos, pos, ctx_len, anc)
    sync()
    return (time.perf_counter() - t) / iters * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--bench", default="spec-bench")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    target, draft = _load(a.target, a.draft, a.device, None)
    qs = load_bench(a.bench, ["writing"], limit=1)
    s = Session(target, draft, qs, max_new_tokens=a.tokens, device=a.device)
    specs = {"chain-3": TreeSpec.chain(3), "tree": TreeSpec.parse("total=60,depth=7,topk=10")}
    for spec in specs.values():
        s.warmup(spec)
    res = {"step_ms": {w: step_ms(s.runner, w, 200, 50 if a.device == 'cuda' else 2)
                      for w in (1, 4, 61)}}
    print("graph step ms by width:", res["step_ms"])
    prompt = _prompts(target.tokenizer, qs[0], [])
    from torch.profiler import ProfilerActivity, profile
    for name, spec in specs.items():
        dec = s.decoder(spec)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out, st = dec.generate(prompt, a.tokens)
        rounds = max(1, st.steps)
        print(f"== {name}: {st.steps} rounds, draft {st.t_draft / rounds * 1e3:.2f} ms, "
              f"verify {st.t_verify / rounds * 1e3:.2f} ms per round")
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
        print(table)
        res[name] = {"rounds": st.steps, "draft_ms": st.t_draft / rounds * 1e3,
                     "verify_ms": st.t_verify / rounds * 1e3, "table": table}
    a.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
