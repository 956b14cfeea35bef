"""Plan `drafters`: the parallel drafters beside EAGLE-3 — eagle3, p-eagle and dflash trained on one PREPARED dir at
equal data and at equal GPU-minutes, each measured on Spec-Bench (chain and tree tau, native speedup over the AR
baseline) and served by vLLM (speedup over vLLM's own AR at batch 1 / 8 / 32 on the same prompts).

    eyas run drafters --set target=./smol prepared=runs/best-draft/prep device=cuda --budget 9m   # repeat until done

Steps, each recorded done in OUT/state.json; one cut by the budget continues on the next call (training resumes
from its last checkpoint; an eval or a served sweep starts only when its estimated seconds are left):
  train:KIND:data   online `eyas train --draft-kind KIND` for `epochs` over PREPARED (equal data); its GPU seconds
                    are the seconds of every call it ran in
  train:KIND:time   the same rows, --steps = train:eagle3:data's seconds (or time_budget_s) / this kind's seconds
                    per step in its equal-data run (equal GPU-minutes); none for eagle3 (its data run is that)
  eval:KIND:REGIME  `eyas eval` on Spec-Bench: chain eval_chain (parallel kinds: eval_chain_parallel, default the
                    trained tokens: one forward drafts them all) and tree eval_tree (every kind the same questions
                    and one cached AR baseline); dflash trees are at most its block's masks deep
  serve:KIND        `eyas export` of the equal-data run at each chain of serve_chains (eagle3) or
                    serve_chains_parallel (p-eagle, dflash; at most the trained tokens), then vLLM's speedup sweep
                    (eyas.engines.speedup: the plain target and each export, batch batch_sizes)
  check:KIND        `eyas serve-check` of the export at the kind's native chain: served tau against native chain tau
                    on the same prompts (judged at 5% in the result), vLLM's greedy outputs against the target's
OUT/result.json, per row: kind, regime, training tokens and steps, GPU seconds, held-out simulated tau, Spec-Bench
chain/tree tau, speedup, tok/s and identical rate; "served" per kind; "goals" the ratios of the best parallel draft
against EAGLE-3 (tree tau >= 1.2x, native speedup >= 1.3x, served batch-1 speedup >= 1.3x) at equal data and time.
kind_args: extra `eyas train` flags of one kind ("p-eagle=--lr 6e-4"); the published recipes' layer counts, loss
decays and sampling are the kinds' defaults (eyas.draft.kinds).
"""

from __future__ import annotations

import json
from pathlib import Path

from eyas.decode.tree import TreeSpec
from eyas.flags import DRAFT_KINDS
from eyas.recipes.recipe import Recipe, RecipeError
from eyas.recipes.runner import Runner
from eyas.recipes.stages import check_switches, eval_flags, eval_need, prep_summary, resolved, train_continue

REGIMES = ("data", "time")
# What decides the drafts and what their tau and speedups are measured on (kinds and regimes may grow in one OUT)
IDENTITY = ("target", "prepared", "batch_size", "ttt_steps", "epochs", "lr", "train_args", "kind_args",
            "time_budget_s", "eval_chain", "eval_chain_parallel", "eval_tree", "eval_per_category", "eval_categories",
            "eval_max_new_tokens", "serve_chains", "serve_chains_parallel", "batch_sizes", "serve_per_category",
            "serve_max_new_tokens")


def check_params(params: dict) -> None:
    check_switches(params)
    kinds, regimes = params["kinds"].split(","), params["regimes"].split(",")
    if set(kinds) - set(DRAFT_KINDS) or "eagle3" not in kinds or set(regimes) - set(REGIMES):
        raise RecipeError(f"kinds={params['kinds']} / regimes={params['regimes']}: eagle3 (the reference) plus any "
                          f"of {', '.join(DRAFT_KINDS[1:])}; regimes among {', '.join(REGIMES)}")
    if prep_summary(Path(params["prepared"] or ".")) is None:
        raise RecipeError(f"prepared={params['prepared']!r}: no PREPARED dir there (no manifest.json); run `eyas "
                          "prepare` first, or give a best-draft OUT's prep")
    for spec in params["kind_args"]:
        if str(spec).split("=", 1)[0] not in kinds or "=" not in str(spec):
            raise RecipeError(f"kind_args: {spec!r}; give KIND=FLAGS with KIND among {params['kinds']}")


