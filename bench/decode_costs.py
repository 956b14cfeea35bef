"""Per-round decode costs at a target shape (default Llama-3.1-8B, random weights built on meta as in
bench/capture.py) and what the cost model predicts from them: AR step, verify at W = 4/16/64, one
draft level, then speedup = τ · t_AR / t_round and efficiency = speedup / τ for an acceptance profile.

GPU (one H200), about 90 s eager (--inner compiled: plus a compile per target width, draft level width
and draft round function, ~20-40 s each):
    PYTHONPATH=src python bench/decode_costs.py --accept-from bench/results/decode-h200.json \\
        --out bench/results/decode-costs-8b.json
CPU smoke:  PYTHONPATH=src python bench/decode_costs.py --shape tiny --device cpu --out /tmp/costs.json

Each step is timed as the decoder runs it: one manually captured CUDA graph (eager or, with --inner
compiled, torch.compile'd step inside), replayed back to back; CUDA-event time per replay. The draft
(vocabulary --draft-vocab) is timed per setting: one level at the setting's width (topk; 1 for chains)
and the whole draft round (catch-up + tree levels, as SpecDecoder._draft), whose time also predicts
the round directly (`round_measured_draft_s`) beside the cost model's depth x level.
`--accept-from` takes the per-position acceptance of each setting in a bench/decode.py JSON (T=0 runs);
without it the SmolLM2 run9k profile recorded in BENCHMARKS.md is used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture import SHAPES, random_llama  # noqa: E402

from eyas.decode.costmodel import Costs  # noqa: E402
from eyas.decode.proposer import EagleProposer  # noqa: E402
from eyas.decode.target_step import TargetRunner  # noqa: E402
from eyas.decode.tree import TreeSpec  # noqa: E402
from eyas.draft.model import Eagle3Draft, draft_config_from_target  # noqa: E402
from eyas.target import default_aux_layer_ids, wrap_model  # noqa: E402

# Draft vocabulary per shape: the level's largest matmul is the draft lm_head, so a full-vocab head (128k rows
# at 8B) would price a draft nobody trains (EAGLE-3's Llama-3.1-8B drafts and eyas' default use 32k).
DRAFT_VOCAB = {"llama-3.1-8b": 32000, "smollm2-135m": 16384}

# BENCHMARKS.md, SmolLM2-135M + run9k draft, greedy (accept by position)
DEFAULT_PROFILES = {"chain-3": [0.48, 0.20, 0.08],
                    "tree(total=60,depth=7,topk=10)": [0.76, 0.52, 0.27, 0.13, 0.05, 0.01, 0.00]}


def timed(fn, device: torch.device, iters: int) -> float:
    """Seconds per call of fn as a replayed CUDA graph (CPU: eager wall time)."""
    if device.type != "cuda":
        fn()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) / iters
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / iters


def profiles(path: Path | None) -> dict[str, list[float]]:
    if path is None:
        return DEFAULT_PROFILES
    doc = json.loads(path.read_text())
    runs = doc.get("runs", [doc])
    out = {r["setting"]: r["accept_per_position"] for run in runs for r in run.get("results", [])
           if r.get("decode", {}).get("temperature", 0) <= 0 and r.get("accept_per_position")}
    if not out:
        raise ValueError(f"{path}: no T=0 results with accept_per_position (expected a bench/decode.py JSON)")
    return out


def spec_of(label: str) -> TreeSpec:
    if label.startswith("chain-"):
        return TreeSpec.chain(int(label.split("-")[1]))
    return TreeSpec.parse(label[label.index("(") + 1:label.rindex(")")])


def level_inputs(prop: EagleProposer, ctx: int, dev, dtype) -> dict:
    """One tree level's `_step` arguments: width topk (1 for chains) at scratch slots after `ctx` committed."""
    k, H = prop.spec.topk, prop.draft.config.hidden_size
    return dict(tokens=torch.zeros(k, dtype=torch.long, device=dev), hidden=torch.zeros(k, H, device=dev, dtype=dtype),
                positions=torch.full((k,), ctx, device=dev), write=prop.scratch + torch.arange(k, device=dev),
                ctx_len=torch.tensor(ctx, device=dev), anc=torch.zeros(k, prop.S, dtype=torch.bool, device=dev),
                self_mask=torch.eye(k, dtype=torch.bool, device=dev), pick=torch.arange(k, device=dev))


