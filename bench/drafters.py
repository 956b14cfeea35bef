"""Parallel drafters beside EAGLE-3 (issue 39): eagle3, p-eagle and dflash trained on the same PREPARED rows at equal
data and at equal GPU-minutes, each measured on Spec-Bench (chain and tree τ, native speedup over the AR baseline)
and served by vLLM (speedup over vLLM's own AR at batch 1 / 8 / 32 on the same prompts). One resumable command:

    PYTHONPATH=src python bench/drafters.py --target /tmp/smol-hf --prepared /tmp/best_draft/prep --work /tmp/drafters \
        --budget-s 540 --out $OUT/drafters.json          # repeat the same command until it prints "all steps done"
    PYTHONPATH=src python bench/drafters.py --tiny --target T --prepared P --work /tmp/dr --out /tmp/dr.json  # CPU

Steps (each recorded done in WORK/state.json; one cut by --budget-s continues next call: training resumes from its
last checkpoint, an eval or a served sweep starts only when its estimated seconds are left):
  train:KIND:data   online `eyas train --draft-kind KIND` for --epochs over PREPARED (equal data); its GPU seconds
                    are the wall seconds of every call it ran in (WORK/state.json "seconds")
  train:KIND:time   the same rows, --steps = train:eagle3:data's seconds (or --time-budget-s) / this kind's seconds
                    per step in its equal-data run (equal GPU-minutes); skipped for eagle3 (its data run is that)
  eval:KIND:REGIME  `eyas eval` on Spec-Bench: chain --eval-chain (parallel kinds: --eval-chain-parallel, default the
                    trained tokens: one forward drafts them all) and tree --eval-tree (every kind the same questions
                    and one cached AR baseline); dflash trees are at most its block's masks deep
  serve:KIND        `eyas export` of the equal-data run at each chain of --serve-chains (eagle3) or
                    --serve-chains-parallel (p-eagle, dflash; at most the trained tokens), then vLLM's speedup sweep
                    (eyas.engines.vllm_speedup: the plain target and each export, batch --batch-sizes)
  check:KIND        `eyas serve-check` of the export at the kind's native chain: served τ against native chain τ on
                    the same prompts (the issue's 5%), vLLM's greedy outputs against the target's
Per row of the JSON: kind, regime, training tokens and steps, GPU seconds, held-out simulated τ, Spec-Bench chain/tree
τ, speedup, tok/s and identical rate; "served" per kind; "goals" the issue's ratios against EAGLE-3 (best parallel
tree τ / EAGLE-3 tree τ >= 1.2, native speedup >= 1.3x, served batch-1 speedup >= 1.3x) at equal data and at equal time.
Kind-specific training flags: --kind-args "p-eagle=--lr 6e-4" (repeatable); the published recipes' layer counts,
loss decays and sampling are the kinds' defaults (eyas.draft.kinds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
import scaling as S  # noqa: E402
from _emit import emit  # noqa: E402

KINDS = ("eagle3", "p-eagle", "dflash")
REGIMES = ("data", "time")


def metrics(run: Path) -> list[dict]:
    m = run / "metrics.jsonl"
    return [json.loads(x) for x in m.read_text().splitlines() if x.strip()] if m.is_file() else []


def kind_args(a, kind: str) -> list[str]:
    return [x for spec in a.kind_args if spec.split("=", 1)[0] == kind for x in spec.split("=", 1)[1].split()]


def train(r: S.Runner, a, kind: str, regime: str, steps: int | None = None) -> bool:
    from eyas.train.checkpoint import latest_checkpoint

    run = a.work / f"run-{kind}-{regime}"
    cont = ["--resume"] if latest_checkpoint(run) else ["--overwrite"] if (run / "metrics.jsonl").exists() else []
    length = ["--steps", str(steps)] if steps else ["--epochs", str(a.epochs)]
    return r.eyas(f"train:{kind}:{regime}", "train", "--online", "--target", a.target, "--data", str(a.prepared),
                  "--out", str(run), "--draft-kind", kind, "--ttt-steps", str(a.ttt), *length, "--batch-size",
                  str(a.batch), "--lr", str(a.lr), "--seed", "0", "--device", a.device, "--save-every",
                  str(a.save_every), "--eval-every", str(a.eval_every), "--eval-batches", str(a.eval_batches),
                  "--no-progress", "--no-tensorboard", *cont, *a.train_args.split(), *kind_args(a, kind),
                  need=a.train_need)


def time_steps(r: S.Runner, a, kind: str) -> int:
    """Optimizer steps that give KIND the equal-time budget at its own measured seconds per step."""
    budget = a.time_budget_s or r.seconds("train:eagle3:data")
    steps = metrics(a.work / f"run-{kind}-data")[-1]["step"]
    return max(1, round(budget / (r.seconds(f"train:{kind}:data") / steps)))


def evaluate(r: S.Runner, a, kind: str, regime: str) -> bool:
    seen = [t for k, t in r.state["done"].items() if k.startswith("eval:")]
    need = min(1.5 * max(seen), 0.9 * a.budget_s) if seen else a.eval_est_s
    flags = S.eval_flags(a)
    if kind != "eagle3":
        flags[flags.index("--chain") + 1] = str(a.eval_chain_parallel or a.ttt)
    return r.eyas(f"eval:{kind}:{regime}", "eval", "--draft", str(a.work / f"run-{kind}-{regime}"), *flags,
                  "--temperature", "0", "--out", str(a.work / f"eval-{kind}-{regime}.json"), "--baseline-cache",
                  str(a.work / "baseline-cache"), need=need)


def serve(r: S.Runner, a, kind: str) -> bool:
    """Exports at each chain, then one vLLM sweep (the plain target and each export) in this process."""
    name = f"serve:{kind}"
    if name in r.state["done"]:
        return True
    chains = a.serve_chains if kind == "eagle3" else [k for k in a.serve_chains_parallel if k <= a.ttt]
    for k in chains:
        if not r.eyas(f"export:{kind}:k{k}", "export", "--draft", str(a.work / f"run-{kind}-data"), "--out",
                      str(a.work / f"export-{kind}-k{k}"), "--chain", str(k)):
            return False
    if r.left() < a.serve_need:
        print(f"-- {name}: needs ~{a.serve_need:.0f} s, {r.left():.0f} s left; the next call runs it", flush=True)
        return False
    from eyas.engines.base import engine_python
    from eyas.engines.vllm import ENV_VAR, HOW_TO_CREATE
    from eyas.engines.vllm_speedup import measure

    r.ran.append(name)
    t = time.perf_counter()
    res = measure(engine_python(a.python, ENV_VAR, HOW_TO_CREATE), a.target, str(a.work / f"export-{kind}-k{{k}}"),
                  prompts(a), chains, a.batch_sizes, a.serve_max_new_tokens, a.gpus, a.work / f"serve-{kind}.logs",
                  engines_per_gpu=a.engines_per_gpu, rounds=a.serve_rounds)
    (a.work / f"serve-{kind}.json").write_text(json.dumps(res, indent=1))
    r.count(name, time.perf_counter() - t, not res["failed"])
    if res["failed"]:
        raise SystemExit(f"{name}: engines failed: {sorted(res['failed'])}; see {a.work / f'serve-{kind}.logs'}")
    r.state["done"][name] = round(time.perf_counter() - t, 1)
    r.save()
    return True


def serve_check(r: S.Runner, a, kind: str) -> bool:
    k = a.eval_chain if kind == "eagle3" else (a.eval_chain_parallel or a.ttt)
    export = a.work / f"export-{kind}-k{k}"
    if not r.eyas(f"export:{kind}:k{k}", "export", "--draft", str(a.work / f"run-{kind}-data"), "--out", str(export),
                  "--chain", str(k)):
        return False
    cats = ["--categories", *a.eval_categories.split(",")] if a.eval_categories else []
    return r.eyas(f"check:{kind}", "serve-check", "--draft", str(export), "--engine", "vllm",
                  *(["--python", a.python] if a.python else []), "--per-category", str(a.serve_per_category), *cats,
                  "--max-new-tokens", str(a.serve_max_new_tokens), "--out", str(a.work / f"check-{kind}.json"),
                  "--tolerance", "1.0",   # a gap is a finding (judged at 5% in the result), not a failed step
                  need=a.serve_need)


def prompts(a) -> list[list[int]]:
    """The served sweep's prompts: the first turn of --serve-per-category Spec-Bench questions a category."""
    from transformers import AutoTokenizer

    from eyas.decode.bench import load_bench
    from eyas.decode.evaluate import turn_prompt

    tok = AutoTokenizer.from_pretrained(a.target)
    return [turn_prompt(tok, q, []) for q in load_bench(a.bench, None, a.serve_per_category)]


