"""Where an online training step of a small target's draft spends its time (issue 13: the SmolLM2 draft trains at
~26k tok/s on an H200, far below what its FLOPs allow, and the scaling curve needs ~130M trained tokens).

The real `eyas train --online` Trainer (eyas.train.loop.Trainer) on a SmolLM2-135M-shaped target (random weights
built in-process unless --target names a real one; the time does not depend on the weights) over packed synthetic
rows (or a real PREPARED dir with --data). For each --batch it reports:
  tokens_per_s     the Trainer's own train_step, back to back, one sync at the end (what a run gets)
  phase_ms         one step split by device syncs: rows (collate + host->device), target (the target's capture
                   forward), head (the target's norm + lm-head -> soft targets), forward (TTT unroll + loss),
                   backward, optimizer (clip + AdamW + schedule)
  profile          torch.profiler over 2 steps (--profile): top ops by self device time ("device"), and by self host
                   time ("host": at a small batch the step is bound by what the CPU issues -- a step of 8 rows costs
                   ~55 ms more than a quarter of one of 32 on the H200 -- which the device table cannot show)
--variants picks what is tried at each batch size: base (the Trainer as `eyas train` builds it: on a GPU flex attention,
the draft's decoder layer, the target's head, the loss chunks and the target's decoder layers compiled), before (only
flex attention compiled: the trainer before the others were), edraft (base with the draft's decoder layer eager: it
was until the H200 measured 132.6k -> 156.8k tok/s at 8 x 2,048 from compiling it, 2026-12-02).

  python bench/train_online.py --out bench/results/train_online_h200.json            # GPU
  python bench/train_online.py --tiny --out /tmp/train_online_tiny.json              # CPU smoke (seconds)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _emit import emit  # noqa: E402

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
               rms_norm_eps=1e-5, tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-5,
            tie_word_embeddings=True)


class Rows(list):
    """A PREPARED dataset's reader interface (len, [i] from the list; manifest, vocab()) over synthetic packed rows:
    documents of 200-700 tokens, the second half of each one 'assistant' (in the loss), Zipf-distributed token ids."""

    def __init__(self, n: int, T: int, vocab: int, draft_vocab: int, seed: int = 0):
        from eyas.vocab import build_draft_vocab

        g = torch.Generator().manual_seed(seed)
        zipf = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
        super().__init__()
        for _ in range(n):
            pos, mask, left = [], [], T
            while left > 0:
                L = min(left, int(torch.randint(min(200, T), min(700, T) + 1, (1,), generator=g)))
                pos += range(L)
                mask += [j >= L // 2 for j in range(L)]
                left -= L
            ids = torch.multinomial(zipf, T, replacement=True, generator=g)
            self.append({"input_ids": ids, "loss_mask": torch.tensor(mask), "position_ids": torch.tensor(pos)})
        freq = torch.bincount(torch.cat([r["input_ids"] for r in self]), minlength=vocab)
        self._vocab = build_draft_vocab(freq, draft_vocab)[:2]
        self.manifest = {"format": "eyas-prepared", "max_length": T}

    def vocab(self):
        return self._vocab


def random_target(shape: dict, dtype: torch.dtype):
    import transformers as tf

    from eyas.target import wrap_model

    torch.manual_seed(0)
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**shape))
    model = model.to_empty(device="cpu")
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model.model.rotary_emb.__init__(model.config)      # to_empty left the RoPE buffers uninitialised
    return wrap_model(model.to(dtype).eval().requires_grad_(False), name="smollm2-shape-random")


def profile_tables(step, dev: torch.device, top: int = 20) -> dict:
    """torch.profiler over 2 steps: the top ops by self device time and by self host time, each per step."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(2):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    ev = prof.key_averages()

    def table(attr: str) -> list[dict]:
        rows = sorted((e for e in ev if getattr(e, attr, 0) > 0), key=lambda e: -getattr(e, attr))
        total = sum(getattr(e, attr) for e in rows) or 1
        return [{"op": e.key, "ms_per_step": round(getattr(e, attr) / 2e3, 3),
                 "share": round(getattr(e, attr) / total, 4), "calls_per_step": e.count // 2} for e in rows[:top]]

    out = {"host": table("self_cpu_time_total")}
    if dev.type == "cuda":
        out["device"] = table("self_device_time_total")
    return out


def phase_step(tr, sync) -> dict:
    """One optimizer step of Trainer.train_step (one micro-batch), split by device syncs into its phases (ms)."""
    from eyas.target import target_states
    from eyas.train.data import checked_rows, collate

    src, t = tr.inp.source, {}
    clock = time.perf_counter

    def mark(name, t0):
        sync()
        t[name] = round((clock() - t0) * 1e3, 3)
        return clock()

    ids = tr.plan.step_rows(tr.step, tr.d.rank)[0]
    t0 = clock()
    rows = checked_rows(src.dataset, ids, "prepared")
    b = {k: v.to(tr.device) for k, v in collate(rows, src.max_length, pad_to=src.pad_to).items()}
    t0 = mark("rows", t0)
    b["aux"], b["last"], _ = target_states(src.model, src.layout, b["input_ids"], src.aux_ids,
                                           position_ids=b["position_ids"])
    t0 = mark("target", t0)
    probs, ok, arg = tr.head(b["last"])
    t0 = mark("head", t0)
    with torch.autocast(tr.device.type, dtype=tr.amp, enabled=tr.amp is not None):
        loss, _ = tr.model(b["input_ids"], b["position_ids"], b["loss_mask"], b["aux"], probs, ok, arg)
    t0 = mark("forward", t0)
    loss.backward()
    t0 = mark("backward", t0)
    torch.nn.utils.clip_grad_norm_([p for p in tr.model.parameters() if p.requires_grad], tr.cfg.grad_clip)
    tr.opt.step()
    tr.sched.step()
    tr.opt.zero_grad(set_to_none=True)
    tr.step += 1
    mark("optimizer", t0)
    return t


def measure(a, target, data, B: int, variant: str, dev: torch.device, work: Path) -> dict:
    from eyas.target.compiled import uncompile_forwards, uncompile_layers
    from eyas.train.loop import TrainConfig, Trainer

    cfg = TrainConfig(target="in-memory", out=work / f"b{B}-{variant}", online=True, batch_size=B, ttt_steps=a.ttt,
                      lr=1e-3, steps=10**6, eval_every=10**6, save_every=10**6, log_every=10**6, progress=False,
                      tensorboard=False, device=str(dev), max_length=a.seq, eval_fraction=0.0)
    tr = Trainer(cfg, target=target, dataset=data)
    if variant in ("before", "edraft"):   # the draft's layer eager again
        uncompile_forwards(tr.draft.layers)
    if variant == "before":
        uncompile_layers(target.layout)
        tr._compiled_target, tr.unroll.compile_loss, tr.head._chunk_fn = False, False, tr.head._chunk
    try:
        return _timed(a, tr, B, variant, dev)
    finally:
        tr.close()


def _timed(a, tr, B: int, variant: str, dev: torch.device) -> dict:
    gpu = dev.type == "cuda"

    def sync():
        if gpu:
            torch.cuda.synchronize()

    tr.model.train()
    for _ in range(a.warmup):          # compile, autotune, allocator warm-up
        tr.train_step()
    sync()
    t0, tokens = time.perf_counter(), 0
    for _ in range(a.steps):
        tokens += tr.train_step()[1]
    sync()
    dt = time.perf_counter() - t0
    phases = [phase_step(tr, sync) for _ in range(3)]
    phase_ms = {k: round(sorted(p[k] for p in phases)[1], 3) for k in phases[0]}
    out = {"batch": B, "variant": variant, "tokens_per_step": tokens // a.steps, "tokens_per_s": round(tokens / dt, 1),
           "step_ms": round(dt / a.steps * 1e3, 2), "phase_ms": phase_ms,
           "phase_sum_ms": round(sum(phase_ms.values()), 2)}
    if gpu:
        out["peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
        torch.cuda.reset_peak_memory_stats(dev)
    if a.profile:
        out["profile"] = profile_tables(lambda: tr.train_step(), dev, top=a.top)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (smoke test)")
    p.add_argument("--target", default=None, help="a real target (HF dir); default: SmolLM2-135M's shape, random")
    p.add_argument("--data", default=None, help="a PREPARED dir; default: synthetic packed rows")
    p.add_argument("--batch", type=int, nargs="+", default=None, help="rows per step (default 8 16; tiny 2)")
    p.add_argument("--seq", type=int, default=None, help="tokens per row (default 2048; tiny 128)")
    p.add_argument("--ttt", type=int, default=None, help="TTT steps (default 7; tiny 3)")
    p.add_argument("--draft-vocab", type=int, default=None, help="default 32000; tiny 256")
    p.add_argument("--steps", type=int, default=None, help="timed steps per batch size (default 10; tiny 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; tiny 1)")
    p.add_argument("--variants", default="base", help="comma list of base | before | edraft (above)")
    p.add_argument("--profile", action="store_true", help="add a torch.profiler top-ops table per batch size")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--device", default=None)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() and not a.tiny else "cpu"))
    a.seq, a.ttt = a.seq or (128 if a.tiny else 2048), a.ttt or (3 if a.tiny else 7)
    a.steps = a.steps or (2 if a.tiny else 10)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.tiny else 3)
    batches = a.batch or ([2] if a.tiny else [8, 16])
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if not variants or any(v not in ("base", "before", "edraft") for v in variants):
        p.error(f"--variants {a.variants!r}: a comma list of base, before, edraft")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if a.target:
        from eyas.target import load_target
        target = load_target(a.target, dtype=dtype, device=dev)
    else:
        target = random_target(TINY if a.tiny else SMOLLM2, dtype)
    V = target.layout.vocab_size
    Vd = min(a.draft_vocab or (256 if a.tiny else 32000), V)
    if a.data:
        from eyas.data import PreparedDataset
        data = PreparedDataset(a.data)
    else:
        data = Rows(max(batches) * (a.steps + a.warmup + 4), a.seq, V, Vd)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor()
    res = {"bench": "train_online", "device": name,
           "torch": torch.__version__, "target": a.target or ("tiny" if a.tiny else "smollm2-135m shape, random"),
           "data": a.data or "synthetic packed rows", "seq": a.seq, "ttt": a.ttt, "draft_vocab": Vd, "runs": []}
    with tempfile.TemporaryDirectory() as work:
        for variant in variants:
            for B in batches:
                res["runs"].append(measure(a, target, data, B, variant, dev, Path(work)))
                if a.out:                                  # kept when a later run is cut off
                    a.out.parent.mkdir(parents=True, exist_ok=True)
                    a.out.write_text(json.dumps(res, indent=2) + "\n")
                print(f"[train_online] {variant} batch {B}: {res['runs'][-1]['tokens_per_s']:.0f} tok/s "
                      f"{res['runs'][-1]['phase_ms']}", flush=True)
    return emit(res, a.out)


if __name__ == "__main__":
    main()