def metrics(run: Path) -> list[dict]:
    m = run / "metrics.jsonl"
    return [json.loads(x) for x in m.read_text().splitlines() if x.strip()] if m.is_file() else []


def kind_args(p, kind: str) -> list[str]:
    return [x for spec in p.kind_args if spec.split("=", 1)[0] == kind for x in spec.split("=", 1)[1].split()]


def native_chain(p, kind: str) -> int:
    """The chain a kind is evaluated and checked at: eval_chain for eagle3; a parallel kind drafts its trained
    tokens in one forward (eval_chain_parallel overrides)."""
    return p.eval_chain if kind == "eagle3" else (p.eval_chain_parallel or p.ttt_steps)


def native_tree(p, kind: str) -> str:
    """The tree a kind is evaluated at: eval_tree, but no deeper than a DFlash block's masks (its one pass drafts
    only those positions; the kept nodes shrink with the candidates a shallower tree has)."""
    spec = TreeSpec.parse(p.eval_tree)
    if kind != "dflash" or spec.depth <= p.ttt_steps:
        return p.eval_tree
    depth = p.ttt_steps
    total = min(spec.total, spec.topk + (depth - 1) * spec.topk * spec.topk)
    return f"total={total},depth={depth},topk={spec.topk}"


def train(r: Runner, p, kind: str, regime: str, steps: int | None = None) -> bool:
    name, run = f"train:{kind}:{regime}", p.work / f"run-{kind}-{regime}"
    length = ["--steps", str(steps)] if steps else ["--epochs", str(p.epochs)]
    return r.eyas(name, "train", "--online", "--target", p.target, "--data", str(p.prepared), "--out", str(run),
                  "--draft-kind", kind, "--ttt-steps", str(p.ttt_steps), *length, "--batch-size", str(p.batch_size),
                  "--lr", str(p.lr), "--seed", "0", "--device", p.device, "--save-every", str(p.save_every),
                  "--eval-every", str(p.eval_every), "--eval-batches", str(p.eval_batches), "--no-progress",
                  "--no-tensorboard", *train_continue(r, name, run), *p.train_args.split(), *kind_args(p, kind),
                  need=p.train_need)


def time_steps(r: Runner, p, kind: str) -> int:
    """Optimizer steps that give KIND the equal-time budget at its own measured seconds per step."""
    budget = p.time_budget_s or r.seconds("train:eagle3:data")
    steps = metrics(p.work / f"run-{kind}-data")[-1]["step"]
    return max(1, round(budget / (r.seconds(f"train:{kind}:data") / steps)))


def evaluate(r: Runner, p, kind: str, regime: str) -> bool:
    flags = eval_flags(p)
    flags[flags.index("--chain") + 1] = str(native_chain(p, kind))
    flags[flags.index("--tree") + 1] = native_tree(p, kind)
    return r.eyas(f"eval:{kind}:{regime}", "eval", "--draft", str(p.work / f"run-{kind}-{regime}"), *flags,
                  "--temperature", "0", "--out", str(p.work / f"eval-{kind}-{regime}.json"), "--baseline-cache",
                  str(p.work / "baseline-cache"), need=eval_need(r, p))


def export(r: Runner, p, kind: str, k: int) -> bool:
    return r.eyas(f"export:{kind}:k{k}", "export", "--draft", str(p.work / f"run-{kind}-data"), "--out",
                  str(p.work / f"export-{kind}-k{k}"), "--chain", str(k))


def serve(r: Runner, p, kind: str) -> bool:
    """Exports at each chain, then one vLLM sweep (the plain target and each export) in this process."""
    chains = p.serve_chains if kind == "eagle3" else [k for k in p.serve_chains_parallel if k <= p.ttt_steps]
    if not all(export(r, p, kind, k) for k in chains):
        return False
    return r.call(f"serve:{kind}", lambda: sweep(p, kind, chains), need=p.serve_need)[0]


