"""Plan `scaling`: held-out and Spec-Bench tau against training tokens for raw / regenerated / self-generated data
(EAGLE-3's scaling figure), one point per (kind, size).

Steps, each resumable and recorded done in OUT/state.json:
  gen:KIND     regenerated (the dataset re-answered) or self (self:N prompts the target writes, then answers) rows,
               through `eyas regenerate --backend native`; raw needs none. Rows shorter than est_tokens_per_row
               make a top-up (gen:KIND:more) once their length is measured.
  prep:KIND:S  `eyas prepare` of the first rows holding ~S tokens (prepared again with more rows while short).
  train:KIND:S online `eyas train` for `epochs` over those tokens; held-out simulated chain-K tau is the last
               held-out eval in metrics.jsonl (K = ttt_steps).
               With skip_train the rows and preps alone (a GPU session's data, sent home before training).
  eval:KIND:S  Spec-Bench tau at T=0 of that draft (`eyas eval`, chain eval_chain and tree eval_tree). Not
               resumable inside, so it starts only when the budget holds what the longest eval so far took (see
               stages.eval_need); one that does not fit waits for a later call while the next points train. With
               eval_background (on a GPU) it runs beside the next point's training; every eval shares one AR
               baseline.
A size beyond what the source holds (its prep < 95% of the size, and >= 90% of those tokens already trained as
another size) is recorded as exhausted, not trained twice. `kinds` and `sizes` may grow between calls of one OUT.
OUT/result.json holds the points (kind, size, tokens, rows, tau, acc, steps, train_seconds and, once evaluated,
spec_bench_* tau and setting, eval_seconds); result.png plots them (held-out tau left, Spec-Bench tree (solid)
and chain (dashed) tau right, tokens on a log x).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

from eyas.recipes.recipe import Recipe, RecipeError
from eyas.recipes.runner import Runner
from eyas.recipes.stages import (check_switches, eval_setting, held_out_evals, prep_summary, resolved,
                                 source, spec_bench, spec_bench_point, train_continue)

# What makes two points comparable: an OUT made with other values is refused (kinds and sizes may grow).
IDENTITY = ("target", "data", "new_tokens", "max_prompt", "gen_temperature", "max_length", "draft_vocab_size",
            "ttt_steps", "epochs", "lr", "batch_size", "train_args", "eval_chain", "eval_tree", "eval_per_category",
            "eval_categories", "eval_max_new_tokens")
ORDER = ("raw", "regen", "self")   # one colour per kind in every plot; mixes after them


def sizes_of(p) -> list[int]:
    try:
        return [int(float(s)) for s in str(p.sizes).split(",")]
    except ValueError:
        raise RecipeError(f"sizes={p.sizes}: give training tokens per point, comma-separated (1e6,3e6)") from None


def check_params(params: dict) -> None:
    sizes_of(SimpleNamespace(**params))
    check_switches(params)
    kinds = params["kinds"].split(",")
    if not kinds or set(kinds) - set(ORDER) or len(set(kinds)) < len(kinds):
        raise RecipeError(f"kinds={params['kinds']}: give distinct kinds among {', '.join(ORDER)}")


def tokens_per_row(r: Runner, p, kind: str, src: str, rows: int) -> float | None:
    prep = r.work / f"prep-{kind}-all"
    if not r.eyas(f"prep:{kind}:all", "prepare", "--target", p.target, "--data", src, "--max-samples", str(rows),
                  "--out", str(prep), "--max-length", str(p.max_length), "--draft-vocab-size",
                  str(p.draft_vocab_size), "--workers", "0", "--overwrite", "--json"):
        return None
    s = prep_summary(prep) or {}
    if not s.get("rows_out"):
        raise RecipeError(f"{prep}: no usable rows from {src}; see its .errors.jsonl")
    return s["tokens"] / s["rows_out"]


def prep_to_size(r: Runner, p, kind: str, src: str, size: int, tpr: float, prep: Path, tries: int = 3) -> bool:
    """prep:KIND:S holding ~S tokens. Rows differ in length along a dataset, so a short result is prepared again
    with the row count scaled by what is missing, until it holds >= 95% of S or the source has no more rows."""
    n, got_before = math.ceil(size / tpr / 0.95), -1  # the train split is 95% of the rows
    for i in range(tries):
        if not r.eyas(f"prep:{kind}:{size}" + (f":{i}" if i else ""), "prepare", "--target", p.target, "--data", src,
                      "--max-samples", str(n), "--out", str(prep), "--max-length", str(p.max_length),
                      "--draft-vocab-size", str(p.draft_vocab_size), "--workers", "0", "--overwrite", "--json"):
            return False
        summary = prep_summary(prep)
        if summary is None:   # nothing to measure (a stand-in stage)
            return True
        got = summary.get("tokens") or 0
        if (got >= 0.95 * size or got <= got_before or r.done(f"train:{kind}:{size}")
                or summary.get("rows_in", n) < n):
            return True   # enough, the source is exhausted (fewer rows than asked), or a run already trained on it
        got_before, n = got, math.ceil(n * size / max(got, 1) * 1.02)
    return True


def covered_by(r: Runner, kind: str, size: int, prep: Path) -> bool:
    """KIND:SIZE's source ran out (its prep holds < 95% of SIZE) and a point this OUT trained holds >= 90% of
    those tokens: training it would repeat that point. Recorded in state["exhausted"] and counted as done."""
    key, got = f"{kind}:{size}", (prep_summary(prep) or {}).get("tokens") or 0
    if key in r.state.get("exhausted", {}):
        return True
    if not got or got >= 0.95 * size or r.done(f"train:{key}"):
        return False
    for done in r.state["done"]:
        if done.startswith(f"train:{kind}:") and done != f"train:{key}":
            other = int(done.split(":")[2])
            have = (prep_summary(r.work / f"prep-{kind}-{other}") or {}).get("tokens") or 0
            if have >= 0.9 * got:
                print(f"-- {key}: the source holds only {got:,} tokens, {have / got:.0%} of them already in "
                      f"{kind}:{other}: not trained again", flush=True)
                r.state.setdefault("exhausted", {})[key] = {"tokens": got, "same_as": f"{kind}:{other}"}
                r.save()
                return True
    return False


def run_plan(r: Runner, recipe: Recipe) -> dict:
    p = resolved(recipe.params)
    sizes = sizes_of(p)
    for kind in p.kinds.split(","):
        if not run_kind(r, p, kind, sizes):
            break
    r.reap(wait=True)
    return result(r, p, sizes)


def run_kind(r: Runner, p, kind: str, sizes: list[int]) -> bool:
    """KIND's points in size order; False when a step did not finish in this call (the next kinds wait)."""
    todo = [s for s in sizes if f"{kind}:{s}" not in r.state.get("exhausted", {})]
    if not todo:
        return True
    rows = math.ceil(max(todo) * 1.1 / p.est_tokens_per_row)  # 10% spare for the held-out split
    src = source(r, p, kind, rows)
    tpr = tokens_per_row(r, p, kind, src, rows) if src else None
    if tpr is None:
        return False
    need = math.ceil(max(todo) * 1.1 / tpr)
    if kind != "raw" and need > 1.02 * rows:
        # rows came out shorter than estimated: generate the rest (prep:KIND:all keeps the first sample's measure)
        print(f"-- gen:{kind}: {rows} rows x {tpr:.0f} tokens < {max(todo) * 1.1:.3g}: {need} rows", flush=True)
        if not source(r, p, kind, need, stage=":more"):
            return False
    for size in todo:
        r.reap()
        prep, run = r.work / f"prep-{kind}-{size}", r.work / f"run-{kind}-{size}"
        if not prep_to_size(r, p, kind, src, size, tpr, prep):
            return False
        if covered_by(r, kind, size, prep) or p.skip_train:   # skip_train: the data alone (a later call trains)
            continue
        name = f"train:{kind}:{size}"
        if not r.eyas(name, "train", "--online", "--target", p.target, "--data", str(prep), "--out", str(run),
                      "--ttt-steps", str(p.ttt_steps), "--epochs", str(p.epochs), "--batch-size", str(p.batch_size),
                      "--lr", str(p.lr), "--eval-every", "1000000", "--save-every", "200",
                      *(["--eval-every-epoch"] if p.epochs > 1 else []),   # what each epoch adds, held out
                      *train_continue(r, name, run), "--seed", "0", "--device", p.device, "--no-progress",
                      *p.train_args.split()):
            return False
        if not p.skip_eval:   # one that does not fit waits for a later call; the next points train meanwhile
            spec_bench(r, p, f"eval:{kind}:{size}", run, r.work / f"eval-{kind}-{size}.json",
                       background=p.eval_background)
    return True


