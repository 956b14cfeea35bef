"""Plan `best-draft`: the best draft this recipe makes for a target: data, online training and Spec-Bench tau.

Steps, each recorded done in OUT/state.json; one cut by the budget continues on the next call (regenerate skips
the rows it wrote, train resumes from its last checkpoint, written every save_every steps):
  gen:regen  the dataset's first max_samples rows re-answered by the target (`eyas regenerate --backend native`).
  gen:self   self_prompts prompts the target writes (self:N), answered the same way.
  gen:task   up to task_prompts long-input tasks (summarize, key points, translate, QA over the passage, simplify)
             over the self-written answers (tasks:PATH), answered the same way; needs self before it.
  raw        the dataset's rows as they are (no generation).     `kinds` picks any of regen,self,task,raw.
  prep       one `eyas prepare` of the union of the kinds' rows (OUT/union.jsonl).
  train      online `eyas train`: TTT ttt_steps, batch_size rows x max_length tokens, epochs, lr (cosine), held-out
             simulated tau every eval_every steps (train's 5% split of the packed rows).
  eval:t0, eval:t1   `eyas eval` on Spec-Bench (eval_per_category questions a category, eval_max_new_tokens a turn;
             compiled at one KV bucket on a GPU) with chain eval_chain and tree eval_tree, at T=0 then T=1.
With warm_background (on a GPU), training's compiles run beside the data steps (`eyas train --warm-only` on
stand-in rows) and the evals' beside training (`eyas eval --warm-only` on its first draft), so inductor's on-disk
cache holds both when they start. OUT/result.json holds the recipe, tokens generated / prepared / trained, each
step's seconds, the held-out tau curve, Spec-Bench tau at T=0 and T=1 and whether the goals are met; result.png
plots the curve.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from eyas.recipes.recipe import Recipe, RecipeError
from eyas.recipes.runner import Runner
from eyas.recipes.stages import (check_switches, eval_flags, eval_setting, last_eval, prep_summary, resolved,
                                 source, spec_bench, spec_bench_point, train_continue)

GOALS = {"tree_tau_goal": 4.0, "chain_tau_goal": 2.6}
KINDS = ("regen", "self", "task", "raw")
# What decides the data, the draft or the measured tau: an OUT made with other values is refused, not mixed.
IDENTITY = ("target", "data", "kinds", "max_samples", "self_prompts", "task_prompts", "task_min_words", "new_tokens",
            "max_prompt", "gen_temperature", "gen_attention", "gen_graph", "max_length", "draft_vocab_size",
            "ttt_steps", "epochs", "lr", "batch_size", "train_args", "eval_chain", "eval_tree", "eval_per_category",
            "eval_categories", "eval_max_new_tokens")
TEMPERATURES = (0, 1)


def jsonl(path: Path):
    with open(path, encoding="utf-8") as f:
        yield from (json.loads(line) for line in f if line.strip())


def asked_rows(p, kind: str) -> int | None:
    """Input rows a generated kind is made of (max_samples / self_prompts / task_prompts)."""
    return {"regen": p.max_samples, "self": p.self_prompts, "task": p.task_prompts}.get(kind)


def kind_rows(p, kind: str):
    """OUT/KIND.jsonl's rows from the first asked_rows inputs: an OUT seeded with more rows than this recipe asks
    for (rows generated earlier, with the same settings) must not train on the rest."""
    limit = asked_rows(p, kind)
    return (row for row in jsonl(p.work / f"{kind}.jsonl") if limit is None or row.get("row", 0) < limit)


def generated_tokens(p, kind: str) -> int:
    """Target-written tokens of a kind's rows (answers; for self also the prompts), by the target's tokenizer."""
    from eyas.target import load_tokenizer

    tok = load_tokenizer(p.target)
    roles = ("user", "assistant") if kind == "self" else ("assistant",)
    texts = [m["content"] for row in kind_rows(p, kind) for m in row["messages"] if m["role"] in roles]
    return sum(len(ids) for i in range(0, len(texts), 2048)
               for ids in tok(texts[i:i + 2048], add_special_tokens=False)["input_ids"])


def write_union(p, kinds: list[str]) -> dict:
    """OUT/union.jsonl: the kinds' rows one after another; raw rows normalised as regenerate reads them (leading
    assistant turns skipped) and rejects left out. Returns rows per kind."""
    from eyas.data.sources import iter_conversations

    counts, tmp = {}, p.work / "union.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for kind in kinds:
            n = 0
            if kind == "raw":
                for rec in iter_conversations(p.data, p.max_samples, skip_leading_assistant=True):
                    if rec.ok and rec.messages:
                        out.write(json.dumps({"messages": rec.messages}, ensure_ascii=False) + "\n")
                        n += 1
            else:
                for row in kind_rows(p, kind):
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    n += 1
            counts[kind] = n
    tmp.replace(p.work / "union.jsonl")
    return counts


def train_flags(p) -> list[str]:
    """The `eyas train` flags that decide its compiled graphs (with the prepared rows' length and vocabulary): the
    run's and its warm-up's, from one place so the two agree."""
    return ["--online", "--target", p.target, "--ttt-steps", str(p.ttt_steps), "--batch-size", str(p.batch_size),
            "--lr", str(p.lr), "--seed", "0", "--device", p.device, *p.train_args.split()]


def train_args(r: Runner, p) -> list[str]:
    run = p.work / "run"
    return ["train", *train_flags(p), "--data", str(p.work / "prep"), "--out", str(run), "--epochs", str(p.epochs),
            "--eval-every", str(p.eval_every), "--eval-batches", str(p.eval_batches), "--save-every",
            str(p.save_every), *train_continue(r, "train", run), "--no-progress", "--no-tensorboard"]


def check_params(params: dict) -> list[str]:
    """The kinds, in an order that works, and a dataset for the kinds that read one."""
    check_switches(params)
    p = SimpleNamespace(**params)
    kinds = p.kinds.split(",")
    if not kinds or set(kinds) - set(KINDS) or len(set(kinds)) < len(kinds):
        raise RecipeError(f"kinds={p.kinds}: give distinct kinds among {', '.join(KINDS)}")
    if "task" in kinds and ("self" not in kinds or kinds.index("self") > kinds.index("task")):
        raise RecipeError(f"kinds={p.kinds}: task is made from the self-written answers: put self before it")
    from eyas.data.sources import BUILTIN_DATASETS

    if {"regen", "raw"} & set(kinds) and not (Path(p.data).is_file() or p.data in BUILTIN_DATASETS):
        raise RecipeError(f"data={p.data}: no such file (ShareGPT JSON/JSONL or a built-in name; kinds regen and "
                          "raw read it)")
    return kinds


def steps(kinds: list[str]) -> list[str]:
    return [f"gen:{k}" for k in kinds if k != "raw"] + ["prep", "train", *(f"eval:t{t}" for t in TEMPERATURES)]


def run_plan(r: Runner, recipe: Recipe) -> dict:
    p = resolved(recipe.params)
    p.work = r.work
    kinds = check_params(recipe.params)
    run_steps(r, p, kinds)
    r.reap(wait=True)
    return result(r, p, kinds)


def run_steps(r: Runner, p, kinds: list[str]) -> None:
    """The steps in order, with the warm-ups beside them (warm_background)."""
    from eyas.decode.prewarm import Prewarm, train_warm

    st = r.state
    warm = p.warm_background and not r.done("train")
    tw = train_warm(p.work / "train-warm", p.max_length, p.draft_vocab_size, train_flags(p)) \
        if warm and not r.done("prep") else None   # only while data steps are left to overlap with
    ready = False
    try:
        ready = data_steps(r, p, kinds)
    finally:
        if tw is not None:   # the training waits for it (bounded): never two compiles of the same graphs at once
            st["train_warm"] = tw.finish_waited(timeout=min(240.0, max(0.0, r.left() - p.train_need)) if ready else 0)
            r.save()
    if not ready:
        return
    ew = None
    if warm and p.eval_compile and not all(r.done(f"eval:t{t}") for t in TEMPERATURES):
        ew = Prewarm(p.work / "run", p.work / "eval-warm", eval_flags(p))
    trained = False
    try:
        trained = r.eyas("train", *train_args(r, p), need=p.train_need)
    finally:
        if ew is not None:   # the evals wait for it (bounded), and none is left running after a cut training
            st["eval_warm"] = ew.finish(timeout=min(300.0, max(0.0, r.left() - 60)) if trained else 0)
            r.save()
    if trained:
        for t in TEMPERATURES:   # in order: a t0 cut by the budget leaves t1 to the next call; side by side on a GPU
            if not spec_bench(r, p, f"eval:t{t}", p.work / "run", p.work / f"eval-t{t}.json", temperature=t,
                              background=p.eval_parallel):
                break


def data_steps(r: Runner, p, kinds: list[str]) -> bool:
    """gen (per kind), the generated-token counts, union.jsonl and prep; True when prep is done."""
    st = r.state
    for kind in kinds:
        if kind != "raw" and not source(r, p, kind, asked_rows(p, kind)):
            return False
    for kind in kinds:   # counted once, while the rows are here
        if kind != "raw" and kind not in st.setdefault("tokens_generated", {}):
            st["tokens_generated"][kind] = generated_tokens(p, kind)
            r.save()
    if not r.done("prep") and r.left() >= 20:
        st["union_rows"] = write_union(p, kinds)
    if not r.eyas("prep", "prepare", "--target", p.target, "--data", str(p.work / "union.jsonl"), "--out",
                  str(p.work / "prep"), "--max-length", str(p.max_length), "--draft-vocab-size",
                  str(p.draft_vocab_size), "--workers", "0", "--overwrite", "--json"):
        return False
    if "prep" not in st:
        st["prep"] = prep_summary(p.work / "prep") or {}
        if not st["prep"].get("rows_out"):
            raise RecipeError(f"{p.work / 'prep'}: no usable rows in union.jsonl; see its .errors.jsonl")
        r.save()
    return True


def curve(p, prep: dict | None) -> list[dict]:
    """Held-out simulated tau (chain ttt_steps) per evaluated step, with the training tokens seen by then."""
    m = p.work / "run" / "metrics.jsonl"
    per_row = prep["tokens"] / max(1, prep["packed_rows"]) if prep else 0.0
    return [{"step": x["step"], "tokens": round(x["step"] * p.batch_size * per_row), "tau": x["tau"]}
            for x in (jsonl(m) if m.is_file() else []) if x.get("split") == "eval"]


def plot(points: list[dict], spec: dict, png: Path, ttt: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([q["tokens"] for q in points], [q["tau"] for q in points], marker="o", label=f"held-out chain-{ttt}")
    for (key, goal), c in zip((("tree", GOALS["tree_tau_goal"]), ("chain", GOALS["chain_tau_goal"])), ("C1", "C2")):
        ax.axhline(goal, color=c, ls=":", label=f"{key} goal {goal}")
        if "t0" in spec:
            ax.plot([points[-1]["tokens"]], [spec["t0"][f"{key}_tau"]], marker="*", ms=14, color=c, ls="",
                    label=f"Spec-Bench T=0 {spec['t0'][key]}")
    ax.set(xlabel="training tokens", ylabel="tau", title="best draft: held-out curve and Spec-Bench tau")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def result(r: Runner, p, kinds: list[str]) -> dict:
    r.record_call()   # the result reports this call too
    st = r.state
    spec = {}
    for t in TEMPERATURES:
        if r.done(f"eval:t{t}"):
            path = p.work / f"eval-t{t}.json"
            q = spec_bench_point(path)
            spec[f"t{t}"] = {"chain_tau": q["spec_bench_chain_tau"], "tree_tau": q["spec_bench_tree_tau"],
                             "chain": q["spec_bench_chain"], "tree": q["spec_bench_tree"], "temperature": t,
                             "questions": q["spec_bench_questions"], "max_new_tokens": q["spec_bench_max_new_tokens"],
                             "compiled": q["spec_bench_compiled"], "seconds": r.seconds(f"eval:t{t}"),
                             "settings": eval_details(path)}
    prep, pts = st.get("prep"), curve(p, st.get("prep"))
    t0 = spec.get("t0", {})
    goals = {**GOALS, "tree_tau_met": t0["tree_tau"] >= GOALS["tree_tau_goal"] if t0 else None,
             "chain_tau_met": t0["chain_tau"] >= GOALS["chain_tau_goal"] if t0 else None}
    png = p.work / "result.png"
    if pts:
        plot(pts, spec, png, p.ttt_steps)
    total = st.get("seconds_total", 0.0)
    tokens = {"generated": st.get("tokens_generated", {}), "union_rows": st.get("union_rows"),
              **{k: prep and prep.get(f) for k, f in (("prepared", "tokens"), ("loss", "masked_tokens"),
                                                     ("packed_rows", "packed_rows"))},
              "trained": pts[-1]["tokens"] if pts else None, "rows_out": prep and prep.get("rows_out")}
    ev = last_eval(p.work / "run")
    left = [s for s in steps(kinds) if not r.done(s)]
    out = {"bench": "best_draft", "complete": not left, "left": left, "kinds": kinds, "tokens": tokens,
           "recipe": {k: str(v) if isinstance(v, Path) else v for k, v in vars(p).items()},
           "step_seconds": st.get("seconds", {}), "finished_at": st.get("finished_at", {}),
           "calls": st.get("calls", []), "seconds_total": total,
           "held_out_curve": pts, "held_out_tau_best": max((q["tau"] for q in pts), default=None),
           "held_out_last": ev and {"step": ev.get("step"), "tau": ev["tau"], "acc": ev.get("acc")},
           "spec_bench": spec, "eval": eval_setting(p), "goals": goals,
           "train_warm": st.get("train_warm"), "eval_warm": st.get("eval_warm"),
           "files": {"result": str(p.work / "result.json"), "draft": str(p.work / "run"),
                     **({"plot": str(png)} if pts else {})}}
    (p.work / "result.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    return out


def eval_details(path: Path) -> dict:
    """Per setting of an `eyas eval` JSON what a reader of the tau asks next: acceptance by position, tau by
    category, tok/s, and at T=0 the lossless check (identical and tie-aware identical rates, divergences
    not explained by a logit tie, and the recheck's verdicts on them)."""
    keys = ("tau", "accept_per_position", "tokens_per_s", "baseline_tokens_per_s", "speedup", "identical_rate",
            "tie_aware_identical_rate", "unexplained_divergences", "unexplained_numerics", "unexplained_decoder",
            "unexplained_unchecked")
    return {x["setting"]: {**{k: x[k] for k in keys if k in x},
                           "tau_by_category": {c: round(v["tau"], 3) for c, v in sorted(x["per_category"].items())},
                           **first_per_category(x.get("turns") or [])}
            for x in json.loads(path.read_text())["results"]}


def first_per_category(turns: list[dict]) -> dict:
    """With eval_per_category > 1: tau over each category's first question alone (its turns), which is the
    question set a one-per-category eval takes (load_bench keeps file order), so the tau compares with it."""
    first: dict[str, int] = {}
    for t in turns:
        first.setdefault(t["category"], t["question_id"])
    sel = [t for t in turns if first[t["category"]] == t["question_id"]]
    if len(sel) == len(turns) or not sum(t["steps"] for t in sel):
        return {}
    return {"first_per_category": {"tau": sum(t["emitted"] for t in sel) / sum(t["steps"] for t in sel),
                                   "questions": len(first), "turns": len(sel)}}