def draft_costs(a, draft: Eagle3Draft, dev, dtype, specs: dict[str, TreeSpec]) -> dict:
    """The draft as SpecDecoder runs it, per setting: one level at the setting's width (topk; 1 for chains)
    and the whole draft round (catch-up of 2 accepted rows + every tree level: `SpecDecoder._draft`), each
    one CUDA graph around the same functions the decoder captures (torch.compile'd with --inner compiled)."""
    ctx, cfg = a.context, draft.config
    out = {"draft_vocab": cfg.draft_vocab_size, "draft_level_s": {}, "draft_level_eager_s": {},
           "draft_round_s": {}, "draft_catchup_s": {}}
    for label, spec in specs.items():
        prop = EagleProposer(draft, spec, a.capacity)
        if a.inner == "compiled":
            prop.compile_inner()
        k = spec.topk
        with torch.no_grad():
            if k not in out["draft_level_s"]:
                lvl = level_inputs(prop, ctx, dev, dtype)
                step = torch.compile(prop._step, dynamic=False) if a.inner == "compiled" else prop._step
                out["draft_level_s"][k] = timed(lambda: step(**lvl), dev, a.iters)
                msg = f"one draft level (width {k}, {a.inner}): {out['draft_level_s'][k] * 1e3:.3f} ms"
                if a.inner == "compiled":  # what this bench timed before: the eager step in a graph
                    out["draft_level_eager_s"][k] = timed(lambda: prop._step(**lvl), dev, a.iters)
                    msg += f" (eager: {out['draft_level_eager_s'][k] * 1e3:.3f} ms)"
                print(msg, flush=True)
            # the committed context's draft KV (eager prefill), then a round that accepted 1 token (m = 2)
            aux = torch.randn(ctx, cfg.num_aux, cfg.target_hidden_size, device=dev, dtype=dtype)
            prop.observe([0] * (ctx + 1), aux, 0)
            keep = torch.randn(spec.depth + 1, cfg.num_aux, cfg.target_hidden_size, device=dev, dtype=dtype)
            emitted = torch.zeros(spec.depth + 1, dtype=torch.long, device=dev)
            start, m, L = (torch.tensor(x, device=dev) for x in (ctx - 1, 2, ctx + 1))
            seq = torch.zeros(a.capacity + spec.depth + 2, dtype=torch.long, device=dev)
            catchup = lambda: prop.catchup(keep, emitted, start, m)
            out["draft_catchup_s"][label] = timed(catchup, dev, a.iters)
            out["draft_round_s"][label] = timed(lambda: (catchup(), prop.draft_tree(L, seq)), dev, a.iters)
        per = (out["draft_round_s"][label] - out["draft_catchup_s"][label]) / max(1, spec.depth - 1)
        print(f"draft round {label}: {out['draft_round_s'][label] * 1e3:.3f} ms (catch-up "
              f"{out['draft_catchup_s'][label] * 1e3:.3f} ms + {spec.depth - 1} levels at {per * 1e3:.3f} ms)", flush=True)
    return out