def run_steps(r: S.Runner, a) -> None:
    for kind in a.kinds:
        if not train(r, a, kind, "data"):
            return
    for kind in a.kinds:
        if "time" in a.regimes and kind != "eagle3" and not train(r, a, kind, "time", time_steps(r, a, kind)):
            return
    for kind in a.kinds:
        for regime in a.regimes:
            if (kind, regime) != ("eagle3", "time") and not evaluate(r, a, kind, regime):
                return
    for kind in a.kinds if a.serve else ():
        if not serve(r, a, kind) or not serve_check(r, a, kind):
            return


def row(r: S.Runner, a, kind: str, regime: str) -> dict | None:
    src = "data" if (kind, regime) == ("eagle3", "time") else regime   # eagle3's data run sets the time budget
    run, m = a.work / f"run-{kind}-{src}", metrics(a.work / f"run-{kind}-{src}")
    trains = [x for x in m if x["split"] == "train"]
    if f"train:{kind}:{src}" not in r.state["done"] or not trains:
        return None
    evals = [x for x in m if x["split"] == "eval"]
    out = {"kind": kind, "regime": regime, "run": str(run), "train_steps": trains[-1]["step"],
           "train_tokens": round(trained_tokens(a)) if src == "data" else None,
           "train_gpu_s": r.seconds(f"train:{kind}:{src}"),
           "heldout_tau": evals[-1]["tau"] if evals else None, "heldout_acc": evals[-1]["acc"] if evals else None}
    if src == "time":   # the tokens its steps saw: the equal-data run's tokens per step
        per_step = trained_tokens(a) / metrics(a.work / f"run-{kind}-data")[-1]["step"]
        out["train_tokens"] = round(per_step * out["train_steps"])
    check = a.work / f"check-{kind}.json"
    if regime == "data" and check.is_file():
        c = json.loads(check.read_text())
        out["served_check"] = {k: c.get(k) for k in ("chain", "served_tau", "native_tau", "relative_gap",
                                                     "served_identical_to_target_greedy")}
        out["served_check"]["within_5pct"] = c.get("relative_gap") is not None and c["relative_gap"] <= 0.05
    ev = a.work / f"eval-{kind}-{src}.json"
    if ev.is_file():
        keep = ("setting", "tau", "accept_per_position", "speedup", "tokens_per_s", "baseline_tokens_per_s",
                "identical_rate")
        res = json.loads(ev.read_text())["results"]
        out["chain"], out["tree"] = ({k: x[k] for k in keep} for x in res[:2])
    return out