def sweep(p, kind: str, chains: list[int]) -> dict:
    """vLLM's speedup sweep of KIND's exports, written to OUT/serve-KIND.json; the state keeps a short summary."""
    from eyas.engines.adapters import ADAPTERS
    from eyas.engines.speedup import measure

    res = measure(ADAPTERS["vllm"](p.python), p.target, str(p.work / f"export-{kind}-k{{k}}"), prompts(p), chains,
                  p.batch_sizes, p.serve_max_new_tokens, p.gpus, p.work / f"serve-{kind}.logs",
                  engines_per_gpu=p.engines_per_gpu, rounds=p.serve_rounds)
    (p.work / f"serve-{kind}.json").write_text(json.dumps(res, indent=1))
    if res["failed"]:
        raise RecipeError(f"serve:{kind}: engines failed: {sorted(res['failed'])}; see {p.work / f'serve-{kind}.logs'}")
    return {"file": str(p.work / f"serve-{kind}.json"), "best_by_batch": res.get("best_by_batch")}


def serve_check(r: Runner, p, kind: str) -> bool:
    k = native_chain(p, kind)
    if not export(r, p, kind, k):
        return False
    cats = ["--categories", *p.eval_categories.split(",")] if p.eval_categories else []
    return r.eyas(f"check:{kind}", "serve-check", "--draft", str(p.work / f"export-{kind}-k{k}"), "--engine", "vllm",
                  *(["--python", p.python] if p.python else []), "--per-category", str(p.serve_per_category), *cats,
                  "--max-new-tokens", str(p.serve_max_new_tokens), "--out", str(p.work / f"check-{kind}.json"),
                  "--tolerance", "1.0",   # a gap is a finding (judged at 5% in the result), not a failure
                  need=p.serve_need)


def prompts(p) -> list[list[int]]:
    """The served sweep's prompts: the first turn of serve_per_category Spec-Bench questions a category."""
    from eyas.decode.bench import SPEC_BENCH, load_bench
    from eyas.decode.session import turn_prompt
    from eyas.target import load_tokenizer

    tok = load_tokenizer(p.target)
    return [turn_prompt(tok, q, []) for q in load_bench(SPEC_BENCH, None, p.serve_per_category)]


def steps(p) -> list[str]:
    kinds, regimes = p.kinds.split(","), p.regimes.split(",")
    return ([f"train:{k}:data" for k in kinds] + [f"train:{k}:time" for k in kinds if "time" in regimes
                                                   and k != "eagle3"]
            + [f"eval:{k}:{g}" for k in kinds for g in regimes if (k, g) != ("eagle3", "time")]
            + ([f"{s}:{k}" for k in kinds for s in ("serve", "check")] if p.serve else []))


def run_plan(r: Runner, recipe: Recipe) -> dict:
    p = resolved(recipe.params)
    p.work, p.prepared = r.work, Path(p.prepared).resolve()
    run_steps(r, p)
    r.reap(wait=True)
    return result(r, p)


def run_steps(r: Runner, p) -> None:
    kinds, regimes = p.kinds.split(","), p.regimes.split(",")
    for kind in kinds:
        if not train(r, p, kind, "data"):
            return
    for kind in kinds:
        if "time" in regimes and kind != "eagle3" and not train(r, p, kind, "time", time_steps(r, p, kind)):
            return
    for kind in kinds:
        for regime in regimes:
            if (kind, regime) != ("eagle3", "time") and not evaluate(r, p, kind, regime):
                return
    for kind in kinds if p.serve else ():
        if not serve(r, p, kind) or not serve_check(r, p, kind):
            return


