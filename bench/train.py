"""Training throughput of the EAGLE-3 draft at a target's shape, with random inputs.

Default: the Llama-3.1-8B draft (hidden 4096, 32 heads / 8 kv, MLP 14336, vocab 128256, draft vocab 32000),
TTT 7, one packed row of 2048 tokens, bf16 autocast + fp32 master weights + AdamW, FlexAttention masks,
the target's head (norm + full-vocab lm_head, chunked) included in each step as in real training.
Reports tokens/s, step time, peak memory and MFU (model FLOPs of the draft's forward+backward over the
step's time; the target-head forward is reported separately and excluded from MFU).

  python bench/train.py --out bench/results/train_h200.json          # GPU
  python bench/train.py --tiny --out /tmp/train_tiny.json            # CPU smoke run (seconds)

Variants (--variants, each measured in the same process): `plain` = the reference loss that materialises every
TTT step's [N, draft-vocab] logits; `fused` = the chunked lm-head + loss of train/loss.py; `compiled` = fused with
the draft's decoder layer under torch.compile. A torch.profiler summary of the last variant (top ops by device
time) goes into the JSON, and --long-seq N runs plain and fused at N tokens to show the peak memory (16k fits).
`mask_build_ms_per_step`: building one optimizer step's K attention BlockMasks, create_block_mask over the token grid
(the previous path) vs the direct block-grid construction training uses (train/masks.py).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from contextlib import nullcontext
from types import SimpleNamespace

import torch

from eyas.aux_layers import default_aux_layer_ids
from eyas.draft.model import Eagle3Draft, compile_flex_attention, draft_config_from_target
from eyas.train import dist as D
from eyas.train.masks import BlockMask, TTTBlockMasks, document_ids, ttt_block_mask_reference
from eyas.train.ttt import TargetHead, TTTUnroll, step_valid

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
                num_hidden_layers=32, model_type="llama")
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
            rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512, num_hidden_layers=4, model_type="llama")
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.0}


def draft_flops_per_token(cfg, T: int, K: int, valid_frac: float) -> float:
    """Forward matmul FLOPs per token for the K-step unroll (x3 for forward + backward).
    Attention counts the unmasked keys only: a causal prefix (T/2 on average) + k diagonal entries."""
    H, I, nh, nkv, d = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                        cfg.head_dim)
    per_step = 2 * (2 * H * (nh + 2 * nkv) * d + nh * d * H + 3 * H * I) + 2 * H * cfg.draft_vocab_size * valid_frac
    attn = sum(4 * nh * d * (T / 2 + k) for k in range(K))
    return 3 * (2 * cfg.num_aux * cfg.target_hidden_size * H + K * per_step + attn)


def packed_positions(B: int, T: int, docs: int, dev) -> torch.Tensor:
    """[B, T] position ids of `docs` equal documents per row (the last takes the remainder)."""
    lengths = [T // docs] * (docs - 1) + [T - (T // docs) * (docs - 1)]
    return torch.cat([torch.arange(n) for n in lengths]).expand(B, T).contiguous().to(dev)


def mask_build_ms(pos: torch.Tensor, K: int, sync, reps: int = 3) -> dict | None:
    """ms to build one optimizer step's K TTT BlockMasks: create_block_mask over the token grid (the previous
    path) vs the direct block-grid construction training uses (train/masks.py). One untimed build each first."""
    if BlockMask is None:
        return None
    doc = document_ids(pos)

    def direct():
        masks = TTTBlockMasks(doc)
        return [masks(k) for k in range(K)]

    out = {}
    for name, build in (("create_block_mask", lambda: [ttt_block_mask_reference(doc, k) for k in range(K)]),
                        ("direct", direct)):
        build()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            build()
        sync()
        out[name] = round((time.perf_counter() - t0) / reps * 1e3, 3)
    return {**out, "reps": reps}


def profile_summary(step, dev, top: int = 15) -> list[dict]:
    """Where a step's time goes: torch.profiler over 2 steps, ops by self device (or CPU) time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(2):
            step()
    attr = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    ev = [e for e in prof.key_averages() if getattr(e, attr, 0) > 0]
    total = sum(getattr(e, attr) for e in ev) or 1
    ev.sort(key=lambda e: -getattr(e, attr))
    return [{"op": e.key, "ms_per_step": round(getattr(e, attr) / 2e3, 3), "share": round(getattr(e, attr) / total, 4),
             "calls_per_step": e.count // 2} for e in ev[:top]]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (smoke test)")
    p.add_argument("--seq", type=int, default=None, help="tokens per row (default 2048; tiny 64)")
    p.add_argument("--batch", type=int, default=None, help="rows per step per process (default global-batch / world)")
    p.add_argument("--global-batch", type=int, default=None, help="rows per optimizer step over all processes "
                   "(default batch x world)")
    p.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp", help="strategy under torchrun")
    p.add_argument("--ttt-steps", type=int, default=None, help="default 7; tiny 3")
    p.add_argument("--draft-vocab", type=int, default=None, help="default 32000; tiny 128")
    p.add_argument("--docs", type=int, default=4, help="documents packed per row (document masking)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; tiny 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; tiny 1)")
    p.add_argument("--device", default=None)
    p.add_argument("--attention", choices=["flex", "dense"], default=None)
    p.add_argument("--no-compile", action="store_true", help="eager flex attention (slow; for debugging)")
    p.add_argument("--variants", default="plain,fused,compiled", help="comma list of plain | fused | compiled")
    p.add_argument("--loss-chunk", type=int, default=4096, help="rows per lm-head chunk of the fused loss")
    p.add_argument("--long-seq", type=int, default=None, help="also run plain and fused at this many tokens "
                   "(peak memory; default 16384 on GPU, off on CPU; 0 = off)")
    p.add_argument("--no-profile", action="store_true", help="skip the profiler summary")
    p.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak for MFU (default by GPU name)")
    p.add_argument("--out", default=None, help="write the JSON result here")
    a = p.parse_args(argv)

    shape = TINY if a.tiny else LLAMA_8B
    kind = torch.device(a.device or ("cpu" if a.tiny or not torch.cuda.is_available() else "cuda")).type
    d = D.init(kind)
    dev = torch.device(f"cuda:{d.local_rank}") if kind == "cuda" else torch.device(kind)
    gpu = dev.type == "cuda"
    G = a.global_batch or (a.batch or 1) * d.world
    if G % d.world or (a.batch and a.batch * d.world != G):
        p.error(f"--global-batch {G} must equal --batch x {d.world} processes")
    B = G // d.world
    if not d.main:
        a.out = None
    T, K = a.seq or (64 if a.tiny else 2048), a.ttt_steps or (3 if a.tiny else 7)
    Vd = a.draft_vocab or (128 if a.tiny else 32000)
    steps, warmup = a.steps or (3 if a.tiny else 10), a.warmup if a.warmup is not None else (1 if a.tiny else 3)
    attention = a.attention or ("flex" if gpu else "dense")
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in ("plain", "fused", "compiled")]
    if bad or not variants:
        p.error(f"--variants {a.variants!r}: use a comma list of plain, fused, compiled")
    long_seq = a.long_seq if a.long_seq is not None else (16384 if gpu and d.world == 1 else 0)
    if d.world > 1 and (len(variants) > 1 or long_seq):
        p.error("under torchrun give one --variants entry and --long-seq 0 (a module is wrapped once)")
    if attention == "flex" and gpu and not a.no_compile:
        compile_flex_attention()

    torch.manual_seed(0)
    tcfg = SimpleNamespace(**shape)
    N = shape["num_hidden_layers"]
    cfg = draft_config_from_target(tcfg, aux_layer_ids=default_aux_layer_ids(N), draft_vocab_size=Vd)
    V, H = cfg.vocab_size, cfg.hidden_size
    ids = torch.sort(torch.randperm(V)[:Vd]).values
    d2t, t2d = ids - torch.arange(Vd), torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    draft = Eagle3Draft(cfg)
    draft.set_vocab_map(d2t, t2d)
    draft = draft.to(dev)
    hdt = torch.bfloat16 if gpu else torch.float32
    norm = torch.nn.RMSNorm(H, eps=cfg.rms_norm_eps).to(dev, hdt)
    head = TargetHead(norm, (torch.randn(V, H, device=dev) * H ** -0.5).to(hdt), d2t.to(dev), t2d.to(dev))
    eager_layer = draft.layers[0]
    amp = torch.bfloat16 if gpu else None

    def sync():
        if gpu:
            torch.cuda.synchronize()

    def make_step(variant: str, T: int, G: int = G):
        B = G // d.world
        # dynamic=False: one kernel per TTT step's key length (7 shapes), never a symbolic-shape flex kernel
        draft.layers[0] = torch.compile(eager_layer, dynamic=False) if variant == "compiled" else eager_layer
        unroll = TTTUnroll(draft, K, attention=attention, loss_chunk=0 if variant == "plain" else a.loss_chunk)
        model = D.wrap(unroll, d, a.parallel, dev)
        # after wrapping: FSDP2 replaces the parameters with sharded ones; a fresh AdamW per variant
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4, betas=(0.9, 0.95))
        pos = packed_positions(B, T, a.docs, dev)
        # The same global batch whatever the world size: rows made on the CPU from one seed, rank r takes r::world.
        g = torch.Generator().manual_seed(1)
        mine = slice(d.rank, G, d.world)
        input_ids = torch.randint(0, V, (G, T), generator=g)[mine].to(dev)
        loss_mask = torch.ones(B, T, dtype=torch.bool, device=dev)
        aux = torch.randn(G, T, cfg.num_aux, H, generator=g, dtype=hdt)[mine].to(dev)
        last = torch.randn(G, T, H, generator=g, dtype=hdt)[mine].to(dev)

        def step():
            t0 = time.perf_counter()
            probs, ok, arg = head(last)
            ok = torch.ones_like(ok)          # random head: count every position, as a trained target mostly would
            sync()
            t1 = time.perf_counter()
            with torch.autocast(dev.type, dtype=amp) if amp is not None else nullcontext():
                loss, _ = model(input_ids, pos, loss_mask, aux, probs, ok, arg)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([q for q in model.parameters() if q.requires_grad], 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            # the global loss: the mean of the ranks' losses (DDP/FSDP average their gradients the same way)
            return t1 - t0, time.perf_counter() - t1, float(d.all_reduce(loss.detach().clone())) / d.world
        return step, pos, loss_mask

    name = torch.cuda.get_device_name(dev) if gpu else platform.processor() or "cpu"
    peak = a.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)

    def measure(variant: str, T: int, n_steps: int, n_warm: int, G: int = G) -> dict:
        print(f"[bench/train] {variant} seq {T}: {n_warm} warm-up + {n_steps} timed steps", flush=True)
        if gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            step, pos, loss_mask = make_step(variant, T, G)
            t_c = time.perf_counter()
            for _ in range(n_warm):
                step()
            warm_s = time.perf_counter() - t_c
            times = [step() for _ in range(n_steps)]
        except torch.OutOfMemoryError as e:
            draft.zero_grad(set_to_none=True)
            return {"variant": variant, "seq": T, "oom": str(e).splitlines()[0][:200]}
        except Exception as e:  # noqa: BLE001 - a variant that fails (e.g. compile) is reported, the rest still run
            if d.world > 1:
                raise
            draft.layers[0] = eager_layer
            draft.zero_grad(set_to_none=True)
            print(f"[bench/train]   {variant} failed: {type(e).__name__}: {e}", flush=True)
            return {"variant": variant, "seq": T, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        head_s = sum(t[0] for t in times) / n_steps
        draft_s = sum(t[1] for t in times) / n_steps
        doc = document_ids(pos)
        valid = sum(float(step_valid(doc, loss_mask, torch.ones_like(loss_mask), k).float().mean())
                    for k in range(K)) / K
        flops = draft_flops_per_token(cfg, T, K, valid) * G * T
        r = {"variant": variant, "seq": T, "rows": G, "warmup_s": round(warm_s, 2),
             "step_s": round(head_s + draft_s, 4), "target_head_s": round(head_s, 4), "draft_step_s": round(draft_s, 4),
             "tokens_per_s": round(G * T / (head_s + draft_s), 1), "losses": [round(t[2], 5) for t in times],
             "draft_tflops_per_step": round(flops / 1e12, 3),
             "achieved_tflops": round(flops / (head_s + draft_s) / 1e12, 2),
             "mfu": round(flops / (head_s + draft_s) / (peak * 1e12), 4) if peak else None,
             "peak_memory_gib": round(torch.cuda.max_memory_allocated(dev) / 2 ** 30, 2) if gpu else None}
        if d.world > 1:   # MFU against all the devices' peak
            r["mfu"] = round(r["mfu"] / d.world, 4) if r["mfu"] else None
        print(f"[bench/train]   {r['tokens_per_s']} tok/s, MFU {r['mfu']}, peak {r['peak_memory_gib']} GiB", flush=True)
        r["_step"] = step
        return r

    runs = [measure(v, T, steps, warmup) for v in variants]
    last_ok = next((r for r in reversed(runs) if "_step" in r), None)
    profile = None
    if not a.no_profile and last_ok is not None and d.world == 1:
        draft.layers[0] = (torch.compile(eager_layer, dynamic=False) if last_ok["variant"] == "compiled"
                           else eager_layer)
        profile = {"variant": last_ok["variant"], "top_ops": profile_summary(last_ok["_step"], dev)}
    # one row of long_seq tokens whatever --batch is: the claim is that one 16k-token sequence fits
    long = [measure(v, long_seq, 2, 1, G=1) for v in ("plain", "fused")] if long_seq else []
    mask_ms = mask_build_ms(packed_positions(B, T, a.docs, dev), K, sync)
    for r in runs + long:
        r.pop("_step", None)
    ok_runs = [r for r in runs if "tokens_per_s" in r]
    if not ok_runs:
        raise SystemExit(f"bench/train.py: every variant failed: {runs}")
    best = max(ok_runs, key=lambda r: r["tokens_per_s"])
    res = {
        "bench": "train", "device": name, "torch": torch.__version__, "shape": "tiny" if a.tiny else "llama-3.1-8b",
        "hidden": H, "vocab": V, "draft_vocab": Vd, "ttt_steps": K, "seq": T, "batch": B, "global_batch": G,
        "world": d.world, "parallel": a.parallel if d.world > 1 else None, "docs_per_row": a.docs,
        "attention": attention, "compiled": attention == "flex" and gpu and not a.no_compile,
        "loss_chunk": a.loss_chunk, "best_variant": best["variant"],
        **{k: best[k] for k in ("step_s", "target_head_s", "draft_step_s", "tokens_per_s", "draft_tflops_per_step",
                                "achieved_tflops", "mfu", "peak_memory_gib")},
        "peak_tflops_assumed": peak,
        "draft_params_trainable": sum(q.numel() for q in draft.parameters() if q.requires_grad),
        "variants": runs, "long_seq": long, "profile": profile, "mask_build_ms_per_step": mask_ms,
    }
    try:
        import speculators  # noqa: F401  (its trainer would be the comparison point)
        res["speculators"] = f"installed {getattr(speculators, '__version__', '?')}; comparison not run by this script"
    except ImportError:
        res["speculators"] = "not installed in this environment (GPU stack has no internet); no ratio"
    D.shutdown(d)
    if not d.main:
        return res
    print(json.dumps(res, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
