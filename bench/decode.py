"""Spec-Bench speculative-decoding benchmark: chain-3 and a tree vs the CUDA-graph AR baseline.

GPU (one H200; the must-show):
    python bench/decode.py --draft RUN_DIR --out bench/results/decode-h200.json
      = eyas eval --target smollm2-135m --draft RUN_DIR --bench spec-bench --max-new-tokens 512
                  --chain 3 --tree total=60,depth=7,topk=10 --device cuda  (bf16, torch.compile
                  reduce-overhead for the AR step, the verify step and every draft step)
CPU smoke of the same path:  python bench/decode.py --draft RUN_DIR --tiny --out /tmp/decode-tiny.json
Prints τ, speedup and the time breakdown (prefill / draft / verify / overhead) per setting.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eyas.decode.evaluate import EvalConfig, run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", required=True, type=Path)
    ap.add_argument("--bench", default="spec-bench")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--limit", type=int, default=None, help="questions per category (default: all)")
    ap.add_argument("--categories", nargs="+", default=None, help="only these categories (default: all 13)")
    ap.add_argument("--chain", type=int, default=3)
    ap.add_argument("--tree", default="total=60,depth=7,topk=10", help="tree spec or 'auto'")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke: 2 categories x 1 question, 16 tokens, small tree")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--plots", type=Path, default=None)
    a = ap.parse_args(argv)
    kw = dict(target=a.target, draft=a.draft, bench=a.bench, max_new_tokens=a.max_new_tokens, limit=a.limit,
              categories=a.categories,
              chain=a.chain, tree=a.tree, device=a.device, compile=a.compile, out=a.out, json=True, plots=a.plots)
    if a.tiny:
        kw.update(categories=["writing", "math_reasoning"], limit=1, max_new_tokens=16, tree="total=8,depth=4,topk=2",
                  device="cpu" if a.device == "auto" else a.device)
    out = run(EvalConfig(**kw))
    print(f"{'setting':34} {'tau':>6} {'tok/s':>8} {'AR tok/s':>9} {'speedup':>8} {'ident':>6}   time s: "
          f"prefill / draft / verify / overhead")
    for r in out["results"]:
        t = r["time_s"]
        print(f"{r['setting']:34} {r['tau']:6.2f} {r['tokens_per_s']:8.1f} {r['baseline_tokens_per_s']:9.1f} "
              f"{r['speedup']:8.2f} {r['identical_rate']:6.2f}   {t['prefill']:.1f} / {t['draft']:.1f} / "
              f"{t['verify']:.1f} / {t['overhead']:.1f}")
        print("   per category tau: " + ", ".join(f"{c}={v['tau']:.2f}" for c, v in sorted(r["per_category"].items())))
    for p in out.get("cost_model", {}).get("predicted_vs_measured", []):
        print(f"cost model {p['setting']:28} from {p.get('replayed', 'all'):28} predicted tau {p['tau']:.2f} "
              f"speedup {p['speedup']:.2f} | measured tau {p['measured_tau']:.2f} speedup {p['measured_speedup']:.2f}")
    if a.out:
        print(f"wrote {a.out}")
    else:
        json.dump(out, sys.stdout, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
