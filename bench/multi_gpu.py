"""Multi-process parts of bench/multi_gpu.sh (run under torchrun, or alone for world size 1).

  extract: every rank builds the same random target (8B shape on GPU, tiny on CPU) and extracts its shards of
           one store (ranks never talk while extracting; the last to finish merges the manifest); rank 0 then
           opens the store through the validating reader and writes tokens/s = all tokens / slowest rank.
  train:   the real trainer (eyas.train) on a small random target and an in-memory store, 2 processes;
           EYAS_BENCH_KILL_AT=N makes rank 0 SIGKILL itself right after optimizer step N (torchrun then tears the
           group down), and --resume continues from the last checkpoint.
  compare: metrics.jsonl of an uninterrupted run vs a killed + resumed one -> JSON (losses per step).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))     # tests.train.fakes: the in-memory store the trainer tests use
from _emit import emit  # noqa: E402


def extract(a) -> dict:
    import torch.distributed as dist

    from capture import random_llama
    from extract import LLAMA_8B, TINY, RandomRows
    from eyas.store import HiddenStateStore, target_identity
    from eyas.store.extract import extract_to_store
    from eyas.target import default_aux_layer_ids, find_layout
    from eyas.train import dist as D

    kind = "cuda" if torch.cuda.is_available() and not a.tiny else "cpu"
    d = D.init(kind)
    dev = torch.device(f"cuda:{d.local_rank}" if kind == "cuda" else "cpu")
    torch.manual_seed(0)                  # the same random target on every rank
    shape, seq = (TINY, 128) if a.tiny else (LLAMA_8B, 2048)
    model = random_llama(shape, dev, torch.bfloat16, "sdpa")
    layout = find_layout(model)
    data = RandomRows(max(1, a.tokens // seq), seq, shape["vocab_size"])
    aux = default_aux_layer_ids(layout.num_layers)
    ident = target_identity("bench-random", model.config, aux, a.dtype, hidden_size=shape["hidden_size"],
                            num_layers=shape["num_hidden_layers"], vocab_size=shape["vocab_size"])
    kw = dict(identity=ident, token_budget=8 * seq, shard_mb=64.0, writer_threads=8, rank=d.rank, world=d.world,
              device=dev, max_pending=8)
    out = Path(a.store)
    if d.main:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out.with_name(out.name + "-warm"), ignore_errors=True)
    d.barrier()
    extract_to_store(model, layout, data, out.with_name(out.name + "-warm"), limit=8 * d.world, **kw)  # warm-up
    d.barrier()
    t0 = time.perf_counter()
    s = extract_to_store(model, layout, data, out, **kw)
    if kind == "cuda":
        torch.cuda.synchronize(dev)
    secs = torch.tensor([time.perf_counter() - t0, float(s["tokens"])], dtype=torch.float64,
                        device=dev if kind == "cuda" else "cpu")
    parts = [torch.zeros_like(secs) for _ in range(d.world)]
    if d.world > 1:
        dist.all_gather(parts, secs)
    else:
        parts = [secs]
    d.barrier()                            # every rank has finished writing; the last one merged
    res = None
    if d.main:
        st = HiddenStateStore(out)         # validates manifest, shard sizes and hashes
        n = len(st)
        ok = n == len(data) and all(st[i]["aux"].shape == (seq, len(aux), shape["hidden_size"]) for i in (0, n - 1))
        slowest = max(float(p[0]) for p in parts)
        tokens = sum(float(p[1]) for p in parts)
        res = {"bench": "multi_gpu_extract", "world": d.world, "dtype": a.dtype, "device": str(dev),
               "tokens": int(tokens), "rank_seconds": [round(float(p[0]), 3) for p in parts],
               "tokens_per_s": round(tokens / slowest, 1), "store_rows": n, "store_valid": bool(ok)}
        shutil.rmtree(out.with_name(out.name + "-warm"), ignore_errors=True)
        if not a.keep:
            shutil.rmtree(out, ignore_errors=True)
    D.shutdown(d)
    return emit(res, a.out) if d.main else {}


def train(a) -> dict:
    from eyas.train import TrainConfig
    from eyas.train import loop
    from tests.train.fakes import FakePrepared, FakeStore, make_rows, tiny_target, vocab_for

    kill_at = int(os.environ.get("EYAS_BENCH_KILL_AT", "0"))
    if kill_at:
        step = loop.Trainer.train_step

        def train_step(self):
            r = step(self)
            if self.step == kill_at and self.d.rank == 0:
                print(f"[bench/multi_gpu] rank 0: SIGKILL after step {self.step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return r
        loop.Trainer.train_step = train_step
    gpu = torch.cuda.is_available() and not a.tiny
    target = tiny_target(hidden=32 if a.tiny else 256)
    rows = make_rows(64, length=64 if a.tiny else 256)
    store = FakeStore(rows, target)          # states computed on the CPU, once per process
    if gpu:
        target.model.to(f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
    prepared = FakePrepared(rows, *vocab_for(rows, 64))
    cfg = TrainConfig(target="tiny-llama", out=Path(a.run_dir), store=Path(a.run_dir) / "store", ttt_steps=3, batch_size=2,
                      steps=a.steps, lr=1e-3, eval_fraction=0.1, eval_every=a.steps, save_every=2, log_every=1,
                      parallel=a.parallel, progress=False, tensorboard=False, device="cuda" if gpu else "cpu",
                      seed=3, resume=a.resume, attention="dense", compile=False)   # no compile: 3 quick launches
    return loop.train(cfg, target=target, store=store, dataset=prepared)


def compare(a) -> dict:
    def losses(run):
        recs = [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().split("\n") if x.strip()]
        return {m["step"]: m["loss"] for m in recs if m.get("split") == "train" and "loss" in m}
    ref, res = losses(a.ref), losses(a.run_dir)
    steps = sorted(ref)
    diff = max((abs(ref[s] - res[s]) / max(abs(ref[s]), 1e-12) for s in steps if s in res), default=None)
    return emit({"bench": "multi_gpu_resume", "steps": steps, "uninterrupted": [ref[s] for s in steps],
                 "killed_and_resumed": [res.get(s) for s in steps], "max_rel_diff": diff,
                 "complete": all(s in res for s in steps),
                 "checkpoints": sorted(p.name for p in (Path(a.run_dir) / "checkpoints").glob("step-*"))}, a.out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["extract", "train", "compare"])
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run")
    ap.add_argument("--tokens", type=int, default=131072, help="extract: total tokens over all ranks")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--store", default="/tmp/eyas-mgpu-store")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--run-dir", default=None, help="train/compare: RUN dir")
    ap.add_argument("--ref", default=None, help="compare: the uninterrupted RUN dir")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"])
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    return {"extract": extract, "train": train, "compare": compare}[a.mode](a)


if __name__ == "__main__":
    main(sys.argv[1:])
