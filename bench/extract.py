"""Extraction throughput: end-to-end (forward + capture + encode + copy + write store) vs a plain forward
vs the bf16 matmul ceiling, all measured in the same run on the same device.

GPU (the real benchmark; Llama-3.1-8B shapes, random bf16 weights, 65k tokens at length 2048):
    python bench/extract.py --out bench/results/extract-h200.json
CPU smoke run at tiny shapes:
    python bench/extract.py --tiny --out bench/results/extract-cpu-tiny.json

--compile (default on GPU) measures the plain forward eager and with compiled decoder layers
(target/compiled.py), checks the compiled capture against the eager one on the first batch, runs the stores
compiled, and checks the bf16 store's first rows against the eager states.

Ceiling: tokens/s = measured matmul FLOP/s / FLOPs per token, where FLOPs per token = 2 x (decoder
linear parameters) + attention (2 x hidden x seq per layer, causal average). The lm_head is not in
it: extraction never runs it.

Sustained ceiling: the same square GEMM back to back for seconds (a forward's duration), per window, with the SM
clock and power sampled beside it (and beside the timed forward and the bf16 store): the 50-call burst runs at
boost clocks, a long extraction at what the power limit leaves. Every fraction is given against both.

Shape bound (bench/_gemm.py): one decoder layer's GEMMs (separate, and with q/k/v and gate/up fused) and its
causal attention timed the ceiling's way at the run's batch shape; tokens / (layers x (GEMMs + attention)) is
what a forward with no other cost could reach, so it says how much of the ceiling cuBLAS allows at these shapes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
from _emit import emit  # noqa: E402
from _gemm import (GpuSampler, matmul_sustained, matmul_tflops, shape_bound, summary,  # noqa: E402
                   sustained_layer_bound, sync)
from capture import random_llama  # noqa: E402

from eyas.store import HiddenStateStore, bytes_per_token, target_identity
from eyas.store.extract import HostCopier, extract_to_store, make_batches
from eyas.target.capture import backbone_of
from eyas.store.format import encode_states
from eyas.target import capture, default_aux_layer_ids, find_layout
from eyas.target.compiled import compile_layers, uncompile_layers

LLAMA_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)
TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, max_position_embeddings=512)


def build_model(shape: dict, device: torch.device):
    """Random bf16 weights without ever materialising fp32 ones (bench/capture.py's builder)."""
    model = random_llama(shape, device, torch.bfloat16, "sdpa")
    return model, model.config


class RandomRows:
    """A PREPARED-like dataset in memory: single-document rows of random ids."""

    def __init__(self, rows: int, seq: int, vocab: int):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (rows, seq), generator=g)
        self.manifest = {"max_length": seq, "bench": "random"}

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        n = self.ids.shape[1]
        return {"input_ids": self.ids[i], "loss_mask": torch.ones(n, dtype=torch.bool), "position_ids": torch.arange(n)}


def flops_per_token(model, cfg, seq: int) -> float:
    layers = backbone_of(model, find_layout(model)).layers
    linear = sum(p.numel() for p in layers.parameters() if p.dim() == 2)
    return 2 * linear + 2 * cfg.hidden_size * seq * cfg.num_hidden_layers


@torch.inference_mode()
def plain_forward(model, data, token_budget: int, device, limit: int | None = None) -> float:
    """tokens/s of the backbone alone over the same batches (no hooks, no copies, no store); `limit`: only the
    first batches (a warm-up)."""
    layout = find_layout(model)
    backbone = backbone_of(model, layout)
    batches = make_batches({i: data[i]["input_ids"].numel() for i in range(len(data))}, token_budget)[:limit]
    # position ids passed as extraction passes them: the same masks, the same compiled graph
    run = lambda b: backbone(input_ids=torch.stack([data[i]["input_ids"] for i in b]).to(device),  # noqa: E731
                             position_ids=torch.stack([data[i]["position_ids"] for i in b]).to(device), use_cache=False)
    run(batches[0])                                                  # warm-up (kernels, allocator)
    sync(device)
    t0 = time.perf_counter()
    for b in batches:
        run(b)
    sync(device)
    return sum(len(b) for b in batches) * data.ids.shape[1] / (time.perf_counter() - t0)