def run(a) -> dict:
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    model = random_llama(SHAPES[a.shape], dev, dtype, "sdpa")
    layout = wrap_model(model).layout
    aux = default_aux_layer_ids(layout.num_layers)
    vd = a.draft_vocab or DRAFT_VOCAB.get(a.shape, model.config.vocab_size)
    draft = Eagle3Draft(draft_config_from_target(model.config, aux_layer_ids=aux, draft_vocab_size=vd))
    draft = draft.to(dev, dtype).eval()
    runner = TargetRunner(model, layout, aux, a.capacity, min_bucket=a.min_bucket)
    if a.inner == "compiled":
        runner.compile_inner()
    print(f"built {a.shape} on {dev} in {time.perf_counter() - t0:.1f} s", flush=True)
    ctx = a.context
    with torch.no_grad():  # fill the context once (eager prefill), as a real decode would have
        ar = torch.arange(ctx, device=dev)
        runner.step(torch.zeros(ctx, dtype=torch.long, device=dev), ar, ar, torch.tensor(0, device=dev),
                    torch.ones(ctx, ctx, dtype=torch.bool, device=dev).tril(), eager=True)
    res = {"shape": a.shape, "device": str(dev), "dtype": str(dtype), "context": ctx, "inner": a.inner,
           "kv_buckets": list(runner.buckets), "verify_s": {}, "torch": torch.__version__}
    for W in [1] + a.widths:
        toks = torch.zeros(W, dtype=torch.long, device=dev)
        pos = torch.full((W,), ctx, device=dev) + torch.arange(W, device=dev).clamp(max=6)
        slots = torch.arange(ctx, ctx + W, device=dev)
        anc = torch.ones(W, W, dtype=torch.bool, device=dev).tril()
        ctx_t = torch.tensor(ctx, device=dev)
        with torch.no_grad():
            kv = runner.bucket(ctx + W)  # as the decoders choose it
            t = timed(lambda: runner.inner_step(toks, pos, slots, ctx_t, anc, kv), dev, a.iters)
        res["verify_s"][W] = t
        print(f"target step W={W:3d}: {t * 1e3:.3f} ms (attending over {kv} KV slots)", flush=True)
    res["ar_step_s"] = res["verify_s"].pop(1)
    specs = {label: spec_of(label) for label in profiles(a.accept_from)}
    res.update(draft_costs(a, draft, dev, dtype, specs))
    costs = Costs(ar_step=res["ar_step_s"], verify={w: t for w, t in res["verify_s"].items()},
                  level=dict(res["draft_level_s"]), overhead=a.host_ms / 1e3)
    res["costs"] = costs.to_dict()
    res["predictions"] = []
    for label, acc in profiles(a.accept_from).items():
        s = specs[label]
        tau = 1.0 + sum(acc)
        t_round = costs.round_time(s)  # the cost model: depth levels (the catch-up priced as one)
        speedup = tau * costs.ar_step / t_round
        pred = {"setting": label, "accept_per_position": acc, "tau": tau, "round_s": t_round,
                "speedup": speedup, "efficiency": speedup / tau}
        if label in res["draft_round_s"]:  # the draft as measured whole (catch-up + tree), same verify and host
            t_meas = res["draft_round_s"][label] + costs.verify_time(s.total + 1) + costs.overhead
            pred.update(round_measured_draft_s=t_meas, speedup_measured_draft=tau * costs.ar_step / t_meas,
                        efficiency_measured_draft=costs.ar_step / t_meas)
        res["predictions"].append(pred)
        print(f"predicted {label:32} tau {tau:.2f}  round {t_round * 1e3:.2f} ms  speedup {speedup:.2f}x  "
              f"efficiency {speedup / tau:.2f}" + (f"  (measured draft round: {pred['speedup_measured_draft']:.2f}x, "
                                                   f"efficiency {pred['efficiency_measured_draft']:.2f})"
                                                   if "round_measured_draft_s" in pred else ""), flush=True)
    res["shallower_trees"] = shallower(profiles(a.accept_from), specs, costs)
    res["seconds"] = time.perf_counter() - t0
    return res


def shallower(profs: dict[str, list[float]], specs: dict[str, TreeSpec], costs: Costs) -> list[dict]:
    """Each recorded tree cut to depth d < its own: its first d acceptance positions are exactly what the cut
    tree accepts when it keeps the same nodes, and a lower bound when the freed node budget widens the shallow
    levels — so these speedups are lower bounds too. At a large target every level costs a weight read, and the
    deep levels' acceptance (here a few %) no longer pays for them."""
    out = []
    for label, acc in profs.items():
        s = specs[label]
        for d in range(2, s.depth):
            cut = TreeSpec(total=min(s.total, s.topk + (d - 1) * s.topk ** 2), depth=d, topk=s.topk)
            tau = 1.0 + sum(acc[:d])
            t_round = costs.round_time(cut)
            speedup = tau * costs.ar_step / t_round
            out.append({"from": label, "depth": d, "tau_lower_bound": tau, "round_s": t_round,
                        "speedup_lower_bound": speedup, "efficiency": speedup / tau})
            print(f"  {label} cut to depth {d}: tau >= {tau:.2f}  round {t_round * 1e3:.2f} ms  "
                  f"speedup >= {speedup:.2f}x  efficiency {speedup / tau:.2f}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--device", default=None)
    ap.add_argument("--inner", default="eager", choices=["eager", "compiled"],
                    help="what the CUDA graph captures (compiled: + compile time per width)")
    ap.add_argument("--widths", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="draft lm_head rows (default: 32000 at 8B as EAGLE-3's Llama-3.1 drafts, 16384 at SmolLM2 "
                         "as the run9k draft, else the target's vocabulary)")
    ap.add_argument("--context", type=int, default=512, help="committed tokens in the KV cache")
    ap.add_argument("--capacity", type=int, default=1024)
    ap.add_argument("--min-bucket", type=int, default=256, help="smallest KV bucket (>= capacity: no bucketing)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--host-ms", type=float, default=0.2, help="per-round host time for the prediction (goal 0.2)")
    ap.add_argument("--accept-from", type=Path, default=None, help="bench/decode.py JSON (T=0 acceptance)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    res = run(a)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1, default=str))
    print(f"wrote {a.out} ({res['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
