"""The best SmolLM2-135M draft this recipe makes (issue 13): data, training and Spec-Bench tau in one resumable script.

Goal: Spec-Bench tree(60,7,10) tau >= 4.0 and chain-3 tau >= 2.6 at T=0; tau at T=1 is reported too. On the GPU
repeat the SAME command (each call <= 600 s) until it prints "all steps done":
    PYTHONPATH=src python bench/best_draft.py --work /tmp/best_draft --budget-s 540 --out $OUT/best_draft.json
(target /tmp/smol-hf and ShareGPT /tmp/sharegpt.json as bench/gpu_carry.sh recv leaves them; the call's timeout_s 600)
    PYTHONPATH=src python bench/best_draft.py --tiny --work /tmp/bd-tiny --out /tmp/bd-tiny.json   # CPU, minutes
Steps, each recorded done in WORK/state.json; one cut by --budget-s continues on the next call (regenerate skips
the rows it wrote, train resumes from its last checkpoint, written every --save-every steps):
  gen:regen  ShareGPT (--data, first --rows rows) re-answered by the target, greedy (`eyas regenerate --backend
             native`). gen:self  --self-prompts prompts the target writes (self:N), answered the same way. raw: the
             ShareGPT rows as they are (no generation). gen:task  up to --task-prompts long-input tasks (summarize,
             key points, translate, QA over the passage, simplify) over the self-written answers (`tasks:PATH`),
             answered the same way; needs self before it. --kinds picks any of regen,self,task,raw.
  prep       one `eyas prepare` of the union of the kinds' rows (WORK/union.jsonl: prepare reads one file).
  train      online `eyas train`, TTT --ttt, --batch rows x --max-length tokens, --epochs, --lr (cosine), held-out
             simulated tau every --eval-every steps (train's 5% split of the packed rows).
  eval:t0, eval:t1   `eyas eval` on Spec-Bench (--eval-per-category per category, --eval-max-new-tokens tokens a
             turn; compiled at one KV bucket on a GPU, --no-eval-compile for eager) with chain --eval-chain and
             tree --eval-tree, at T=0 then T=1.
A run of one kind with bench/scaling.py's recipe (--epochs 2) is also that kind's scaling point: scaling.py
--merge takes this JSON (e.g. --kinds self --self-prompts 75000 --epochs 2: the self curve's ~30M-token end); a
run of several kinds is a point of its own kind ("regen+self").
The JSON (--out, rewritten every call) holds the recipe, tokens generated / prepared / trained, per-step seconds,
the held-out tau curve, Spec-Bench tau at T=0 and T=1 and whether the goals are met; gpu_seconds_total sums the wall
seconds of every call that ran a step (the machine's start and the transfers are not in it).
Expected on one H200 (defaults; from: native regenerate ~35k generated tok/s at batch 512, online training with
the compiled hot paths ~100-137k tok/s at 8 x 2,048 (bench/train_online.py; 64-80k on 1,024-token rows), eager
Spec-Bench 1-3 min per setting): gen:regen ~3 min (9k rows ~ 3.7M tokens + start), gen:self ~4-5 min (20k prompts
~ 7M tokens), prep < 1 min, train ~5-7 min (~11M tokens x 3 epochs), eval:t0 and eval:t1 ~2-6 min each: ~20-25 min,
one session given to it alone (bench/GPU.md), or two.
Across sessions (/tmp is gone after one), pack WORK at the end of the last call that trains or evaluates:
    python bench/best_draft.py --work /tmp/best_draft --pack /tmp/bd [--pack-data]   # parts <= 15 MiB + manifest.json
(state.json, evals, metrics, the best draft, the latest checkpoint while train is not done; --pack-data adds the
generated rows, else unpack marks gen/prep to be redone - greedy: the same rows). The draft's embedding is the
target's: left out, rebuilt on unpack and checked against the packed sha256. Sizes: a trained draft ~6 parts (fp32
weights), mid-training ~18-25 (the checkpoint's Adam state is 180 MiB). $OUT takes 64 MiB a call, so bring them back
4 parts a call on back-to-back calls: `cp /tmp/bd/manifest.json /tmp/bd/best_draft.tgz.0[0-3] $OUT/`, then
`.0[4-7]`, ... Next session carry them in (the tree + carried paths <= 64 MiB a call: ~3 parts a call, each call
its own ignored folder .carry/bdK, moved with `mkdir -p /tmp/bd; cp .carry/bdK/* /tmp/bd/`), then once
    python bench/best_draft.py --work /tmp/best_draft --unpack /tmp/bd    # same recipe flags; checks every sha256
and the usual command, repeated until "all steps done".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
import _bd_pack as P  # noqa: E402
import scaling as S  # noqa: E402
from _emit import emit  # noqa: E402

GOALS = {"tree_tau_goal": 4.0, "chain_tau_goal": 2.6}
KINDS = ("regen", "self", "task", "raw")
# What decides the data, the draft or the measured tau: a WORK made with other values is refused, not mixed.
RECIPE = ("target", "data", "kinds", "rows", "self_prompts", "task_prompts", "task_min_words", "new_tokens",
          "max_prompt", "gen_temperature", "gen_attention", "gen_graph",
          "max_length", "vocab", "ttt", "epochs", "lr", "batch", "train_args", "eval_chain", "eval_tree",
          "eval_per_category", "eval_categories", "eval_max_new_tokens")


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Steps(S.Runner):
    """scaling's Runner (which adds up each step's seconds over every call it ran in and notes the steps this call
    started in `ran`), also noting when each step finished."""

    def count(self, name: str, seconds: float, ok: bool) -> None:
        if ok:
            self.state.setdefault("finished_at", {})[name] = now()
        super().count(name, seconds, ok)   # saves the state
        if ok:
            print(f"[best_draft] step {name} done in {self.state['seconds'][name]:.0f} s", flush=True)


def recipe(a) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in ((k, getattr(a, k)) for k in RECIPE)}


def check_recipe(state: dict, a, where: str) -> None:
    theirs, ours = state.get("recipe"), recipe(a)
    diff = [k for k in RECIPE if theirs is not None and theirs.get(k) != ours[k]]
    if diff:
        k = diff[0]
        raise SystemExit(f"{where} was made with another recipe: {k}={theirs.get(k)!r} there, {ours[k]!r} now"
                         f"{f' (also {diff[1:]})' if diff[1:] else ''}; give the same flags or another --work")
    state["recipe"] = ours


def jsonl(path: Path):
    with open(path, encoding="utf-8") as f:
        yield from (json.loads(line) for line in f if line.strip())


def asked_rows(a, kind: str) -> int | None:
    """Input rows a generated kind is made of (its --rows / --self-prompts / --task-prompts)."""
    return {"regen": a.rows, "self": a.self_prompts, "task": a.task_prompts}.get(kind)


def kind_rows(a, kind: str):
    """WORK/KIND.jsonl's rows from the first asked_rows inputs: a WORK seeded with an earlier session's rows
    (gpu_session.sh's seed_carried) may hold more than this run asks for, and the run must not train on them."""
    limit = asked_rows(a, kind)
    return (row for row in jsonl(a.work / f"{kind}.jsonl") if limit is None or row.get("row", 0) < limit)


def generated_tokens(a, kind: str) -> int:
    """Target-written tokens of a kind's rows (answers; for self also the prompts), by the target's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.target)
    roles = ("user", "assistant") if kind == "self" else ("assistant",)
    texts = [m["content"] for row in kind_rows(a, kind) for m in row["messages"] if m["role"] in roles]
    return sum(len(ids) for i in range(0, len(texts), 2048)
               for ids in tok(texts[i:i + 2048], add_special_tokens=False)["input_ids"])


def write_union(a, kinds: list[str]) -> dict:
    """WORK/union.jsonl: the kinds' rows one after another; raw rows normalised as regenerate reads them (leading
    assistant turns skipped) and rejects left out. Returns rows per kind."""
    from eyas.data.sources import iter_conversations

    counts, tmp = {}, a.work / "union.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for kind in kinds:
            n = 0
            if kind == "raw":
                for rec in iter_conversations(a.data, a.rows, skip_leading_assistant=True):
                    if rec.ok and rec.messages:
                        out.write(json.dumps({"messages": rec.messages}, ensure_ascii=False) + "\n")
                        n += 1
            else:
                for row in kind_rows(a, kind):
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    n += 1
            counts[kind] = n
    tmp.replace(a.work / "union.jsonl")
    return counts


def train_flags(a) -> list[str]:
    """The `eyas train` flags that decide its compiled graphs (with the prepared rows' length and vocabulary): the
    run's and its warm-up's, from one place so the two agree."""
    return ["--online", "--target", a.target, "--ttt-steps", str(a.ttt), "--batch-size", str(a.batch), "--lr",
            str(a.lr), "--seed", "0", "--device", a.device, *a.train_args.split()]


def train_args(a, run: Path) -> list[str]:
    from eyas.train.checkpoint import latest_checkpoint

    # Resume from a checkpoint; a run killed before its first one left metrics only: start it over.
    cont = ["--resume"] if latest_checkpoint(run) else ["--overwrite"] if (run / "metrics.jsonl").exists() else []
    return ["train", *train_flags(a), "--data", str(a.work / "prep"), "--out", str(run), "--epochs", str(a.epochs),
            "--eval-every", str(a.eval_every), "--eval-batches", str(a.eval_batches), "--save-every",
            str(a.save_every), *cont, "--no-progress", "--no-tensorboard"]


def run_steps(r: Steps, a, kinds: list[str]) -> None:
    """The steps in order; with --warm-background, training's compiles run beside the data steps (`eyas train
    --warm-only` on stand-in rows) and the evals' beside training (`eyas eval --warm-only` on its first draft), as
    the GPU demo does: inductor's on-disk cache then holds both when they start (~1 min and ~2 min on the H200)."""
    from eyas.decode.prewarm import Prewarm, train_warm

    st = r.state
    warm = a.warm_background and "train" not in st["done"]
    # (only while data steps are left to overlap with: otherwise the training compiles its own graphs)
    tw = train_warm(a.work / "train-warm", a.max_length, a.vocab, train_flags(a)) \
        if warm and "prep" not in st["done"] else None
    ready = False
    try:
        ready = data_steps(r, a, kinds)
    finally:
        if tw is not None:   # the training waits for it (bounded): never two compiles of the same graphs at once
            st["train_warm"] = tw.finish_waited(timeout=min(240.0, max(0.0, r.left() - a.train_need)) if ready else 0)
            r.save()
    if not ready:
        return
    ew = None
    if warm and a.eval_compile and not all(f"eval:t{t}" in st["done"] for t in (0, 1)):
        ew = Prewarm(a.work / "run", a.work / "eval-warm", S.eval_flags(a))
    trained = False
    try:
        trained = r.eyas("train", *train_args(a, a.work / "run"), need=a.train_need)
    finally:
        if ew is not None:   # the evals wait for it (bounded), and none is left running after a cut training
            st["eval_warm"] = ew.finish(timeout=min(300.0, max(0.0, r.left() - 60)) if trained else 0)
            r.save()
    if trained:
        run_evals(r, a)


def data_steps(r: Steps, a, kinds: list[str]) -> bool:
    """gen (per kind), the generated-token counts, union.jsonl and prep; True when prep is done."""
    st = r.state
    for kind in kinds:
        if kind != "raw" and not S.source(r, kind, asked_rows(a, kind)):
            return False
    for kind in kinds:   # counted once, while the rows are here (a pack without them keeps the counts)
        if kind != "raw" and kind not in st.setdefault("tokens_generated", {}):
            st["tokens_generated"][kind] = generated_tokens(a, kind)
            r.ran.append(f"count:{kind}")
            r.save()
    if "prep" not in st["done"] and r.left() >= 20:
        st["union_rows"] = write_union(a, kinds)
    if not r.eyas("prep", "prepare", "--target", a.target, "--data", str(a.work / "union.jsonl"), "--out",
                  str(a.work / "prep"), "--max-length", str(a.max_length), "--draft-vocab-size", str(a.vocab),
                  "--workers", "0", "--overwrite", "--json"):
        return False
    if "prep" not in st:
        st["prep"] = json.loads((a.work / "prep" / "manifest.json").read_text())["summary"]
        if not st["prep"].get("rows_out"):
            raise SystemExit(f"{a.work / 'prep'}: no usable rows in union.jsonl; see its .errors.jsonl")
        r.save()
    return True


def run_evals(r: Steps, a) -> bool:
    """eval:t0 then eval:t1; with --eval-parallel (default on a GPU) both at once: an eval leaves the GPU mostly
    idle (eager: bound by the host's launches, ~36 tok/s of baseline on the H200; compiled: one sequence at a
    time), and tau is not a time, so two side by side cost about the wall time of one."""
    for t in (0, 1):   # in order: a t0 cut by the budget leaves t1 to the next call
        if not S.spec_bench(r, "best", f"t{t}", temperature=t, name=f"eval:t{t}", draft=a.work / "run",
                            background=a.eval_parallel):
            break
    r.reap(wait=True)
    return all(f"eval:t{t}" in r.state["done"] for t in (0, 1))


def curve(a, prep: dict | None) -> list[dict]:
    """Held-out simulated tau (chain --ttt) per evaluated step, with the training tokens seen by then."""
    m = a.work / "run" / "metrics.jsonl"
    per_row = prep["tokens"] / max(1, prep["packed_rows"]) if prep else 0.0
    return [{"step": x["step"], "tokens": round(x["step"] * a.batch * per_row), "tau": x["tau"]}
            for x in (jsonl(m) if m.is_file() else []) if x.get("split") == "eval"]


def plot(points: list[dict], spec: dict, png: Path, ttt: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([p["tokens"] for p in points], [p["tau"] for p in points], marker="o", label=f"held-out chain-{ttt}")
    for (key, goal), c in zip((("tree", GOALS["tree_tau_goal"]), ("chain", GOALS["chain_tau_goal"])), ("C1", "C2")):
        ax.axhline(goal, color=c, ls=":", label=f"{key} goal {goal}")
        if "t0" in spec:
            ax.plot([points[-1]["tokens"]], [spec["t0"][f"{key}_tau"]], marker="*", ms=14, color=c, ls="",
                    label=f"Spec-Bench T=0 {spec['t0'][key]}")
    ax.set(xlabel="training tokens", ylabel="tau", title="best_draft: held-out curve and Spec-Bench tau")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def result(r: Steps, a, kinds: list[str], done: bool) -> dict:
    st = r.state
    spec = {}
    for t in ("t0", "t1"):
        if f"eval:{t}" in st["done"]:
            p = S.spec_bench_point(a.work / f"eval-best-{t}.json")
            spec[t] = {"chain_tau": p["spec_bench_chain_tau"], "tree_tau": p["spec_bench_tree_tau"],
                       "chain": p["spec_bench_chain"], "tree": p["spec_bench_tree"], "temperature": int(t[1]),
                       "questions": p["spec_bench_questions"], "max_new_tokens": p["spec_bench_max_new_tokens"],
                       "compiled": p["spec_bench_compiled"],
                       "seconds": st["seconds"].get(f"eval:{t}"),
                       "settings": eval_details(a.work / f"eval-best-{t}.json")}
    prep, pts = st.get("prep"), curve(a, st.get("prep"))
    t0 = spec.get("t0", {})
    goals = {**GOALS, "tree_tau_met": t0["tree_tau"] >= GOALS["tree_tau_goal"] if t0 else None,
             "chain_tau_met": t0["chain_tau"] >= GOALS["chain_tau_goal"] if t0 else None}
    if pts:
        plot(pts, spec, a.out.with_suffix(".png"), a.ttt)
    gpu = st.get("gpu_seconds_total", 0.0)
    tokens = {"generated": st.get("tokens_generated", {}), "union_rows": st.get("union_rows"),
              **{k: prep and prep[f] for k, f in (("prepared", "tokens"), ("loss", "masked_tokens"),
                                                 ("packed_rows", "packed_rows"))},
              "trained": pts[-1]["tokens"] if pts else None, "rows_out": prep and prep.get("rows_out")}
    return {"bench": "best_draft", "complete": done, "kinds": kinds, "tokens": tokens,
            "recipe": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
            "step_seconds": st.get("seconds", {}), "finished_at": st.get("finished_at", {}),
            "calls": st.get("calls", []), "gpu_seconds_total": round(gpu, 1), "gpu_minutes_total": round(gpu / 60, 2),
            "held_out_curve": pts, "held_out_tau_best": max((p["tau"] for p in pts), default=None),
            "held_out_last": last_eval_of(a.work / "run"),
            "spec_bench": spec, "eval": S.eval_setting(a), "goals": goals,
            "train_warm": st.get("train_warm"), "eval_warm": st.get("eval_warm"),
            "png": str(a.out.with_suffix(".png")) if pts else None}


def last_eval_of(run: Path) -> dict | None:
    """The run's last held-out eval (step, tau, acc): the draft bench/scaling.py merges as a point."""
    ev = S.last_eval(run)
    return ev and {"step": ev.get("step"), "tau": ev["tau"], "acc": ev.get("acc")}


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
    """With --eval-per-category > 1: tau over each category's first question alone (its turns), which is the
    question set a one-per-category eval takes (load_bench keeps file order), so the earlier runs' tau compares."""
    first: dict[str, int] = {}
    for t in turns:
        first.setdefault(t["category"], t["question_id"])
    sel = [t for t in turns if first[t["category"]] == t["question_id"]]
    if len(sel) == len(turns) or not sum(t["steps"] for t in sel):
        return {}
    return {"first_per_category": {"tau": sum(t["emitted"] for t in sel) / sum(t["steps"] for t in sel),
                                   "questions": len(first), "turns": len(sel)}}


def main(argv: list[str] | None = None) -> int:
    t_call = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--target", default="/tmp/smol-hf", help="target HF dir (--tiny: whose tokenizer the tiny target takes)")
    add("--data", default="/tmp/sharegpt.json", help="ShareGPT JSON/JSONL (or built-in 'sharegpt')")
    add("--work", type=Path, default=Path("/tmp/best_draft"))
    add("--out", type=Path, default=S.ROOT / "bench" / "results" / "best_draft.json")
    add("--kinds", default="regen,self", help=f"any of {','.join(KINDS)}")
    add("--rows", type=int, default=9000, help="ShareGPT rows (regen, raw)")
    add("--self-prompts", type=int, default=20000, help="target-written prompts (self)")
    add("--task-prompts", type=int, default=20000, help="long-input task prompts over the self-written answers (task)")
    add("--task-min-words", type=int, default=40, help="shorter self-written answers make no task (task)")
    add("--budget-s", type=float, default=540, help="start no step after this many seconds")
    add("--device", default=None)
    add("--gen-batch", type=int, default=512)
    add("--gen-attention", choices=("sdpa", "flex"), default="flex",
        help="the generator's decode step (flex: 1.5x sdpa at batch 512 on the H200)")
    add("--gen-graph", choices=("auto", "cudagraph", "compile", "eager"), default="auto",
        help="the generator's step graph (compile: 72.6k tok/s with flex at batch 512 on the H200 against 51.5k, "
             "after a ~36-s compile: for tens of millions of tokens)")
    add("--new-tokens", type=int, default=512, help="max new tokens per generated turn")
    add("--max-prompt", type=int, default=1536)
    add("--gen-temperature", type=float, default=0.0, help="answers' temperature (0 = greedy)")
    # 8 x 2,048 tokens a step: multi-turn answers are not cut at 1,024 and the draft sees the positions
    # Spec-Bench's long prompts reach; 8 rows rather than 4 because a step of the compiled trainer costs little more
    # (bench/train_online.py: 137k tok/s at 8 rows, 101k before compiling)
    add("--max-length", type=int, default=2048)
    add("--batch", type=int, default=8)
    add("--vocab", type=int, default=32000)
    add("--ttt", type=int, default=7)
    add("--epochs", type=float, default=3.0)
    add("--lr", type=float, default=1e-3)
    add("--train-args", default="", help="extra `eyas train` flags")
    add("--save-every", type=int, default=200, help="checkpoint interval (steps): what a cut call can lose")
    add("--eval-every", type=int, default=400, help="held-out tau every N steps (the curve)")
    add("--eval-batches", type=int, default=32, help="held-out batches per evaluation")
    add("--train-need", type=float, default=150, help="start train only with this many seconds left")
    add("--eval-chain", type=int, default=3)
    add("--eval-tree", default="total=60,depth=7,topk=10")
    add("--eval-per-category", type=int, default=1)
    add("--eval-categories", default="", help="comma-separated (default: all 13)")
    add("--eval-max-new-tokens", type=int, default=256)
    add("--eval-compile", action=argparse.BooleanOptionalAction, default=None,
        help="compiled eval at one KV bucket (default: on a GPU; an eager one ran at ~36 tok/s beside another)")
    add("--eval-min-bucket", type=int, default=1_000_000, help="compiled eval's smallest KV bucket")
    add("--eval-est-s", type=float, default=180, help="an eval's seconds until one has been timed here")
    add("--eval-parallel", action=argparse.BooleanOptionalAction, default=None,
        help="run eval:t0 and eval:t1 side by side (default: on a GPU)")
    add("--warm-background", action=argparse.BooleanOptionalAction, default=None,
        help="training's compiles beside the data steps, the evals' beside training (default: on a GPU)")
    add("--tiny", action="store_true", help="CPU check: random 2-layer target, tiny sizes")
    add("--pack", type=Path, default=None, help="write WORK's state as parts + manifest.json here, then exit")
    add("--pack-data", action="store_true", help="--pack: add the generated rows")
    add("--unpack", type=Path, default=None, help="restore WORK from a --pack dir, then exit")
    a = ap.parse_args(argv)
    if a.tiny:
        ap.set_defaults(rows=40, self_prompts=12, task_prompts=12, task_min_words=1, gen_batch=8, new_tokens=24,
                        max_prompt=256, gen_temperature=1.0,
                        max_length=256, vocab=512, ttt=2, epochs=3.0, batch=2, device="cpu", save_every=2, eval_every=4,
                        eval_batches=2, train_need=20, eval_chain=2, eval_tree="total=6,depth=3,topk=2",
                        eval_max_new_tokens=16, eval_est_s=60, eval_categories="writing,coding")  # as scaling's --tiny
        a = ap.parse_args(argv)
    a.work, a.out, a.skip_eval = a.work.resolve(), a.out.resolve(), False   # skip_eval: scaling's eval_setting
    kinds = a.kinds.split(",")
    if not kinds or set(kinds) - set(KINDS) or len(set(kinds)) < len(kinds):
        raise SystemExit(f"--kinds {a.kinds}: give distinct kinds among {', '.join(KINDS)}")
    if "task" in kinds and ("self" not in kinds or kinds.index("self") > kinds.index("task")):
        raise SystemExit(f"--kinds {a.kinds}: task is made from the self-written answers: put self before it")
    a.work.mkdir(parents=True, exist_ok=True)
    if a.tiny:
        a.target = S.tiny_target(a.work, a.target)
    a.device = a.device or ("cuda" if __import__("torch").cuda.is_available() else "cpu")
    a.eval_parallel = a.device.startswith("cuda") if a.eval_parallel is None else a.eval_parallel
    a.eval_compile = a.device.startswith("cuda") if a.eval_compile is None else a.eval_compile
    a.warm_background = a.device.startswith("cuda") if a.warm_background is None else a.warm_background
    if a.unpack:
        P.unpack(a, check_recipe)
        return 0
    if a.pack:
        P.pack(a, packed_at=now())
        return 0
    from eyas.data.sources import BUILTIN_DATASETS

    if {"regen", "raw"} & set(kinds) and not (Path(a.data).is_file() or a.data in BUILTIN_DATASETS):
        raise SystemExit(f"--data {a.data}: no such file (ShareGPT JSON/JSONL, needed by kinds regen and raw)")
    r = Steps(a)
    check_recipe(r.state, a, str(a.work))
    r.save()
    before = set(r.state["done"])
    run_steps(r, a, kinds)
    steps = [f"gen:{k}" for k in kinds if k != "raw"] + ["prep", "train", "eval:t0", "eval:t1"]
    done = all(s in r.state["done"] for s in steps)
    if r.ran:   # a call that did work: its wall seconds are GPU seconds
        wall = round(time.perf_counter() - t_call, 1)
        r.state.setdefault("calls", []).append({"at": now(), "seconds": wall, "ran": r.ran,
                                                "finished": sorted(set(r.state["done"]) - before)})
        r.state["gpu_seconds_total"] = round(r.state.get("gpu_seconds_total", 0.0) + wall, 1)
        r.save()
    emit(result(r, a, kinds, done), a.out)
    left = [s for s in steps if s not in r.state["done"]]
    print("all steps done" if done else f"[best_draft] to do: {', '.join(left)}; run the same command again",
          flush=True)
    if not done and not r.ran:
        print(f"[best_draft] no progress this call: --budget-s {a.budget_s:g} is too short for {left[0]}")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