def trained_tokens(a) -> float:
    """Tokens an equal-data run trains on: --epochs over the training split (95% of the PREPARED rows)."""
    return S.prep_summary(a.prepared).get("tokens", 0) * a.epochs * 0.95


def ratio(x, y):
    return round(x / y, 3) if x is not None and y else None


def goals(rows: list[dict], served: dict) -> dict:
    """The issue's ratios of the best parallel draft against EAGLE-3, per regime and in vLLM."""
    out = {}
    for regime in REGIMES:
        by = {x["kind"]: x for x in rows if x["regime"] == regime and "tree" in x}
        base, par = by.get("eagle3"), [x for k, x in by.items() if k != "eagle3"]
        if base and par:
            best = max(par, key=lambda x: x["tree"]["tau"])
            fast = max(par, key=lambda x: max(x["tree"]["speedup"], x["chain"]["speedup"]))
            sp = lambda x: max(x["tree"]["speedup"], x["chain"]["speedup"])  # noqa: E731
            out[regime] = {"best_tree_tau_kind": best["kind"],
                           "tree_tau_ratio": ratio(best["tree"]["tau"], base["tree"]["tau"]), "tree_tau_goal": 1.2,
                           "fastest_kind": fast["kind"], "native_speedup_ratio": ratio(sp(fast), sp(base)),
                           "native_speedup_goal": 1.3}
    b1 = {k: (v.get("best_by_batch") or {}).get("1", {}).get("speedup") for k, v in served.items()}
    if b1.get("eagle3") and any(b1.get(k) for k in KINDS[1:]):
        best = max((k for k in KINDS[1:] if b1.get(k)), key=lambda k: b1[k])
        out["served_batch1"] = {"kind": best, "speedup_ratio": ratio(b1[best], b1["eagle3"]), "goal": 1.3}
    return out