@torch.inference_mode()
def forward_capture(model, data, token_budget: int, device, dtype: str) -> float:
    """tokens/s of forward + hook capture + encode + device->host copy, nothing written: the gap to the
    plain forward is the capture cost, the gap to end-to-end is the store writer's."""
    layout = find_layout(model)
    backbone, copier = backbone_of(model, layout), HostCopier(device)
    aux_ids = default_aux_layer_ids(layout.num_layers)
    batches = make_batches({i: data[i]["input_ids"].numel() for i in range(len(data))}, token_budget)

    def run(b):
        ids = torch.stack([data[i]["input_ids"] for i in b]).to(device)
        pos = torch.stack([data[i]["position_ids"] for i in b]).to(device)
        with capture(layout, aux_ids) as cap:
            backbone(input_ids=ids, position_ids=pos, use_cache=False)
        enc = encode_states(cap.aux, cap.last, dtype)
        enc["finite"] = torch.isfinite(cap.aux).flatten(2).all(-1) & torch.isfinite(cap.last).all(-1)
        return copier(enc)

    run(batches[0])
    sync(device)
    t0 = time.perf_counter()
    pending = [run(b)[1] for b in batches]
    for ev in pending:
        if ev is not None:
            ev.synchronize()
    sync(device)
    return sum(len(b) for b in batches) * data.ids.shape[1] / (time.perf_counter() - t0)


KINDS = (("matmul", ("gemm", "nvjet", "cutlass", "sm90_xmma", "aten::mm", "aten::addmm")),
         ("attention", ("flash", "fmha", "sdpa", "attention", "cudnn")))


