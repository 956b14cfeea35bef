"""Spec-Bench speculative-decoding benchmark: chain-3 and a tree vs the CUDA-graph AR baseline, at
T=0 (greedy, checked token-identical / tie-aware identical) and T=1 (rejection sampling).

GPU (one H200; the must-show), about 4 min with --per-category 1:
    PYTHONPATH=src python bench/decode.py --target /tmp/smol-hf --draft /tmp/draft --per-category 1 \
        --out bench/results/decode-h200.json
  = `eyas eval --chain 3 --tree total=60,depth=7,topk=10` at each temperature (bf16; the AR baseline is
  torch.compile reduce-overhead; each speculative round is two manually captured CUDA graphs around
  torch.compile'd steps: EYAS_DECODE_INNER=eager captures eager steps instead, EYAS_DECODE_GRAPHS=0 none).
CPU smoke of the same path:  python bench/decode.py --draft RUN_DIR --tiny --out /tmp/decode-tiny.json
Prints τ, speedup, and per round: draft / verify / host ms (GPU time from CUDA events; host = the rest).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eyas.decode.divergence import COUNTS, recheck_lines
from eyas.decode.evaluate import EvalConfig, run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", required=True, type=Path)
    ap.add_argument("--bench", default="spec-bench")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--per-category", type=int, default=None, help="questions per category (default: all)")
    ap.add_argument("--categories", nargs="+", default=None, help="only these categories (default: all 13)")
    ap.add_argument("--chain", type=int, default=3)
    ap.add_argument("--tree", default="total=60,depth=7,topk=10", help="tree spec or 'auto'")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="one run each (default 0 1)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke: 2 categories x 1 question, 16 tokens, small tree")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--plots", type=Path, default=None)
    recheck = EvalConfig.model_fields["recheck"]  # `eyas eval --recheck`: its default and words, from the config
    ap.add_argument("--recheck", type=int, default=recheck.default, help=recheck.description)
    a = ap.parse_args(argv)
    kw = dict(target=a.target, draft=a.draft, bench=a.bench, max_new_tokens=a.max_new_tokens, per_category=a.per_category,
              categories=a.categories,
              chain=a.chain, tree=a.tree, device=a.device, compile=a.compile, out=None, json=True, plots=a.plots,
              recheck=a.recheck)
    if a.tiny:
        kw.update(categories=["writing", "math_reasoning"], per_category=1, max_new_tokens=16, tree="total=8,depth=4,topk=2",
                  device="cpu" if a.device == "auto" else a.device)
    runs, reuse = [], {}  # one load and one compile of the target step for every temperature
    for temp in a.temperatures:
        print(f"== temperature {temp}", flush=True)
        runs.append(run(EvalConfig(**kw, temperature=temp), reuse=reuse))
        report(runs[-1])
    out = {"runs": runs, "summary": [summary(r) for o in runs for r in o["results"]]}
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {a.out}")
    else:
        json.dump(out, sys.stdout, indent=1, default=str)
    return 0


def summary(r: dict) -> dict:
    """Per-round ms (draft / verify / host) and the goals' ratios; the AR step from the baseline."""
    t, steps, d = r["time_s"], max(1, r["steps"]), r["decode"]
    # the baseline's own token count (at T=0 the same as the decoder's; at T>0 its samples end elsewhere)
    base_tokens = r["baseline_tokens_per_s"] * t["baseline_total"] or r["new_tokens"]
    ar_ms = t["baseline_total"] / max(1, base_tokens) * 1e3
    ms = {k: t[k] / steps * 1e3 for k in ("draft", "verify", "overhead")}
    return {"setting": r["setting"], "temperature": d["temperature"], "tau": r["tau"], "speedup": r["speedup"],
            "efficiency": r["speedup"] / r["tau"] if r["tau"] else None,
            "identical_rate": r.get("identical_rate"), "tie_aware_identical_rate": r.get("tie_aware_identical_rate"),
            "unexplained_divergences": r.get("unexplained_divergences"),
            **{k: r[k] for k in COUNTS if k in r},   # the recheck's verdicts (absent with --recheck 0)
            "round_ms": {"draft": ms["draft"], "verify": ms["verify"], "host": ms["overhead"]},
            "draft_level_ms": ms["draft"] / d["depth"], "ar_token_ms": ar_ms, "verify_over_ar": ms["verify"] / ar_ms}


def report(out: dict) -> None:
    print(f"{'setting':34} {'T':>4} {'tau':>6} {'tok/s':>8} {'AR tok/s':>9} {'speedup':>8} {'ident':>6} {'tie-id':>6}   "
          f"per round ms: draft / verify / host  (AR token ms)")
    for r in out["results"]:
        s = summary(r)
        rm, ident, tie = s["round_ms"], r.get("identical_rate"), r.get("tie_aware_identical_rate")
        print(f"{r['setting']:34} {s['temperature']:4.1f} {r['tau']:6.2f} {r['tokens_per_s']:8.1f} "
              f"{r['baseline_tokens_per_s']:9.1f} {r['speedup']:8.2f} {ident if ident is None else round(ident, 2)!s:>6} "
              f"{tie if tie is None else round(tie, 2)!s:>6}   {rm['draft']:.3f} / {rm['verify']:.3f} / "
              f"{rm['host']:.3f}  ({s['ar_token_ms']:.3f}); verify/AR {s['verify_over_ar']:.2f}, "
              f"level {s['draft_level_ms']:.3f} ms, efficiency {s['efficiency'] or 0:.2f}")
        print("   per category tau: " + ", ".join(f"{c}={v['tau']:.2f}" for c, v in sorted(r["per_category"].items())))
        for line in recheck_lines(r):   # unexplained divergences and their recheck verdicts (loud for "decoder")
            print("   " + line)
    for p in out.get("cost_model", {}).get("predicted_vs_measured", []):
        print(f"cost model {p['setting']:28} from {p.get('replayed', 'all'):28} predicted tau {p['tau']:.2f} "
              f"speedup {p['speedup']:.2f} | measured tau {p['measured_tau']:.2f} speedup {p['measured_speedup']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