def result(r: S.Runner, a, done: bool) -> dict:
    rows = [x for kind in a.kinds for regime in a.regimes if (x := row(r, a, kind, regime))]
    served = {k: json.loads((a.work / f"serve-{k}.json").read_text()) for k in a.kinds
              if (a.work / f"serve-{k}.json").is_file()}
    return {"target": a.target, "prepared": str(a.prepared), "prepared_summary": S.prep_summary(a.prepared),
            "recipe": {k: getattr(a, k) for k in ("epochs", "batch", "lr", "ttt", "train_args", "kind_args",
                                                  "eval_chain", "eval_chain_parallel", "eval_tree",
                                                  "eval_per_category", "eval_max_new_tokens", "time_budget_s")},
            "rows": rows, "served": served, "goals": goals(rows, served),
            "seconds": r.state.get("seconds", {}), "complete": done}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--target", default="/tmp/smol-hf")
    add("--prepared", type=Path, required=True, help="PREPARED dir (eyas prepare; e.g. bench/best_draft.py's WORK/prep)")
    add("--work", type=Path, default=Path("/tmp/drafters"))
    add("--out", type=Path, default=S.ROOT / "bench" / "results" / "drafters.json")
    add("--kinds", default=",".join(KINDS))
    add("--regimes", default=",".join(REGIMES), help="data (equal epochs), time (equal GPU seconds)")
    add("--budget-s", type=float, default=540, help="start no step after this many seconds")
    add("--device", default=None)
    add("--batch", type=int, default=8)
    add("--ttt", type=int, default=7, help="tokens drafted per position (dflash: block = this + 1)")
    add("--epochs", type=float, default=2.0)
    add("--lr", type=float, default=1e-3)
    add("--train-args", default="", help="extra `eyas train` flags for every kind")
    add("--kind-args", action="append", default=[], help="KIND=FLAGS: extra `eyas train` flags for one kind")
    add("--time-budget-s", type=float, default=None, help="equal-time regime's seconds (default: eagle3's data run)")
    add("--save-every", type=int, default=200)
    add("--eval-every", type=int, default=400)
    add("--eval-batches", type=int, default=32)
    add("--train-need", type=float, default=150, help="start a training only with this many seconds left")
    add("--eval-chain", type=int, default=3)
    add("--eval-chain-parallel", type=int, default=None, help="p-eagle's and dflash's chain (default: --ttt)")
    add("--eval-tree", default="total=60,depth=7,topk=10")
    add("--eval-per-category", type=int, default=1)
    add("--eval-categories", default="", help="comma-separated (default: all 13)")
    add("--eval-max-new-tokens", type=int, default=256)
    add("--eval-compile", action=argparse.BooleanOptionalAction, default=None, help="default: on a GPU")
    add("--eval-min-bucket", type=int, default=1_000_000)
    add("--eval-est-s", type=float, default=240, help="an eval's seconds until one has been timed here")
    add("--serve", action=argparse.BooleanOptionalAction, default=True, help="the vLLM sweeps (serve:KIND)")
    add("--python", default=None, help="vLLM env's python (default $EYAS_VLLM_PYTHON)")
    add("--bench", default="spec-bench")
    add("--serve-chains", type=int, nargs="+", default=[2, 3, 4], help="eagle3's exported chains")
    add("--serve-chains-parallel", type=int, nargs="+", default=[3, 5, 7], help="p-eagle's and dflash's")
    add("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    add("--serve-per-category", type=int, default=2)
    add("--serve-max-new-tokens", type=int, default=256)
    add("--serve-rounds", type=int, default=2)
    add("--serve-need", type=float, default=420, help="start a served sweep only with this many seconds left")
    add("--gpus", nargs="+", default=["0"])
    add("--engines-per-gpu", type=int, default=4, help="a sweep's engines side by side (start-ups overlap)")
    add("--tiny", action="store_true", help="CPU check: a few steps, eager evals on two categories, no vLLM")
    a = ap.parse_args(argv)
    if a.tiny:
        ap.set_defaults(ttt=2, epochs=1.0, batch=2, device="cpu", save_every=2, eval_every=2, eval_batches=2,
                        train_need=20, eval_chain=2, eval_tree="total=6,depth=2,topk=3", eval_max_new_tokens=16,
                        eval_est_s=60, eval_categories="writing,coding", serve=False)
        a = ap.parse_args(argv)
    a.work, a.out, a.prepared = a.work.resolve(), a.out.resolve(), a.prepared.resolve()
    a.kinds, a.regimes = a.kinds.split(","), a.regimes.split(",")
    if set(a.kinds) - set(KINDS) or set(a.regimes) - set(REGIMES) or "eagle3" not in a.kinds:
        raise SystemExit(f"--kinds {a.kinds} / --regimes {a.regimes}: eagle3 (the reference) plus any of {KINDS[1:]}; "
                         f"regimes among {REGIMES}")
    if S.prep_summary(a.prepared) is None:
        raise SystemExit(f"--prepared {a.prepared}: no manifest.json (run `eyas prepare` first)")
    a.work.mkdir(parents=True, exist_ok=True)
    a.device = a.device or ("cuda" if __import__("torch").cuda.is_available() else "cpu")
    a.eval_compile = a.device.startswith("cuda") if a.eval_compile is None else a.eval_compile
    r = S.Runner(a)
    try:
        run_steps(r, a)
    finally:
        r.reap(wait=True)
    want = ([f"train:{k}:data" for k in a.kinds] + [f"train:{k}:time" for k in a.kinds if "time" in a.regimes
                                                    and k != "eagle3"]
            + [f"eval:{k}:{g}" for k in a.kinds for g in a.regimes if (k, g) != ("eagle3", "time")]
            + ([f"{s}:{k}" for k in a.kinds for s in ("serve", "check")] if a.serve else []))
    done = all(w in r.state["done"] for w in want)
    emit(result(r, a, done), a.out)
    print("all steps done" if done else f"steps left: {[w for w in want if w not in r.state['done']]}", flush=True)
    return 0 if done or r.ran else 3   # 3: no step fit this call's budget (bench/gpu_session.sh's loops stop on it)


if __name__ == "__main__":
    sys.exit(main())
