"""bench/scaling.py's points once measured: read from eval JSONs, merged across sessions (one recipe, one Spec-Bench
setting, else refused), a bench/best_draft.py run taken as a point (one kind's: that kind's), and the curve's plot."""

from __future__ import annotations

import json
from pathlib import Path


# What makes two points' Spec-Bench tau comparable. Kept per point, not in `recipe`: the recipe decides whether
# the drafts (and their simulated tau) compare, these only whether the measured tau does, and old points without
# any Spec-Bench tau must still merge (a recipe key would refuse them). Read back from eval's own JSON.
EVAL_KEYS = ("spec_bench_chain", "spec_bench_tree", "spec_bench_questions", "spec_bench_categories",
             "spec_bench_max_new_tokens")


def eval_setting(a) -> dict | None:
    """This call's Spec-Bench setting in EVAL_KEYS' terms (None with --skip-eval)."""
    if a.skip_eval:
        return None
    from eyas.decode.bench import SPEC_BENCH, load_bench
    from eyas.decode.tree import TreeSpec

    qs = load_bench(SPEC_BENCH, a.eval_categories.split(",") if a.eval_categories else None, a.eval_per_category)
    return {"spec_bench_chain": TreeSpec.chain(a.eval_chain).label(),
            "spec_bench_tree": TreeSpec.parse(a.eval_tree).label(),
            "spec_bench_questions": len(qs), "spec_bench_categories": sorted({q["category"] for q in qs}),
            "spec_bench_max_new_tokens": a.eval_max_new_tokens}


def spec_bench_point(path: Path) -> dict:
    """A point's Spec-Bench tau and setting from its `eyas eval --out` JSON (one result per setting)."""
    out = json.loads(path.read_text())
    by = {("chain" if x["setting"].startswith("chain-") else "tree"): x for x in out["results"]}
    return {"spec_bench_chain_tau": by["chain"]["tau"], "spec_bench_tree_tau": by["tree"]["tau"],
            "spec_bench_chain": by["chain"]["setting"], "spec_bench_tree": by["tree"]["setting"],
            "spec_bench_questions": out["questions"], "spec_bench_categories": sorted(by["tree"]["per_category"]),
            "spec_bench_max_new_tokens": by["tree"]["decode"]["max_new_tokens"],
            "spec_bench_compiled": by["tree"]["decode"].get("compiled")}


def check_eval_settings(points: list[dict], ours: dict | None, where: str) -> None:
    """One curve, one Spec-Bench setting: its tau moves with the questions, token budget and tree."""
    seen = {json.dumps({k: p.get(k) for k in EVAL_KEYS}) for p in points if "spec_bench_tree_tau" in p}
    seen |= {json.dumps(ours)} if ours else set()
    if len(seen) > 1:
        raise SystemExit(f"{where}: Spec-Bench tau measured under different eval settings "
                         f"({' vs '.join(sorted(seen))}); match the --eval-* flags to the earlier points'")


def plot(points: list[dict], png: Path, ttt: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (sim, sb) = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    measured = [p for p in points if "spec_bench_tree_tau" in p]   # points older than the eval step have none
    order = ["raw", "regen", "self"]   # one colour per kind in every session's plot; mixes after them
    kinds = order + sorted({p["kind"] for p in points} - set(order))
    for i, kind in enumerate(kinds):
        ps = sorted((p for p in points if p["kind"] == kind), key=lambda p: p["tokens"])
        if not ps:
            continue
        sim.plot([p["tokens"] for p in ps], [p["tau"] for p in ps], marker="o", color=f"C{i}", label=kind)
        ms = [p for p in ps if p in measured]
        if ms:
            x = [p["tokens"] for p in ms]
            sb.plot(x, [p["spec_bench_tree_tau"] for p in ms], marker="o", color=f"C{i}", label=f"{kind} tree")
            sb.plot(x, [p["spec_bench_chain_tau"] for p in ms], marker="s", ls="--", color=f"C{i}",
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


RECIPE_KEYS = ("ttt", "epochs", "lr", "batch", "vocab", "max_length")


def best_draft_point(path: Path, prev: dict) -> list[dict]:
    """A bench/best_draft.py run as a scaling point (its recipe is checked by the caller): one kind's run is that
    kind's point, a run of several kinds a point of its own kind ("regen+self": a series of one point beside the
    curves). tokens = its prepared tokens, tau / acc / steps = its last held-out eval, Spec-Bench = its T=0 eval; a
    run evaluated on 2 questions a category gives the first question of each category alone (its per-turn records,
    `first_per_category`), the 13 questions the curve's points are measured on."""
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


def merged_points(paths: list[Path], a) -> list[dict]:
    """Points of earlier runs made with the same recipe (target, ttt, epochs, lr, batch, vocab, max length) and,
    where they have Spec-Bench tau, the same eval setting; a difference is an error, not a silent mix.
    A (kind, size) in several files: the first one wins. A best_draft JSON gives one point (best_draft_point)."""
    recipe = {k: getattr(a, k) for k in RECIPE_KEYS}
    out: dict[tuple, dict] = {}
    for path in paths:
        prev = json.loads(path.read_text())
        theirs = prev.get("recipe") or {}
        diff = {k: (theirs.get(k), v) for k, v in recipe.items() if theirs.get(k) != v}
        target = prev.get("target", theirs.get("target"))   # best_draft keeps it in its recipe
        if diff or target != a.target:
            raise SystemExit(f"--merge {path}: another recipe ({diff or 'target ' + str(target)}); "
                             f"its points would not be comparable")
        for p in best_draft_point(path, prev) if prev.get("bench") == "best_draft" else prev.get("points", []):
            out.setdefault((p["kind"], p["size"]), p)
    check_eval_settings(list(out.values()), eval_setting(a), f"--merge {' '.join(map(str, paths))}")
    return list(out.values())