def result(r: Runner, p, sizes: list[int]) -> dict:
    points = []
    for key in r.state["done"]:
        if not key.startswith("train:"):
            continue
        _, kind, size = key.split(":")
        evals = held_out_evals(r.work / f"run-{kind}-{size}")
        if not evals:
            continue
        ev = evals[-1]
        man = prep_summary(r.work / f"prep-{kind}-{size}") or {}
        points.append({"kind": kind, "size": int(size), "tokens": man.get("tokens"), "rows": man.get("rows_out"),
                       "tau": ev["tau"], "acc": ev.get("acc"), "steps": ev.get("step"),
                       "train_seconds": r.seconds(key),
                       "held_out_tau_by_step": {e["step"]: e["tau"] for e in evals}})   # epochs > 1: each epoch's
        if r.done(f"eval:{kind}:{size}"):
            points[-1].update(spec_bench_point(r.work / f"eval-{kind}-{size}.json"),
                              eval_seconds=r.seconds(f"eval:{kind}:{size}"))
    exhausted = r.state.get("exhausted", {})
    wanted = [f"{k}:{s}" for k in p.kinds.split(",") for s in sizes if f"{k}:{s}" not in exhausted]
    left = [f"train:{w}" for w in wanted if not r.done(f"train:{w}")]
    left += [] if p.skip_eval else [f"eval:{w}" for w in wanted if not r.done(f"eval:{w}")]
    png = r.work / "result.png"
    if points:
        plot(points, png, p.ttt_steps)
    out = {"bench": "scaling", "complete": not left, "left": left, "target": p.target, "data": p.data,
           "kinds": p.kinds.split(","), "sizes": sizes, "recipe": {k: getattr(p, k) for k in IDENTITY},
           "eval": eval_setting(p), "stage_seconds": {k: r.seconds(k) for k in r.state["done"]},
           "exhausted": exhausted, "points": points,
           "files": {"result": str(r.work / "result.json"), **({"plot": str(png)} if points else {})}}
    (r.work / "result.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    return out


def plot(points: list[dict], png: Path, ttt: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (sim, sb) = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    measured = [q for q in points if "spec_bench_tree_tau" in q]
    kinds = list(ORDER) + sorted({q["kind"] for q in points} - set(ORDER))
    for i, kind in enumerate(kinds):
        ps = sorted((q for q in points if q["kind"] == kind), key=lambda q: q["tokens"])
        if not ps:
            continue
        sim.plot([q["tokens"] for q in ps], [q["tau"] for q in ps], marker="o", color=f"C{i}", label=kind)
        ms = [q for q in ps if q in measured]
        if ms:
            x = [q["tokens"] for q in ms]
            sb.plot(x, [q["spec_bench_tree_tau"] for q in ms], marker="o", color=f"C{i}", label=f"{kind} tree")
            sb.plot(x, [q["spec_bench_chain_tau"] for q in ms], marker="s", ls="--", color=f"C{i}",
                    label=f"{kind} chain")
    sim.set_ylabel(f"held-out simulated chain-{ttt} tau")
    sim.set_title("held-out simulated tau")
    if measured:
        m = measured[0]
        sb.set_title(f"Spec-Bench T=0: {m['spec_bench_tree']}, {m['spec_bench_chain']}\n"
                     f"{m['spec_bench_questions']} questions, {m['spec_bench_max_new_tokens']} new tokens", fontsize=9)
    else:
        sb.text(0.5, 0.5, "no Spec-Bench tau yet", ha="center", transform=sb.transAxes)
    sb.set_ylabel("measured Spec-Bench tau")
    for ax in (sim, sb):
        ax.set_xscale("log")
        ax.set_xlabel("training tokens")
        ax.grid(True, which="both", alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    fig.suptitle("draft tau vs data (raw / regenerated / self-generated)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
