"""Held-out tau against training tokens for raw / regenerated / self-generated data (EAGLE-3's scaling figure).

    PYTHONPATH=src python bench/scaling.py --data SHAREGPT.json --work runs/scaling --budget-s 540 \
        --out bench/results/scaling.json            # repeat the same command until it prints "all steps done"
    PYTHONPATH=src python bench/scaling.py --tiny --work /tmp/scaling-tiny --out /tmp/scaling-tiny.json   # CPU

Steps, each resumable and each recorded as done in WORK/state.json, so the run spreads over several calls of
at most --budget-s seconds (a step cut by the budget continues next call: regenerate skips finished rows,
train resumes from its last checkpoint):
  gen:KIND    regenerated (ShareGPT re-answered) or self (self:N prompts the target writes, then answers) rows,
              through `eyas regenerate --backend native`; raw needs none.
  prep:KIND:S `eyas prepare` of the first rows holding ~S tokens (rows estimated from the kind's tokens/row).
  train:KIND:S online `eyas train` for --epochs over those tokens; held-out simulated chain-K tau is the
              last held-out eval in metrics.jsonl (K = --ttt).
After each call the JSON (points so far) and a PNG (tau vs tokens, log x, one line per kind) are rewritten.
Held-out rows are each kind's own 5% split; compare kinds on Spec-Bench with bench/decode.py on the drafts.
Over several GPU sessions (a machine's /tmp is gone between them): each session computes a few points
(`--kinds raw --sizes 1e6,3e6`, ...) with `--merge` the previous session's JSON, whose points are kept.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
from _emit import emit  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
END_TILT = 1.1


def tiny_target(work: Path, like: str) -> str:
    """A random 2-layer Llama with a real target's tokenizer and template: the CPU mode's stand-in target."""
    path = work / "tiny-target"
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
            # feature 0 is ~constant after the final norm (every embedding carries 1.0 there): P(end) ~ 1/10 a step
            model.model.embed_tokens.weight[:, 0] = 1.0
            model.lm_head.weight[tok.eos_token_id] = 0.0
            model.lm_head.weight[tok.eos_token_id, 0] = END_TILT
        model.save_pretrained(path)
        tok.save_pretrained(path)
    return str(path)


class Runner:
    def __init__(self, a):
        self.a, self.work = a, a.work
        self.state_path = self.work / "state.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.is_file() else {"done": {}}
        self.t0 = time.perf_counter()

    def left(self) -> float:
        return self.a.budget_s - (time.perf_counter() - self.t0)

    def save(self) -> None:
        self.state_path.write_text(json.dumps(self.state, indent=1))

    def eyas(self, name: str, *args: str) -> bool:
        """Run one eyas stage under the remaining budget; True when it finished."""
        if name in self.state["done"]:
            return True
        if self.left() < 20:
            return False
        cmd = [sys.executable, "-m", "eyas.cli", *args]
        print(f"== {name} ({self.left():.0f} s left): {' '.join(cmd[3:])}", flush=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t = time.perf_counter()
        try:
            r = subprocess.run(cmd, env=env, timeout=max(1, self.left()))
        except subprocess.TimeoutExpired:
            print(f"-- {name}: budget reached; the next call resumes it", flush=True)
            return False
        if r.returncode:
            raise SystemExit(f"{name} failed (exit {r.returncode}); fix and rerun, finished steps are kept")
        self.state["done"][name] = round(time.perf_counter() - t, 1)
        self.save()
        return True


def source(r: Runner, kind: str, rows: int) -> str | None:
    a = r.a
    if kind == "raw":
        return a.data
    out = r.work / f"{kind}.jsonl"
    data = a.data if kind == "regen" else f"self:{rows}"
    ok = r.eyas(f"gen:{kind}", "regenerate", "--target", a.target, "--data", data, "--max-samples", str(rows),
                "--out", str(out), "--backend", "native", "--batch-size", str(a.gen_batch), "--max-new-tokens",
                str(a.new_tokens), "--max-prompt-tokens", str(a.max_prompt), "--device", a.device, "--temperature", str(a.gen_temperature),
                "--json")
    return str(out) if ok else None


def tokens_per_row(r: Runner, kind: str, src: str, rows: int) -> float | None:
    prep = r.work / f"prep-{kind}-all"
    if not r.eyas(f"prep:{kind}:all", "prepare", "--target", r.a.target, "--data", src, "--max-samples", str(rows),
                  "--out", str(prep), "--max-length", str(r.a.max_length), "--draft-vocab-size", str(r.a.vocab),
                  "--workers", "0", "--overwrite", "--json"):
        return None
    s = json.loads((prep / "manifest.json").read_text()).get("summary", {})
    if not s.get("rows_out"):
        raise SystemExit(f"{prep}: no usable rows from {src}; see its .errors.jsonl")
    return s["tokens"] / s["rows_out"]


def last_eval(run: Path) -> dict | None:
    m = run / "metrics.jsonl"
    if not m.is_file():
        return None
    ev = [x for x in map(json.loads, filter(str.strip, m.read_text().split("\n"))) if x.get("split") == "eval"]
    return ev[-1] if ev else None


def plot(points: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in sorted({p["kind"] for p in points}):
        ps = sorted((p for p in points if p["kind"] == kind), key=lambda p: p["tokens"])
        ax.plot([p["tokens"] for p in ps], [p["tau"] for p in ps], marker="o", label=kind)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out simulated tau")
    ax.set_title("draft tau vs data (raw / regenerated / self-generated)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def merged_points(paths: list[Path], a) -> list[dict]:
    """Points of earlier runs made with the same recipe (target, ttt, epochs, lr, batch, vocab, max length);
    a different recipe is an error, not a silent mix. A (kind, size) in several files: the first one wins."""
    recipe = {k: getattr(a, k) for k in ("ttt", "epochs", "lr", "batch", "vocab", "max_length")}
    out: dict[tuple, dict] = {}
    for path in paths:
        prev = json.loads(path.read_text())
        theirs = prev.get("recipe") or {}
        diff = {k: (theirs.get(k), v) for k, v in recipe.items() if theirs.get(k) != v}
        if diff or prev.get("target") != a.target:
            raise SystemExit(f"--merge {path}: another recipe ({diff or 'target ' + str(prev.get('target'))}); "
                             f"its points would not be comparable")
        for p in prev.get("points", []):
            out.setdefault((p["kind"], p["size"]), p)
    return list(out.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="/tmp/smol-hf")
    ap.add_argument("--data", default="sharegpt", help="ShareGPT JSON path (or built-in 'sharegpt')")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "scaling")
    ap.add_argument("--kinds", default="raw,regen,self")
    ap.add_argument("--sizes", default="1e6,3e6,10e6,30e6", help="training tokens per point")
    ap.add_argument("--budget-s", type=float, default=540, help="stop starting work after this many seconds")
    ap.add_argument("--device", default=None)
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--max-prompt", type=int, default=1536)
    ap.add_argument("--gen-temperature", type=float, default=0.0, help="answers' sampling temperature (0 = greedy)")
    ap.add_argument("--est-tokens-per-row", type=float, default=600, help="to size generation before measuring")
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--ttt", type=int, default=7)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--train-args", default="", help="extra `eyas train` flags")
    ap.add_argument("--tiny", action="store_true", help="CPU check: random 2-layer target, sizes of a few k tokens")
    ap.add_argument("--png", type=Path, default=None, help="default: next to --out")
    ap.add_argument("--merge", type=Path, nargs="*", default=[],
                    help="earlier runs' --out JSONs (other GPU sessions', or a parallel process's): their points are "
                         "kept and not recomputed, so the curve can be built over several sessions, a few points each")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scaling.json")
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    if a.tiny:
        a.target = tiny_target(a.work, a.target)
        a.sizes, a.gen_batch, a.new_tokens, a.max_prompt, a.est_tokens_per_row = "1500,3000,6000,12000", 8, 24, 256, 60
        a.gen_temperature = 1.0  # a random model's greedy answer is one token over and over (or empty)
        a.max_length, a.vocab, a.ttt, a.epochs, a.batch, a.device = 256, 512, 2, 1.0, 2, a.device or "cpu"
    a.device = a.device or ("cuda" if __import__("torch").cuda.is_available() else "cpu")
    sizes = [int(float(s)) for s in a.sizes.split(",")]
    earlier = merged_points(a.merge, a)
    have = {(p["kind"], p["size"]) for p in earlier}
    r = Runner(a)
    for kind in a.kinds.split(","):
        todo = [s for s in sizes if (kind, s) not in have]
        if not todo:
            continue
        rows = math.ceil(max(todo) * 1.1 / a.est_tokens_per_row)  # 10% spare for the held-out split
        src = source(r, kind, rows)
        tpr = tokens_per_row(r, kind, src, rows) if src else None
        if tpr is None:
            break
        for size in todo:
            prep, run = r.work / f"prep-{kind}-{size}", r.work / f"run-{kind}-{size}"
            n = math.ceil(size / tpr / 0.95)  # the train split is 95% of the rows
            if not r.eyas(f"prep:{kind}:{size}", "prepare", "--target", a.target, "--data", src, "--max-samples",
                          str(n), "--out", str(prep), "--max-length", str(a.max_length), "--draft-vocab-size",
                          str(a.vocab), "--workers", "0", "--overwrite", "--json"):
                break
            if not r.eyas(f"train:{kind}:{size}", "train", "--online", "--target", a.target, "--data", str(prep),
                          "--out", str(run), "--ttt-steps", str(a.ttt), "--epochs", str(a.epochs), "--batch-size",
                          str(a.batch), "--lr", str(a.lr), "--eval-every", "1000000", "--save-every", "200",
                          *(["--resume"] if (run / "checkpoints").is_dir() else []), "--seed", "0", "--device", a.device, "--no-progress", *a.train_args.split()):
                break
    points = list(earlier)   # every merged point, also of kinds this call does not compute
    for key in r.state["done"]:
        if key.startswith("train:"):
            _, kind, size = key.split(":")
            ev = last_eval(r.work / f"run-{kind}-{size}")
            man = json.loads((r.work / f"prep-{kind}-{size}" / "manifest.json").read_text()).get("summary", {})
            if ev:
                points.append({"kind": kind, "size": int(size), "tokens": man.get("tokens"), "rows": man.get("rows_out"),
                               "tau": ev["tau"], "acc": ev.get("acc"), "steps": ev.get("step"),
                               "train_seconds": r.state["done"][key]})
    wanted = {(k, s) for k in a.kinds.split(",") for s in sizes}
    png = a.png or a.out.with_suffix(".png")
    if points:
        plot(points, png)
    done = wanted <= {(p["kind"], p["size"]) for p in points}
    print("all steps done" if done else
          f"{len(points)}/{len(wanted)} points; run the same command again to continue", flush=True)
    recipe = {k: getattr(a, k) for k in ("ttt", "epochs", "lr", "batch", "vocab", "max_length")}
    emit({"bench": "scaling", "target": a.target, "data": a.data, "kinds": a.kinds.split(","), "sizes": sizes,
          "ttt": a.ttt, "epochs": a.epochs, "complete": done, "merged_from": [str(m) for m in a.merge],
          "recipe": recipe, "png": str(png) if points else None,
          "stage_seconds": r.state["done"], "points": points}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
