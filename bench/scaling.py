"""Held-out tau against training tokens for raw / regenerated / self-generated data (EAGLE-3's scaling figure).

    PYTHONPATH=src python bench/scaling.py --data SHAREGPT.json --work runs/scaling --budget-s 540 \
        --out bench/results/scaling.json            # repeat the same command until it prints "all steps done"
    PYTHONPATH=src python bench/scaling.py --tiny --work /tmp/scaling-tiny --out /tmp/scaling-tiny.json   # CPU
Add --skip-eval to train only (a later call on the same --work without it runs the missing evals).

Steps, each resumable and each recorded as done in WORK/state.json, so the run spreads over several calls of
at most --budget-s seconds (a step cut by the budget continues next call: regenerate skips finished rows,
train resumes from its last checkpoint):
  gen:KIND    regenerated (ShareGPT re-answered) or self (self:N prompts the target writes, then answers) rows,
              through `eyas regenerate --backend native`; raw needs none.
  prep:KIND:S `eyas prepare` of the first rows holding ~S tokens (rows estimated from the kind's tokens/row).
  train:KIND:S online `eyas train` for --epochs over those tokens; held-out simulated chain-K tau is the
              last held-out eval in metrics.jsonl (K = --ttt).
  eval:KIND:S measured Spec-Bench tau at T=0 of that draft (`eyas eval`; compiled at one KV bucket on a GPU,
              --no-eval-compile for eager: an eager eval beside a training ran at ~36 tok/s on the H200, 320-380 s
              a point, where a compiled one decodes at ~400 tok/s and its warm-up comes from inductor's cache after
              the first point): --eval-chain and --eval-tree over --eval-per-category questions per category
              (--eval-categories: all 13), all their turns, --eval-max-new-tokens each.
              Not resumable inside, so it starts only when the budget still holds 1.5x the longest eval seen
              in WORK (--eval-est-s before the first); one that does not fit waits for a later call while the
              next points train (training resumes from checkpoints, an eval cannot). On a GPU it runs in the
              background beside the next point's training (--eval-background; its output in
              WORK/eval-KIND-S.log), and every eval after the first reuses the first one's AR baseline
              (--baseline-cache WORK/baseline-cache).
Each point: kind, size, tokens, rows, tau (simulated), acc, steps, train_seconds; after its eval also
spec_bench_chain_tau, spec_bench_tree_tau, eval_seconds and the setting they were measured under
(spec_bench_chain, _tree, _questions, _categories, _max_new_tokens; also the JSON's "eval"; spec_bench_compiled
says how it decoded, which moves tau only through bf16 ties).
A call that can start no step in its budget (and is not done) exits 3 ("no step fits"), so a loop of calls stops
instead of calling again with less time (bench/gpu_session.sh's loops: a GPU idled ~335 s in 48 such calls once).
After each call the JSON (points so far) and a PNG (left: held-out simulated tau, right: Spec-Bench tree tau
(solid) and chain tau (dashed); tokens on a log x, one colour per kind) are rewritten. Held-out rows are each
kind's own 5% split; Spec-Bench is the same questions for every kind.
Over several GPU sessions (a machine's /tmp is gone between them): each session computes a few points
(`--kinds raw --sizes 1e6,3e6`, ...) with `--merge` the previous session's JSON, whose points are kept (one without
Spec-Bench tau is computed again when this call evaluates, and this call's point replaces it; another eval setting
is refused). A bench/best_draft.py JSON of one kind and the same recipe merges as that kind's point at its
prepared tokens (its T=0 Spec-Bench tau; `size` is its token count): the largest self point is that run. A run of
several kinds is a point of its own ("regen+self"), and a run evaluated on 2 questions a category gives the tau of
the first question of each (its per-turn records), the curve's 13 questions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
from _emit import emit  # noqa: E402
from _scaling_points import (RECIPE_KEYS, check_eval_settings, eval_setting, merged_points,  # noqa: E402
                             plot, spec_bench_point)

ROOT = Path(__file__).resolve().parent.parent
END_TILT = 2.5


def tiny_target(path: Path, like: str) -> str:
    """A random 2-layer Llama with a real target's tokenizer and template at PATH: the CPU mode's stand-in target
    (seeded, so the same for every process; written aside and renamed, as processes side by side may share it)."""
    if not (path / "config.json").is_file():
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(like)
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():  # a random model almost never ends a turn; tilt it to, so answers and prompts end
            # Right after one of a tenth of the vocabulary, and only there: sampled turns end ~1/10 a step, and a
            # greedy one (the T=0 eval) runs until it meets one. A constant tilt would end every greedy answer at
            # once. Feature 0 (+1 on those tokens, -1 elsewhere) is ~+-8 after the final norm: EOS certain or never.
            from eyas.decode.evaluate import turn_prompt

            ends = torch.arange(cfg.vocab_size) % 10 == 0
            ends[turn_prompt(tok, {"turns": ["hi"]}, [])[-1]] = False   # the generation prompt's last token
            model.model.embed_tokens.weight[:, 0] = ends.float() * 2 - 1
            model.lm_head.weight[tok.eos_token_id] = 0.0
            model.lm_head.weight[tok.eos_token_id, 0] = END_TILT
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(path)
        except OSError:   # another process wrote the same target first
            shutil.rmtree(tmp)
    return str(path)


class Runner:
    def __init__(self, a):
        self.a, self.work = a, a.work
        self.state_path = self.work / "state.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.is_file() else {"done": {}}
        self.t0 = time.perf_counter()
        self.bg: dict[str, tuple] = {}   # name -> (process, start, log file) of stages running in the background
        self.ran: list[str] = []         # steps this call started: none (and not done) means no step fits the budget

    def left(self) -> float:
        return self.a.budget_s - (time.perf_counter() - self.t0)

    def save(self) -> None:
        self.state_path.write_text(json.dumps(self.state, indent=1))

    def _cmd(self, name: str, args, need: float) -> list[str] | None:
        if self.left() < need:
            print(f"-- {name}: needs ~{need:.0f} s, {self.left():.0f} s left; the next call runs it", flush=True)
            return None
        cmd = [sys.executable, "-m", "eyas.cli", *args]
        print(f"== {name} ({self.left():.0f} s left): {' '.join(cmd[3:])}", flush=True)
        self.ran.append(name)
        return cmd

    @staticmethod
    def _env() -> dict:
        return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def background(self, name: str, *args: str, need: float = 20) -> bool:
        """Start one eyas stage in the background (its output to WORK/NAME.log); True when started or already done.
        `reap` records it done when it exits 0. For Spec-Bench evals: an eager eval is host-bound and leaves the
        GPU nearly idle, so it runs beside the next point's training at almost no cost (tau is not a time)."""
        if name in self.state["done"] or name in self.bg:
            return True
        cmd = self._cmd(name, args, need)
        if cmd is None:
            return False
        log = open(self.work / (name.replace(":", "-") + ".log"), "w")
        self.bg[name] = (subprocess.Popen(cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT),
                         time.perf_counter(), log)
        return True

    def reap(self, wait: bool = False) -> None:
        """Record finished background stages; wait=True: wait for all of them within the budget, and stop any still
        running when it ends (not recorded: the next call runs it again)."""
        for name, (proc, t, log) in list(self.bg.items()):
            if wait:
                try:
                    proc.wait(timeout=max(1.0, self.left()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    print(f"-- {name}: budget reached; the next call runs it again", flush=True)
            rc = proc.poll()
            if rc is None:
                continue
            log.close()
            del self.bg[name]
            secs = time.perf_counter() - t
            self.count(name, secs, rc == 0)
            if rc == 0:
                self.state["done"][name] = round(secs, 1)
                self.save()
                tail = Path(log.name).read_text(errors="replace").splitlines()[-25:]   # eval's table
                print(f"== {name} done in the background ({secs:.0f} s); the end of {log.name}:", *tail,
                      sep="\n", flush=True)
            elif not wait or rc > 0:
                raise SystemExit(f"{name} failed (exit {rc}); see {log.name}; finished steps are kept")

    def count(self, name: str, seconds: float, ok: bool) -> None:
        """A stage ended (ok) or was stopped at the budget: state["seconds"] adds up its seconds over every call it
        ran in (a step cut by the budget costs GPU time too; a training split over two calls is both calls' time)."""
        sec = self.state.setdefault("seconds", {})
        sec[name] = round(sec.get(name, 0) + seconds, 1)
        self.save()

    def seconds(self, name: str) -> float | None:
        """A done stage's seconds over all its calls (state files older than state["seconds"]: its last call's)."""
        return self.state.get("seconds", {}).get(name, self.state["done"].get(name))

    def eyas(self, name: str, *args: str, need: float = 20) -> bool:
        """Run one eyas stage under the remaining budget (started only with `need` seconds left); True when done."""
        if name in self.state["done"]:
            return True
        cmd = self._cmd(name, args, need)
        if cmd is None:
            return False
        env = self._env()
        t, ok = time.perf_counter(), False
        try:
            r = subprocess.run(cmd, env=env, timeout=max(1, self.left()))
            if r.returncode:
                raise SystemExit(f"{name} failed (exit {r.returncode}); fix and rerun, finished steps are kept")
            ok = True
            self.state["done"][name] = round(time.perf_counter() - t, 1)
            return True
        except subprocess.TimeoutExpired:
            print(f"-- {name}: budget reached; the next call resumes it", flush=True)
            return False
        finally:
            self.count(name, time.perf_counter() - t, ok)


def source(r: Runner, kind: str, rows: int, stage: str = "") -> str | None:
    """KIND's rows (raw: the dataset itself), generated into KIND.jsonl by gen:KIND (`stage` names a later top-up:
    `eyas regenerate` resumes, writing only the rows beyond those already there)."""
    a = r.a
    if kind == "raw":
        return a.data
    out = r.work / f"{kind}.jsonl"
    # task: long-input tasks over the self-written answers of this WORK (bench/best_draft.py's kind task)
    data = a.data if kind == "regen" else f"tasks:{r.work / 'self.jsonl'}" if kind == "task" else f"self:{rows}"
    ok = r.eyas(f"gen:{kind}{stage}", "regenerate", "--target", a.target, "--data", data, "--max-samples", str(rows),
                "--out", str(out), "--backend", "native", "--batch-size", str(a.gen_batch), "--max-new-tokens",
                str(a.new_tokens), "--max-prompt-tokens", str(a.max_prompt), "--device", a.device, "--temperature", str(a.gen_temperature),
                "--attention", a.gen_attention, "--graph", a.gen_graph, "--json",
                *(["--task-min-words", str(a.task_min_words)]
                  if kind == "task" and hasattr(a, "task_min_words") else []))
    return str(out) if ok else None


def prep_summary(prep: Path) -> dict | None:
    """The summary `eyas prepare` wrote into PREP's manifest; None when there is no manifest (a stand-in stage)."""
    man = prep / "manifest.json"
    return json.loads(man.read_text()).get("summary", {}) if man.is_file() else None


def tokens_per_row(r: Runner, kind: str, src: str, rows: int) -> float | None:
    prep = r.work / f"prep-{kind}-all"
    if not r.eyas(f"prep:{kind}:all", "prepare", "--target", r.a.target, "--data", src, "--max-samples", str(rows),
                  "--out", str(prep), "--max-length", str(r.a.max_length), "--draft-vocab-size", str(r.a.vocab),
                  "--workers", "0", "--overwrite", "--json"):
        return None
    s = prep_summary(prep) or {}
    if not s.get("rows_out"):
        raise SystemExit(f"{prep}: no usable rows from {src}; see its .errors.jsonl")
    return s["tokens"] / s["rows_out"]


def prep_to_size(r: Runner, kind: str, src: str, size: int, tpr: float, prep: Path, tries: int = 3) -> bool:
    """prep:KIND:S holding ~S tokens. Rows differ in length along a dataset (the first 488 raw ShareGPT rows held
    1.2k tokens each where the first 3k held 2.2k: a 1M point got 0.6M), so a short result is prepared again with
    the row count scaled by what is missing, until it holds >= 95% of S or the source has no more rows."""
    a, n, got_before = r.a, math.ceil(size / tpr / 0.95), -1  # the train split is 95% of the rows
    for i in range(tries):
        if not r.eyas(f"prep:{kind}:{size}" + (f":{i}" if i else ""), "prepare", "--target", a.target, "--data", src,
                      "--max-samples", str(n), "--out", str(prep), "--max-length", str(a.max_length),
                      "--draft-vocab-size", str(a.vocab), "--workers", "0", "--overwrite", "--json"):
            return False
        summary = prep_summary(prep)
        if summary is None:   # nothing to measure (a stand-in stage)
            return True
        got = summary.get("tokens") or 0
        if (got >= 0.95 * size or got <= got_before or f"train:{kind}:{size}" in r.state["done"]
                or summary.get("rows_in", n) < n):
            return True   # enough, the source is exhausted (fewer rows than asked), or a run already trained on it
        got_before, n = got, math.ceil(n * size / max(got, 1) * 1.02)
    return True


def covered_by(r: Runner, kind: str, size: int, prep: Path) -> bool:
    """KIND:SIZE's source ran out (its prep holds < 95% of SIZE) and a point this work dir trained holds >= 90% of
    those tokens: training it would repeat that point (re-answered ShareGPT holds ~11M tokens, so its "20M" is its
    "10M" again). Recorded in state["exhausted"], reported in the JSON, and counted as done."""
    key, got = f"{kind}:{size}", (prep_summary(prep) or {}).get("tokens") or 0
    if key in r.state.get("exhausted", {}):
        return True
    if not got or got >= 0.95 * size or f"train:{key}" in r.state["done"]:   # (no manifest: nothing to measure)
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


def spec_bench(r: Runner, kind: str, size, temperature: float = 0, name: str | None = None,
               draft: Path | None = None, background: bool = False) -> bool:
    """eval:KIND:S (or `name`), one `eyas eval` of run-KIND-S (or `draft`) for both settings (they share its
    baseline) at `temperature`, into eval-KIND-S.json; True when done (background: when started). bench/best_draft.py
    names its own."""
    a = r.a
    seen = [t for k, t in r.state["done"].items() if k.startswith("eval:")]
    # 1.5x the longest eval seen, capped at what a call can give (0.9 of its budget: its first seconds are spent
    # before the eval) when the eval itself fits that (an eval of 377 s once needed 566 s in 540-s calls and never
    # started, and capped at exactly the budget a fresh 420-s call could not start one of 381 s)
    full, longest = 0.9 * a.budget_s, max(seen, default=None)
    need = a.eval_est_s if longest is None else min(1.5 * longest, full) if longest <= full else 1.5 * longest
    return (r.background if background else r.eyas)(name or f"eval:{kind}:{size}", "eval",
                  "--draft", str(draft or r.work / f"run-{kind}-{size}"), *eval_flags(a),
                  "--temperature", f"{temperature:g}", "--out", str(r.work / f"eval-{kind}-{size}.json"),
                  # every draft of the curve against one AR baseline: half of an eager eval's time
                  "--baseline-cache", str(r.work / "baseline-cache"),
                  need=need)


def eval_flags(a) -> list[str]:
    """The `eyas eval` flags that decide what is compiled (questions, so the KV capacity; settings; bucket): the
    eval's and its warm-up's (bench/best_draft.py's beside training), from one place so the two agree."""
    cats = ["--categories", *a.eval_categories.split(",")] if a.eval_categories else []
    return ["--target", a.target, "--per-category", str(a.eval_per_category), *cats,
            "--max-new-tokens", str(a.eval_max_new_tokens), "--chain", str(a.eval_chain), "--tree", a.eval_tree,
            "--device", a.device,
            *(["--compile", "--min-bucket", str(a.eval_min_bucket)] if a.eval_compile else ["--no-compile"])]


def last_eval(run: Path) -> dict | None:
    m = run / "metrics.jsonl"
    if not m.is_file():
        return None
    ev = [x for x in map(json.loads, filter(str.strip, m.read_text().split("\n"))) if x.get("split") == "eval"]
    return ev[-1] if ev else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="/tmp/smol-hf")
    ap.add_argument("--data", default="sharegpt", help="ShareGPT JSON path (or built-in 'sharegpt')")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "scaling")
    ap.add_argument("--kinds", default="raw,regen,self")
    ap.add_argument("--sizes", default="1e6,3e6,10e6,30e6", help="training tokens per point")
    ap.add_argument("--budget-s", type=float, default=540, help="stop starting work after this many seconds")
    ap.add_argument("--device", default=None)
    ap.add_argument("--gen-batch", type=int, default=512)   # 35.1k tok/s vs 27.7k at 256, the same answers (H200)
    # the generator's flex decode step: 51.5k tok/s at batch 512 on the H200 against SDPA's 34.4k (BENCHMARKS.md)
    ap.add_argument("--gen-attention", choices=("sdpa", "flex"), default="flex")
    # compile: 72.6k tok/s with flex at batch 512 on the H200 against 51.5k for the CUDA graph, after a ~36-s compile
    # (BENCHMARKS.md): worth it from ~5M generated tokens
    ap.add_argument("--gen-graph", choices=("auto", "cudagraph", "compile", "eager"), default="auto",
                    help="the generator's decode step (`eyas regenerate --graph`)")
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--max-prompt", type=int, default=1536)
    ap.add_argument("--gen-temperature", type=float, default=0.0, help="answers' sampling temperature (0 = greedy)")
    ap.add_argument("--est-tokens-per-row", type=float, default=600, help="to size generation before measuring")
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--ttt", type=int, default=7)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=8)
    # 1e-3, the recipe of bench/best_draft.py and the GPU demo (held-out tau 4.9 at 40M tokens); the first points,
    # at 3e-4, are kept apart in bench/results/scaling-lr3e-4.json (--merge refuses a mix)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--train-args", default="", help="extra `eyas train` flags")
    ap.add_argument("--skip-eval", action="store_true", help="no eval:KIND:S steps (train only): no Spec-Bench tau")
    ap.add_argument("--eval-chain", type=int, default=3, help="Spec-Bench chain length K")
    ap.add_argument("--eval-tree", default="total=60,depth=7,topk=10", help="Spec-Bench tree")
    ap.add_argument("--eval-per-category", type=int, default=1, help="Spec-Bench questions per category")
    ap.add_argument("--eval-categories", default="", help="comma-separated Spec-Bench categories (default: all 13)")
    ap.add_argument("--eval-max-new-tokens", type=int, default=256, help="new tokens per Spec-Bench turn")
    ap.add_argument("--eval-compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile + CUDA graphs in eval (default: on a GPU; a fresh warm-up ~2 min, later "
                         "points' from inductor's cache; tau moves only through bf16 ties)")
    ap.add_argument("--eval-min-bucket", type=int, default=1_000_000,
                    help="compiled eval's smallest KV bucket (`eyas eval --min-bucket`; the default: one bucket, "
                         "so each step width compiles once)")
    ap.add_argument("--eval-est-s", type=float, default=180, help="an eval's seconds until one has been timed here")
    ap.add_argument("--eval-background", action=argparse.BooleanOptionalAction, default=None,
                    help="run each point's eval beside the next point's training (default: on a GPU)")
    ap.add_argument("--tiny", action="store_true", help="CPU check: random 2-layer target, sizes of a few k tokens")
    ap.add_argument("--tiny-target", type=Path, default=None,
                    help="--tiny: where the random target lives (default WORK/tiny-target; one path for processes "
                         "whose JSONs are merged: --merge checks the target)")
    ap.add_argument("--png", type=Path, default=None, help="default: next to --out")
    ap.add_argument("--merge", type=Path, nargs="*", default=[],
                    help="earlier runs' --out JSONs (other GPU sessions', or a parallel process's): their points are "
                         "kept and not recomputed, so the curve can be built over several sessions, a few points each")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scaling.json")
    a = ap.parse_args(argv)
    if a.tiny:  # tiny defaults; flags given still win (the test asks for one small point)
        ap.set_defaults(sizes="1500,3000,6000,12000", gen_batch=8, new_tokens=24, max_prompt=256, est_tokens_per_row=60,
                        gen_temperature=1.0,  # a random model's greedy answer is one token over and over (or empty)
                        max_length=256, vocab=512, ttt=2, epochs=1.0, batch=2, device="cpu", eval_chain=2,
                        eval_tree="total=6,depth=3,topk=2", eval_max_new_tokens=16, eval_est_s=60,
                        eval_categories="writing,coding")  # short questions: no 3k-character rag prompt on a CPU
        a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    if a.tiny:
        a.target = tiny_target(a.tiny_target or a.work / "tiny-target", a.target)
    a.device = a.device or ("cuda" if __import__("torch").cuda.is_available() else "cpu")
    a.eval_background = a.device.startswith("cuda") if a.eval_background is None else a.eval_background
    a.eval_compile = a.device.startswith("cuda") if a.eval_compile is None else a.eval_compile
    sizes = [int(float(s)) for s in a.sizes.split(",")]
    earlier = merged_points(a.merge, a)
    # a merged point without Spec-Bench tau is computed again when this call evaluates (the new one replaces it)
    have = {(p["kind"], p["size"]) for p in earlier if a.skip_eval or "spec_bench_tree_tau" in p}
    r = Runner(a)
    for m in a.merge:   # sizes an earlier call found its source too small for stay skipped
        r.state.setdefault("exhausted", {}).update(json.loads(Path(m).read_text()).get("exhausted", {}))
    for kind in a.kinds.split(","):
        todo = [s for s in sizes if (kind, s) not in have and f"{kind}:{s}" not in r.state.get("exhausted", {})]
        if not todo:
            continue
        rows = math.ceil(max(todo) * 1.1 / a.est_tokens_per_row)  # 10% spare for the held-out split
        src = source(r, kind, rows)
        tpr = tokens_per_row(r, kind, src, rows) if src else None
        if tpr is None:
            break
        need = math.ceil(max(todo) * 1.1 / tpr)
        if kind != "raw" and need > 1.02 * rows:
            # rows came out shorter than estimated (self-written: 402 tokens a row where 600 were guessed, so a
            # "10M" point held 7.4M): generate the rest; prep:KIND:all keeps the first sample's measure
            print(f"-- gen:{kind}: {rows} rows x {tpr:.0f} tokens < {max(todo) * 1.1:.3g}: {need} rows", flush=True)
            if not source(r, kind, need, stage=":more"):
                break
        for size in todo:
            r.reap()
            prep, run = r.work / f"prep-{kind}-{size}", r.work / f"run-{kind}-{size}"
            if not prep_to_size(r, kind, src, size, tpr, prep):
                break
            if covered_by(r, kind, size, prep):
                continue
            if not r.eyas(f"train:{kind}:{size}", "train", "--online", "--target", a.target, "--data", str(prep),
                          "--out", str(run), "--ttt-steps", str(a.ttt), "--epochs", str(a.epochs), "--batch-size",
                          str(a.batch), "--lr", str(a.lr), "--eval-every", "1000000", "--save-every", "200",
                          *(["--resume"] if (run / "checkpoints").is_dir() else []), "--seed", "0", "--device", a.device, "--no-progress", *a.train_args.split()):
                break
            if not a.skip_eval:   # one that does not fit waits for a later call; the next points train meanwhile
                spec_bench(r, kind, size, background=a.eval_background)
    r.reap(wait=True)
    points = []              # this work dir's, then every merged point it has not made again
    unmeasured = []          # trained here, Spec-Bench tau still to come
    for key in r.state["done"]:
        if key.startswith("train:"):
            _, kind, size = key.split(":")
            ev = last_eval(r.work / f"run-{kind}-{size}")
            if ev:
                man = prep_summary(r.work / f"prep-{kind}-{size}") or {}
                points.append({"kind": kind, "size": int(size), "tokens": man.get("tokens"), "rows": man.get("rows_out"),
                               "tau": ev["tau"], "acc": ev.get("acc"), "steps": ev.get("step"),
                               "train_seconds": r.seconds(key)})
                if f"eval:{kind}:{size}" in r.state["done"]:
                    points[-1].update(spec_bench_point(r.work / f"eval-{kind}-{size}.json"),
                                      eval_seconds=r.seconds(f"eval:{kind}:{size}"))
                else:
                    unmeasured.append((kind, int(size)))
    ours_keys = {(p["kind"], p["size"]) for p in points}
    points += [p for p in earlier if (p["kind"], p["size"]) not in ours_keys]
    ours = eval_setting(a)
    check_eval_settings(points, ours, str(a.work))   # evals of an earlier call with other --eval-* flags
    exhausted = r.state.get("exhausted", {})
    wanted = {(k, s) for k in a.kinds.split(",") for s in sizes if f"{k}:{s}" not in exhausted}
    png = a.png or a.out.with_suffix(".png")
    if points:
        plot(points, png, a.ttt)
    done = wanted <= {(p["kind"], p["size"]) for p in points if a.skip_eval or "spec_bench_tree_tau" in p}
    print("all steps done" if done else
          f"{len(points)}/{len(wanted)} points, {len(unmeasured)} without Spec-Bench tau; run the same command "
          f"again to continue", flush=True)
    stuck = not done and not r.ran
    if stuck:   # calling again with less time cannot help: say so and let the caller's loop stop
        print(f"no step fits: --budget-s {a.budget_s:g} starts none of what is left", flush=True)
    recipe = {k: getattr(a, k) for k in RECIPE_KEYS}
    emit({"bench": "scaling", "target": a.target, "data": a.data, "kinds": a.kinds.split(","), "sizes": sizes,
          "ttt": a.ttt, "epochs": a.epochs, "complete": done, "merged_from": [str(m) for m in a.merge],
          "recipe": recipe, "eval": ours, "png": str(png) if points else None,
          "stage_seconds": {k: r.seconds(k) for k in r.state["done"]}, "exhausted": exhausted, "points": points},
         a.out)
    return 3 if stuck else 0


if __name__ == "__main__":
    sys.exit(main())