@torch.inference_mode()
def forward_profile(model, data, token_budget: int, device) -> dict:
    """Where one batch's forward time goes (torch.profiler): kernels grouped as matmul / attention / other,
    and the top 12, so the gap between the forward and the matmul ceiling has names."""
    from torch.profiler import ProfilerActivity, profile
    layout = find_layout(model)
    backbone = backbone_of(model, layout)
    b = make_batches({i: data[i]["input_ids"].numel() for i in range(len(data))}, token_budget)[0]
    ids = torch.stack([data[i]["input_ids"] for i in b]).to(device)
    pos = torch.stack([data[i]["position_ids"] for i in b]).to(device)
    backbone(input_ids=ids, position_ids=pos, use_cache=False)
    sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        backbone(input_ids=ids, position_ids=pos, use_cache=False)
        sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    rows = [(e.key, getattr(e, key, 0) / 1e3, e.count) for e in prof.key_averages() if getattr(e, key, 0) > 0]
    # CUDA: the kernels only — recent torch also books their device time on the aten op that launched them
    # (aten::mm = the sum of its nvjet kernels), which counted every matmul twice; CPU: aten ops (no kernels)
    rows = [r for r in rows if (device.type == "cuda") != r[0].startswith("aten::")]
    total = sum(ms for _, ms, _ in rows)
    by_kind: dict[str, float] = {}
    for name, ms, _ in rows:
        kind = next((k for k, pats in KINDS if any(p in name.lower() for p in pats)), "other")
        by_kind[kind] = by_kind.get(kind, 0.0) + ms
    top = sorted(rows, key=lambda r: -r[1])[:12]
    return {"tokens": ids.numel(), "kernel_ms": round(total, 3),
            "by_kind_ms": {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top": [{"name": n[:100], "ms": round(ms, 3), "calls": c} for n, ms, c in top]}


@torch.inference_mode()
def first_batch_states(model, data, token_budget: int, device, aux_ids) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    layout = find_layout(model)
    rows = make_batches({i: data[i]["input_ids"].numel() for i in range(len(data))}, token_budget)[0]
    ids = torch.stack([data[i]["input_ids"] for i in rows]).to(device)
    pos = torch.stack([data[i]["position_ids"] for i in rows]).to(device)
    with capture(layout, aux_ids) as cap:
        backbone_of(model, layout)(input_ids=ids, position_ids=pos, use_cache=False)
    return rows, cap.aux.float().cpu(), cap.last.float().cpu()


def compare(ref: tuple, new_aux: torch.Tensor, new_last: torch.Tensor) -> dict:
    _, aux, last = ref
    out = {"bit_equal": bool(torch.equal(aux, new_aux) and torch.equal(last, new_last))}
    for k, (x, y) in {"aux": (aux, new_aux), "last": (last, new_last)}.items():
        rel = (y - x).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-12)
        out[f"{k}_max_abs_diff"] = float((y - x).abs().max())
        out[f"{k}_max_rel_err"] = round(float(rel.max()), 6)
    return out


def fp8_error(bf16_dir: Path, fp8_dir: Path, samples: int = 4) -> dict:
    a, b = HiddenStateStore(bf16_dir, check_finite=False), HiddenStateStore(fp8_dir, check_finite=False)
    errs = []
    for i in range(min(samples, len(a))):
        for key in ("aux", "last"):
            x, y = a[i][key].float(), b[i][key].float()
            errs.append((y - x).norm(dim=-1).flatten() / x.norm(dim=-1).flatten().clamp_min(1e-12))
    e = torch.cat(errs)
    return {"mean_rel_err": round(float(e.mean()), 5), "max_rel_err": round(float(e.max()), 5)}


def ceilings(cfg, seq: int, rows: int, fpt: float, device, mm_n: int, mm_iters: int) -> dict:
    """The burst and sustained square GEMM (clocks and power sampled), the per-shape bound (burst timing) and one
    layer's kernels sustained, at `rows` x `seq` tokens a batch: the full run's first part, and all of
    --ceiling-only."""
    secs = 0.2 if device.type == "cpu" else 4.0
    tflops = matmul_tflops(device, mm_n, mm_iters)
    with GpuSampler(device) as smi:
        sus = matmul_sustained(device, mm_n, secs)
    sus["gpu"] = smi.summary()
    ceiling, ceiling_sus = tflops * 1e12 / fpt, sus["steady_tflops"] * 1e12 / fpt
    print(f"[bench/extract] square GEMM: burst {tflops:.1f} TFLOP/s, sustained {sus['steady_tflops']} "
          f"(first window {sus['first_window_tflops']}, clocks {sus['gpu']})", flush=True)
    sb = shape_bound(cfg, rows, seq, ceiling, device, mm_iters)
    print(f"[bench/extract] {summary(sb)}", flush=True)
    with GpuSampler(device) as smi:
        layer = sustained_layer_bound(cfg, rows, seq, ceiling_sus, device, secs)
    layer["gpu"] = smi.summary()
    return {"matmul_n": mm_n, "matmul_tflops": round(tflops, 2), "flops_per_token": fpt,
            "ceiling_tokens_per_s": round(ceiling, 1), "matmul_sustained": sus,
            "sustained_ceiling_tokens_per_s": round(ceiling_sus, 1), "sustained_layer_bound": layer,
            "shape_bound": sb}


def ceiling_only(shape: dict, seq: int, budget: int, device, mm_n: int, mm_iters: int) -> dict:
    """--ceiling-only: `ceilings` from the config alone (flops_per_token's formula: 2 x linear weights + causal
    attention; tests check it against the model's count)."""
    from types import SimpleNamespace

    from _gemm import projections
    cfg = SimpleNamespace(**shape)
    fpt = 2 * cfg.num_hidden_layers * sum(n * k for n, k in projections(cfg)[0].values()) \
        + 2 * cfg.hidden_size * seq * cfg.num_hidden_layers
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (smoke run)",
            "torch": torch.__version__, "shape": shape, "seq": seq,
            **ceilings(cfg, seq, max(1, budget // seq), fpt, device, mm_n, mm_iters)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (smoke run)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--tokens", type=int, default=None, help="tokens to extract (default 524288 = 32 full batches, "
                    "one compiled shape, 4x --max-pending: the writer's steady state and a final flush that a long "
                    "run amortises; tiny 4096)")
    ap.add_argument("--seq", type=int, default=None, help="row length (default 2048, tiny 128)")
    ap.add_argument("--token-budget", type=int, default=None, help="tokens per batch (default 16384, tiny 512)")
    ap.add_argument("--shard-mb", type=float, default=64.0, help="small shards keep the final (unoverlapped) write short")
    ap.add_argument("--writer-threads", type=int, default=8)
    ap.add_argument("--max-pending", type=int, default=8, help="batches queued for the writer before the loop waits")
    ap.add_argument("--compile", choices=["auto", "on", "off"], default="auto", help="compiled decoder layers "
                    "(auto: on for CUDA)")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp8"])
    ap.add_argument("--store-dir", type=Path, default=None, help="where the stores go (default a temp dir)")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiler summary of one forward batch")
    ap.add_argument("--ceiling-only", action="store_true", help="only the ceilings and bounds (burst, sustained, "
                    "per shape; no model, no stores): seconds on a GPU")
    ap.add_argument("--out", type=Path, default=None, help="JSON results file")
    a = ap.parse_args(argv)

    device = torch.device(a.device or ("cpu" if a.tiny or not torch.cuda.is_available() else "cuda"))
    shape = TINY if a.tiny else LLAMA_8B
    seq = a.seq or (128 if a.tiny else 2048)
    tokens = a.tokens or (4096 if a.tiny else 524288)
    budget = a.token_budget or (512 if a.tiny else 16384)
    mm_n, mm_iters = (1024, 5) if device.type == "cpu" else (8192, 50)

    if a.ceiling_only:
        return emit(ceiling_only(shape, seq, budget, device, mm_n, mm_iters), a.out)
    model, cfg = build_model(shape, device)
    layout = find_layout(model)
    data = RandomRows(max(1, tokens // seq), seq, cfg.vocab_size)
    aux_ids = default_aux_layer_ids(layout.num_layers)
    # the bounds at the forward's own shapes: M = the first batch's tokens (make_batches' packing)
    rows = len(make_batches({i: data[i]["input_ids"].numel() for i in range(len(data))}, budget)[0])
    bounds = ceilings(cfg, seq, rows, flops_per_token(model, cfg, seq), device, mm_n, mm_iters)
    ceiling, ceiling_sus = bounds["ceiling_tokens_per_s"], bounds["sustained_ceiling_tokens_per_s"]
    plain_forward(model, data, budget, device, limit=4)  # warm-up: allocator, kernels, clocks
    fwd = eager_fwd = plain_forward(model, data, budget, device)
    compiled = a.compile == "on" or (a.compile == "auto" and device.type == "cuda")
    eager_ref = first_batch_states(model, data, budget, device, aux_ids)
    compiled_info = None
    if compiled:
        print("[bench/extract] compiling the decoder layers", flush=True)
        t_c = time.perf_counter()
        compile_layers(layout)
        try:
            plain_forward(model, data, budget, device, limit=2)   # compiles (once per batch shape)
        except Exception as e:  # noqa: BLE001 - report it and measure the eager path instead
            print(f"[bench/extract] compile failed, eager from here: {type(e).__name__}: {e}", flush=True)
            uncompile_layers(layout)
            compiled, compiled_info = False, {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    fwd_smi = GpuSampler(device)
    if compiled:
        compile_s = time.perf_counter() - t_c
        with fwd_smi:
            fwd = plain_forward(model, data, budget, device)
        compiled_info = {"compile_s": round(compile_s, 1), "eager_forward_tokens_per_s": round(eager_fwd, 1),
                         "eager_forward_frac_of_ceiling": round(eager_fwd / ceiling, 4),
                         "capture_vs_eager": compare(eager_ref, *first_batch_states(model, data, budget, device,
                                                                                    aux_ids)[1:])}
    print(f"[bench/extract] ceiling {ceiling:.0f} tok/s (sustained {ceiling_sus:.0f}), forward {fwd:.0f} tok/s "
          f"({fwd / ceiling:.1%}; {fwd / ceiling_sus:.1%} of the sustained ceiling; clocks {fwd_smi.summary()})",
          flush=True)
    prof = None if a.no_profile else forward_profile(model, data, budget, device)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (smoke run: numbers "
              "at tiny shapes on a shared CPU are noise, not a benchmark)",
              "torch": torch.__version__, "shape": shape, "seq": seq, "tokens": len(data) * seq,
              "token_budget": budget, "aux_layer_ids": aux_ids, **bounds,
              "forward_frac_of_sustained_ceiling": round(fwd / ceiling_sus, 4), "forward_gpu": fwd_smi.summary(),
              "forward_tokens_per_s": round(fwd, 1), "forward_frac_of_ceiling": round(fwd / ceiling, 4),
              "compiled": compiled_info, "forward_profile": prof, "writer_threads": a.writer_threads, "max_pending": a.max_pending,
              "stores": {}}
    root = a.store_dir or Path(tempfile.mkdtemp(prefix="eyas-bench-extract-"))
    dirs = {}
    try:
        for dtype in a.dtypes:
            out = root / dtype
            shutil.rmtree(out, ignore_errors=True)
            ident = target_identity("bench-random", cfg, aux_ids, dtype, hidden_size=cfg.hidden_size,
                                    num_layers=cfg.num_hidden_layers, vocab_size=cfg.vocab_size)
            fc = forward_capture(model, data, budget, device, dtype)
            kw = dict(identity=ident, token_budget=budget, shard_mb=a.shard_mb, writer_threads=a.writer_threads,
                      device=device, max_pending=a.max_pending)
            # Cold: the first run pays pinned-memory allocation and page-cache growth; warm = steady state.
            sync(device)
            cold = extract_to_store(model, layout, data, root / f"{dtype}-cold", **kw)
            shutil.rmtree(root / f"{dtype}-cold")
            sync(device)
            with GpuSampler(device) as store_smi:
                s = extract_to_store(model, layout, data, out, **kw)
            disk = sum(p.stat().st_size for p in out.glob("shard-*.safetensors"))
            result["stores"][dtype] = {
                "forward_capture_copy_tokens_per_s": round(fc, 1),
                "cold_tokens_per_s": cold["tokens_per_s"],
                "tokens_per_s": s["tokens_per_s"], "frac_of_ceiling": round(s["tokens_per_s"] / ceiling, 4),
                "frac_of_sustained_ceiling": round(s["tokens_per_s"] / ceiling_sus, 4), "gpu": store_smi.summary(),
                "frac_of_forward": round(s["tokens_per_s"] / fwd, 4), "seconds": s["seconds"],
                "writer_stall_s": s["writer_stall_s"], "writer_busy_s": s["writer_busy_s"],
                # steady state: every batch through forward, capture, copy and into the writer's queue, without
                # the final flush (valid as a rate only when the writer never stalled the loop)
                "loop_s": s["loop_s"], "flush_s": s["flush_s"],
                "steady_tokens_per_s": round(s["tokens"] / s["loop_s"], 1) if s["loop_s"] else None,
                "steady_frac_of_ceiling": round(s["tokens"] / s["loop_s"] / ceiling, 4) if s["loop_s"] else None,
                "steady_frac_of_sustained_ceiling": round(s["tokens"] / s["loop_s"] / ceiling_sus, 4)
                if s["loop_s"] else None,
                # what the writer threads could sustain (their busy time is summed over threads): a long run goes
                # at min(steady, this)
                "writer_capacity_tokens_per_s": round(s["tokens"] * a.writer_threads / s["writer_busy_s"], 1)
                if s["writer_busy_s"] else None,
                "padding_fraction": s["padding_fraction"], "shards": s["shards"],
                "disk_bytes_per_token": round(disk / s["tokens"], 1),
                "formula_bytes_per_token": bytes_per_token(cfg.hidden_size, len(aux_ids), dtype),
                "write_mb_per_s": round(disk / s["seconds"] / 2**20, 1)}
            print(f"[bench/extract] {dtype} store: {s['tokens_per_s']:.0f} tok/s "
                  f"({s['tokens_per_s'] / ceiling:.1%} of ceiling, {s['tokens_per_s'] / ceiling_sus:.1%} of the "
                  f"sustained one), writer stall {s['writer_stall_s']} s", flush=True)
            dirs[dtype] = out
        if {"bf16", "fp8"} <= set(dirs):
            result["fp8_vs_bf16"] = fp8_error(dirs["bf16"], dirs["fp8"])
        if "bf16" in dirs:   # the fast end-to-end path's stored states against the eager forward's
            st = HiddenStateStore(dirs["bf16"], check_finite=False)
            rows = eager_ref[0]
            got = [st[i] for i in rows]
            ref = (rows, eager_ref[1].to(torch.bfloat16).float(), eager_ref[2].to(torch.bfloat16).float())
            result["bf16_store_vs_eager_forward"] = compare(
                ref, torch.stack([g["aux"].float() for g in got]), torch.stack([g["last"].float() for g in got]))
    finally:
        if a.store_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return emit(result, a.out)


if __name__ == "__main__":
    main(sys.argv[1:])
