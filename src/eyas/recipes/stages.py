"""The eyas steps the best-draft and scaling plans share: generated rows, a prepared set's summary, the trainer's
resume flags and the Spec-Bench eval (its flags, its budget need, its result as a point)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from eyas.recipes.recipe import RecipeError
from eyas.recipes.runner import Runner


# Switches whose null means "on a GPU, off on a CPU"
DEVICE_SWITCHES = ("eval_compile", "eval_background", "eval_parallel", "warm_background")


def check_switches(params: dict) -> None:
    for k in DEVICE_SWITCHES:
        if k in params and params[k] not in (None, True, False):
            raise RecipeError(f"{k}={params[k]!r}: give true, false or null (null: on a GPU)")


def resolved(params: dict) -> SimpleNamespace:
    """The params with `device: auto` and the switches left to the device (null: on a GPU) decided."""
    p = SimpleNamespace(**params)
    if p.device == "auto":
        p.device = "cuda" if __import__("torch").cuda.is_available() else "cpu"
    gpu = p.device.startswith("cuda")
    for k in DEVICE_SWITCHES:
        if getattr(p, k, False) is None:
            setattr(p, k, gpu)
    return p


def source(r: Runner, p, kind: str, rows: int, stage: str = "") -> str | None:
    """KIND's rows (raw: the dataset itself), generated into OUT/KIND.jsonl by gen:KIND (`stage` names a later
    top-up: `eyas regenerate` resumes, writing only the rows beyond those already there). task: long-input tasks
    over this OUT's self-written answers. None while the step is not done."""
    if kind == "raw":
        return p.data
    out, name = r.work / f"{kind}.jsonl", f"gen:{kind}{stage}"
    if r.state.get("fresh") and not r.started(name) and not stage:
        out.unlink(missing_ok=True)   # rows of the recipe this OUT held before --fresh
    data = p.data if kind == "regen" else f"tasks:{r.work / 'self.jsonl'}" if kind == "task" else f"self:{rows}"
    ok = r.eyas(name, "regenerate", "--target", p.target, "--data", data, "--max-samples", str(rows),
                "--out", str(out), "--backend", "native", "--batch-size", str(p.gen_batch), "--max-new-tokens",
                str(p.new_tokens), "--max-prompt-tokens", str(p.max_prompt), "--device", p.device,
                "--temperature", str(p.gen_temperature), "--attention", p.gen_attention, "--graph", p.gen_graph,
                "--json", *(["--task-min-words", str(p.task_min_words)] if kind == "task" else []))
    return str(out) if ok else None


def prep_summary(prep: Path) -> dict | None:
    """The summary `eyas prepare` wrote into PREP's manifest; None when there is no manifest."""
    man = prep / "manifest.json"
    return json.loads(man.read_text()).get("summary", {}) if man.is_file() else None


def train_continue(r: Runner, name: str, run: Path) -> list[str]:
    """`--resume` for a training this OUT started and checkpointed; `--overwrite` for a run dir holding anything
    else (a run killed before its first checkpoint, or one from before --fresh); nothing for a new one."""
    from eyas.train.checkpoint import latest_checkpoint

    if r.started(name) and latest_checkpoint(run):
        return ["--resume"]
    return ["--overwrite"] if (run / "metrics.jsonl").exists() or (run / "checkpoints").exists() else []


def eval_flags(p) -> list[str]:
    """The `eyas eval` flags that decide what is compiled (questions, so the KV capacity; settings; bucket): the
    eval's and its warm-up's, from one place so the two agree."""
    cats = ["--categories", *p.eval_categories.split(",")] if p.eval_categories else []
    return ["--target", p.target, "--per-category", str(p.eval_per_category), *cats,
            "--max-new-tokens", str(p.eval_max_new_tokens), "--chain", str(p.eval_chain), "--tree", p.eval_tree,
            "--device", p.device,
            *(["--compile", "--min-bucket", str(p.eval_min_bucket)] if p.eval_compile else ["--no-compile"])]


def eval_need(r: Runner, p) -> float:
    """Seconds of budget an eval needs to start (it does not resume inside): 1.5x the longest eval this OUT has
    timed (eval_est_s before the first), capped at 0.9 of the budget when the eval itself fits that (a call
    spends its first seconds before the eval), so a budget that holds the eval always starts it."""
    seen = [t for k, t in r.state["done"].items() if k.startswith("eval:")]
    full, longest = 0.9 * r.budget_s, max(seen, default=None)
    if longest is None:
        return p.eval_est_s
    return min(1.5 * longest, full) if longest <= full else 1.5 * longest


def spec_bench(r: Runner, p, name: str, draft: Path, out: Path, temperature: float = 0,
               background: bool = False) -> bool:
    """Step NAME: one `eyas eval` of DRAFT for the chain and the tree (they share its baseline) at `temperature`,
    into OUT; True when done (background: when started, and beside other steps on the device, so its speedups are
    not reported: --timings-shared). Every eval of one recipe directory shares one AR baseline (--baseline-cache)."""
    return (r.background if background else r.eyas)(
        name, "eval", "--draft", str(draft), *eval_flags(p), "--temperature", f"{temperature:g}", "--out", str(out),
        "--baseline-cache", str(r.work / "baseline-cache"), *(("--timings-shared",) if background else ()),
        need=eval_need(r, p))


def held_out_evals(run: Path) -> list[dict]:
    """Every held-out eval in RUN's metrics.jsonl, in step order."""
    m = run / "metrics.jsonl"
    if not m.is_file():
        return []
    return [x for x in map(json.loads, filter(str.strip, m.read_text().split("\n"))) if x.get("split") == "eval"]


def last_eval(run: Path) -> dict | None:
    """The last held-out eval in RUN's metrics.jsonl."""
    ev = held_out_evals(run)
    return ev[-1] if ev else None


def eval_setting(p) -> dict | None:
    """The Spec-Bench setting the recipe evaluates in (None when it does not): what makes two tau comparable."""
    if getattr(p, "skip_eval", False):
        return None
    from eyas.decode.bench import SPEC_BENCH, load_bench
    from eyas.decode.tree import TreeSpec

    qs = load_bench(SPEC_BENCH, p.eval_categories.split(",") if p.eval_categories else None, p.eval_per_category)
    return {"spec_bench_chain": TreeSpec.chain(p.eval_chain).label(),
            "spec_bench_tree": TreeSpec.parse(p.eval_tree).label(),
            "spec_bench_questions": len(qs), "spec_bench_categories": sorted({q["category"] for q in qs}),
            "spec_bench_max_new_tokens": p.eval_max_new_tokens}


def spec_bench_point(path: Path) -> dict:
    """A draft's Spec-Bench tau and setting from its `eyas eval --out` JSON (one result per setting)."""
    out = json.loads(path.read_text())
    by = {("chain" if x["setting"].startswith("chain-") else "tree"): x for x in out["results"]}
    return {"spec_bench_chain_tau": by["chain"]["tau"], "spec_bench_tree_tau": by["tree"]["tau"],
            "spec_bench_chain": by["chain"]["setting"], "spec_bench_tree": by["tree"]["setting"],
            "spec_bench_questions": out["questions"], "spec_bench_categories": sorted(by["tree"]["per_category"]),
            "spec_bench_max_new_tokens": by["tree"]["decode"]["max_new_tokens"],
            "spec_bench_compiled": by["tree"]["decode"].get("compiled")}
