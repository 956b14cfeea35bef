"""The tau-vs-data curve over several runs: merge the points of `eyas run scaling` results (and best-draft results,
one point each) into one JSON and one PNG. The points themselves come from the recipe:

    eyas run scaling --set target=T data=D kinds=self,raw sizes=1e6,3e6 --out runs/scaling --budget 540s   # repeat
    PYTHONPATH=src python bench/scaling.py --merge bench/results/scaling.json runs/scaling/result.json \
        --out bench/results/scaling.json

Points must share a recipe (target, ttt_steps, epochs, lr, batch_size, draft_vocab_size, max_length) and, where
they have Spec-Bench tau, one eval setting; a difference is an error, not a silent mix. A (kind, size) in several
files: the first file's point wins. A best-draft run of one kind is that kind's point at its prepared tokens (its
T=0 Spec-Bench tau); a run of several kinds is a point of its own ("regen+self"), and a run evaluated on 2
questions a category gives the tau of the first question of each (its per-turn records), the curve's setting.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
from _emit import emit  # noqa: E402

from eyas.recipes.scaling import plot  # noqa: E402

CURVE_KEYS = ("ttt_steps", "epochs", "lr", "batch_size", "draft_vocab_size", "max_length")
OLD_NAMES = {"ttt": "ttt_steps", "batch": "batch_size", "vocab": "draft_vocab_size"}   # the runner's first spelling
EVAL_KEYS = ("spec_bench_chain", "spec_bench_tree", "spec_bench_questions", "spec_bench_categories",
             "spec_bench_max_new_tokens")


def recipe_of(doc: dict) -> dict:
    r = {OLD_NAMES.get(k, k): v for k, v in (doc.get("recipe") or {}).items()}
    return {"target": doc.get("target", r.get("target")), **{k: r.get(k) for k in CURVE_KEYS}}


def check_eval_settings(points: list[dict], where: str) -> None:
    """One curve, one Spec-Bench setting: its tau moves with the questions, token budget and tree."""
    seen = {json.dumps({k: p.get(k) for k in EVAL_KEYS}) for p in points if "spec_bench_tree_tau" in p}
    if len(seen) > 1:
        raise SystemExit(f"{where}: Spec-Bench tau measured under different eval settings "
                         f"({' vs '.join(sorted(seen))}); evaluate them alike")


def best_draft_point(path: Path, prev: dict) -> list[dict]:
    """A best-draft run as a scaling point (see the module's docstring)."""
    last, tok = prev.get("held_out_last"), prev.get("tokens") or {}
    if not prev.get("complete") or not last or "t0" not in prev.get("spec_bench", {}):
        raise SystemExit(f"--merge {path}: best_draft run not complete (no held-out eval or no T=0 Spec-Bench tau)")
    t0 = prev["spec_bench"]["t0"]
    cats = (prev.get("eval") or {}).get("spec_bench_categories")
    chain, tree, questions = t0["chain_tau"], t0["tree_tau"], t0["questions"]
    if (prev.get("recipe") or {}).get("eval_per_category", 1) > 1:
        first = {s: (t0.get("settings", {}).get(t0[s]) or {}).get("first_per_category") for s in ("chain", "tree")}
        if not all(first.values()):
            raise SystemExit(f"--merge {path}: {questions} questions and no first_per_category τ "
                             f"(a run older than the per-turn records): not comparable with one question a category")
        chain, tree, questions = first["chain"]["tau"], first["tree"]["tau"], first["tree"]["questions"]
    return [{"kind": "+".join(prev.get("kinds", [])), "size": tok["prepared"], "tokens": tok["prepared"],
             "rows": tok.get("rows_out"), "tau": last["tau"], "acc": last.get("acc"), "steps": last["step"],
             "train_seconds": prev.get("step_seconds", {}).get("train"), "from": f"best_draft {path.name}",
             "spec_bench_chain_tau": chain, "spec_bench_tree_tau": tree,
             "spec_bench_chain": t0["chain"], "spec_bench_tree": t0["tree"], "spec_bench_questions": questions,
             "spec_bench_categories": cats,
             "spec_bench_max_new_tokens": t0["max_new_tokens"], "spec_bench_compiled": t0.get("compiled"),
             "eval_seconds": t0.get("seconds")}]


def merged(paths: list[Path]) -> dict:
    """The points of PATHS (one recipe), the first of a repeated (kind, size) kept, and their sources' facts."""
    out: dict[tuple, dict] = {}
    recipe, exhausted = None, {}
    for path in paths:
        prev = json.loads(Path(path).read_text())
        theirs = recipe_of(prev)
        if recipe is not None and theirs != recipe:
            diff = {k: (recipe[k], theirs[k]) for k in recipe if recipe[k] != theirs[k]}
            raise SystemExit(f"--merge {path}: another recipe ({diff}); its points would not be comparable")
        recipe = recipe or theirs
        exhausted.update(prev.get("exhausted") or {})
        for p in best_draft_point(path, prev) if prev.get("bench") == "best_draft" else prev.get("points", []):
            out.setdefault((p["kind"], p["size"]), p)
    points = list(out.values())
    check_eval_settings(points, f"--merge {' '.join(map(str, paths))}")
    return {"recipe": recipe, "exhausted": exhausted, "points": points}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--merge", type=Path, nargs="+", required=True,
                    help="scaling / best-draft result JSONs, earlier merges too (their points kept first)")
    ap.add_argument("--out", type=Path, required=True, help="the merged curve's JSON (the PNG beside it)")
    a = ap.parse_args(argv)
    m = merged(a.merge)
    png = a.out.with_suffix(".png")
    if m["points"]:
        plot(m["points"], png, m["recipe"]["ttt_steps"])
    measured = [p for p in m["points"] if "spec_bench_tree_tau" in p]
    emit({"bench": "scaling", "target": m["recipe"]["target"], "recipe": m["recipe"],
          "merged_from": [str(p) for p in a.merge], "eval": {k: measured[0].get(k) for k in EVAL_KEYS}
          if measured else None, "png": str(png) if m["points"] else None, "exhausted": m["exhausted"],
          "points": sorted(m["points"], key=lambda p: (p["kind"], p["size"]))}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