def row(r: Runner, p, kind: str, regime: str) -> dict | None:
    src = "data" if (kind, regime) == ("eagle3", "time") else regime   # eagle3's data run sets the time budget
    run, m = p.work / f"run-{kind}-{src}", metrics(p.work / f"run-{kind}-{src}")
    trains = [x for x in m if x["split"] == "train"]
    if not r.done(f"train:{kind}:{src}") or not trains:
        return None
    evals = [x for x in m if x["split"] == "eval"]
    out = {"kind": kind, "regime": regime, "run": str(run), "train_steps": trains[-1]["step"],
           "train_tokens": round(trained_tokens(p)) if src == "data" else None,
           "train_gpu_s": r.seconds(f"train:{kind}:{src}"),
           "heldout_tau": evals[-1]["tau"] if evals else None, "heldout_acc": evals[-1]["acc"] if evals else None}
    if src == "time":   # the tokens its steps saw: the equal-data run's tokens per step
        per_step = trained_tokens(p) / metrics(p.work / f"run-{kind}-data")[-1]["step"]
        out["train_tokens"] = round(per_step * out["train_steps"])
    check = p.work / f"check-{kind}.json"
    if regime == "data" and check.is_file():
        c = json.loads(check.read_text())
        out["served_check"] = {k: c.get(k) for k in ("chain", "served_tau", "native_tau", "relative_gap",
                                                     "served_identical_to_target_greedy")}
        out["served_check"]["within_5pct"] = c.get("relative_gap") is not None and c["relative_gap"] <= 0.05
    ev = p.work / f"eval-{kind}-{src}.json"
    if ev.is_file():
        keep = ("setting", "tau", "accept_per_position", "speedup", "tokens_per_s", "baseline_tokens_per_s",
                "identical_rate")
        res = json.loads(ev.read_text())["results"]
        out["chain"], out["tree"] = ({k: x[k] for k in keep} for x in res[:2])
    return out


def trained_tokens(p) -> float:
    """Tokens an equal-data run trains on: `epochs` over the training split (95% of the PREPARED rows)."""
    return (prep_summary(p.prepared) or {}).get("tokens", 0) * p.epochs * 0.95


def ratio(x, y):
    return round(x / y, 3) if x is not None and y else None


def goals(rows: list[dict], served: dict) -> dict:
    """The ratios of the best parallel draft against EAGLE-3, per regime and in vLLM."""
    out = {}
    sp = lambda x: max(x["tree"]["speedup"], x["chain"]["speedup"])  # noqa: E731
    for regime in REGIMES:
        by = {x["kind"]: x for x in rows if x["regime"] == regime and "tree" in x}
        base, par = by.get("eagle3"), [x for k, x in by.items() if k != "eagle3"]
        if base and par:
            best, fast = max(par, key=lambda x: x["tree"]["tau"]), max(par, key=sp)
            out[regime] = {"best_tree_tau_kind": best["kind"],
                           "tree_tau_ratio": ratio(best["tree"]["tau"], base["tree"]["tau"]), "tree_tau_goal": 1.2,
                           "fastest_kind": fast["kind"], "native_speedup_ratio": ratio(sp(fast), sp(base)),
                           "native_speedup_goal": 1.3}
    b1 = {k: (v.get("best_by_batch") or {}).get("1", {}).get("speedup") for k, v in served.items()}
    if b1.get("eagle3") and any(b1.get(k) for k in DRAFT_KINDS[1:]):
        best = max((k for k in DRAFT_KINDS[1:] if b1.get(k)), key=lambda k: b1[k])
        out["served_batch1"] = {"kind": best, "speedup_ratio": ratio(b1[best], b1["eagle3"]), "goal": 1.3}
    return out


def result(r: Runner, p) -> dict:
    r.record_call()   # the result reports this call too
    rows = [x for kind in p.kinds.split(",") for regime in p.regimes.split(",") if (x := row(r, p, kind, regime))]
    served = {k: json.loads((p.work / f"serve-{k}.json").read_text()) for k in p.kinds.split(",")
              if (p.work / f"serve-{k}.json").is_file()}
    left = [s for s in steps(p) if not r.done(s)]
    out = {"bench": "drafters", "complete": not left, "left": left, "target": p.target, "prepared": str(p.prepared),
           "prepared_summary": prep_summary(p.prepared), "recipe": {k: getattr(p, k) for k in IDENTITY},
           "rows": rows, "served": served, "goals": goals(rows, served), "seconds": r.state.get("seconds", {}),
           "files": {"result": str(p.work / "result.json")}}
    (p.work / "result.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    return out
