"""Matmul timings for bench/extract.py: the square-GEMM ceiling, and a shape-aware bound (one decoder layer's
GEMMs and attention at the run's batch shape), so a forward below the ceiling can be split into "cuBLAS is
slower at the forward's shapes" and "the forward spends time outside GEMMs and attention"."""

from __future__ import annotations

import subprocess
import threading
import time

import torch
import torch.nn.functional as F


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn, device: torch.device, iters: int, warmup: int = 3) -> float:
    """Wall time per call over `iters` back-to-back calls, synchronised at both ends, after `warmup` calls
    (cuBLAS heuristics, allocator). At these sizes the launches hide behind the GPU's queue."""
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / iters


def matmul_tflops(device: torch.device, n: int, iters: int) -> float:
    """bf16 TFLOP/s of one square n^3 GEMM: the ceiling's rate."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return 2 * n**3 / seconds_per_call(lambda: a @ b, device, iters) / 1e12


def sustained(fn, device: torch.device, flops: float, seconds: float, window_s: float = 0.25) -> dict:
    """`fn` run back to back for `seconds`, timed per window of ~`window_s` with CUDA events (no sync in between):
    a burst of 50 calls (~70 ms on an H200) runs at boost clocks, a forward of seconds at whatever clocks the power
    limit leaves. `flops`: one call's. Returns the first and last windows' TFLOP/s and the steady mean (second
    half). On a CPU: the same windows timed by the host clock."""
    per = seconds_per_call(fn, device, 3, warmup=2)
    chunk = max(1, int(window_s / per))
    windows = max(2, int(seconds / (chunk * per)))
    rates: list[float] = []
    if device.type == "cuda":
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(windows + 1)]
        ev[0].record()
        for w in range(windows):
            for _ in range(chunk):
                fn()
            ev[w + 1].record()
        torch.cuda.synchronize(device)
        rates = [flops * chunk / (ev[w].elapsed_time(ev[w + 1]) / 1e3) / 1e12 for w in range(windows)]
    else:
        for _ in range(windows):
            t0 = time.perf_counter()
            for _ in range(chunk):
                fn()
            rates.append(flops * chunk / (time.perf_counter() - t0) / 1e12)
    steady = rates[len(rates) // 2:]
    return {"seconds": round(windows * chunk * per, 2), "windows": windows, "calls_per_window": chunk,
            "first_window_tflops": round(rates[0], 2), "last_window_tflops": round(rates[-1], 2),
            "steady_tflops": round(sum(steady) / len(steady), 2), "min_window_tflops": round(min(rates), 2)}


def matmul_sustained(device: torch.device, n: int, seconds: float) -> dict:
    """The square GEMM of the ceiling, sustained (see `sustained`)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return sustained(lambda: a @ b, device, 2 * n**3, seconds)


class GpuSampler:
    """`nvidia-smi` sampled every `ms` while the block runs: SM clock (MHz), power (W), temperature (C) — whether
    a timing ran at boost clocks or power-limited ones. Empty (None summary) where there is no nvidia-smi."""

    QUERY = "clocks.sm,power.draw,temperature.gpu"

    def __init__(self, device: torch.device, ms: int = 200):
        self.device, self.ms, self.rows, self.proc = device, ms, [], None

    def __enter__(self):
        if self.device.type != "cuda":
            return self
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        try:
            self.proc = subprocess.Popen(["nvidia-smi", f"--id={index}", f"--query-gpu={self.QUERY}",
                                          "--format=csv,noheader,nounits", f"-lms={self.ms}"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return self
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.rows.append([float(x) for x in line.split(",")])
            except ValueError:   # "[N/A]" fields
                pass

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
            self._reader.join(timeout=2)
        return False

    def summary(self) -> dict | None:
        if not self.rows:
            return None
        cols = list(zip(*self.rows))
        mean = lambda c: round(sum(c) / len(c), 1)  # noqa: E731
        return {"samples": len(self.rows), "sm_mhz_mean": mean(cols[0]), "sm_mhz_min": min(cols[0]),
                "sm_mhz_max": max(cols[0]), "power_w_mean": mean(cols[1]), "power_w_max": max(cols[1]),
                "temp_c_max": max(cols[2])}


def head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def projections(cfg) -> tuple[dict, dict]:
    """{name: (out_features, in_features)} of one decoder layer's linears as the forward runs them (the
    compiled forward's profile shows seven GEMMs a layer), and as a forward could fuse them (q/k/v one GEMM,
    gate/up one)."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, head_dim(cfg)
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    separate = {"q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q), "gate": (i, h), "up": (i, h), "down": (h, i)}
    fused = {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * i, h), "down": (h, i)}
    return separate, fused


@torch.inference_mode()
def time_gemms(shapes: dict, m: int, device: torch.device, iters: int, cache: dict) -> dict:
    """Seconds and TFLOP/s of F.linear(x [m, in], w [out, in]) (nn.Linear's layout) per name; a shape is
    timed once (k/v, gate/up, o in both sets share one)."""
    out = {}
    for name, (n, k) in shapes.items():
        if (n, k) not in cache:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
            cache[(n, k)] = seconds_per_call(lambda: F.linear(x, w), device, iters)
            del x, w
        s = cache[(n, k)]
        out[name] = {"out_features": n, "in_features": k, "s": s, "tflops": round(2 * m * n * k / s / 1e12, 2)}
    return out


@torch.inference_mode()
def time_attention(cfg, batch: int, seq: int, device: torch.device, iters: int) -> dict:
    """One layer's causal SDPA at [batch, heads, seq, head_dim], bf16, no mask: as transformers' sdpa path calls
    it (GQA through enable_gqa, else K/V expanded), so the same kernel (flash / cuDNN on a GPU) is picked."""
    h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, head_dim(cfg)
    # allocated [B, S, heads, D] and transposed, the layout the projections' views hand to SDPA
    q, k, v = (torch.randn(batch, seq, n, d, device=device, dtype=torch.bfloat16).transpose(1, 2)
               for n in (h, kvh, kvh))
    try:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        gqa, call = "enable_gqa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    except TypeError:   # torch < 2.5
        k, v = (t.repeat_interleave(h // kvh, dim=1) for t in (k, v))
        gqa, call = "expanded", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = seconds_per_call(call, device, iters)
    flops = 2 * batch * h * seq * seq * d   # QK^T and PV, 2 FLOPs a MAC, half the square under the causal mask
    return {"s": s, "tflops": round(flops / s / 1e12, 2), "gqa": gqa}


def shape_bound(cfg, batch: int, seq: int, ceiling_tokens_per_s: float, device: torch.device, iters: int) -> dict:
    """Tokens/s the forward could reach if a layer cost exactly its GEMMs + attention at this batch shape.
    Norms, RoPE, SiLU-mul, residual adds and the embedding are left out (memory-bound, a few % of the forward),
    so this is an upper bound: a forward at it would have zero overhead outside the matmuls and attention."""
    m, layers = batch * seq, cfg.num_hidden_layers
    separate, fused = projections(cfg)
    cache: dict = {}
    gemms = time_gemms(separate, m, device, iters, cache)
    fused_gemms = time_gemms(fused, m, device, iters, cache)
    attn = time_attention(cfg, batch, seq, device, iters)

    def bound(g: dict) -> dict:
        gemm_s = sum(e["s"] for e in g.values())
        tok = m / (layers * (gemm_s + attn["s"]))
        return {"layer_gemm_s": gemm_s,
                "layer_gemm_tflops": round(sum(2 * m * e["out_features"] * e["in_features"] for e in g.values())
                                           / gemm_s / 1e12, 2),
                "forward_bound_tokens_per_s": round(tok, 1),
                "forward_bound_frac_of_ceiling": round(tok / ceiling_tokens_per_s, 4),
                # attention free: what the projections alone allow
                "gemm_only_frac_of_ceiling": round(m / (layers * gemm_s) / ceiling_tokens_per_s, 4)}

    return {"tokens": m, "batch": batch, "seq": seq, "num_layers": layers, "iters": iters,
            **bound(gemms), "layer_attention_s": attn["s"], "gemms": gemms, "attention": attn,
            "fused": {**bound(fused_gemms), "gemms": fused_gemms}}


@torch.inference_mode()
def sustained_layer_bound(cfg, batch: int, seq: int, sustained_ceiling: float, device: torch.device,
                          seconds: float) -> dict:
    """One decoder layer's seven GEMMs and its causal attention, in the forward's order and at its batch shape, run
    back to back for `seconds` (the forward's own kernels, at the clocks a seconds-long forward gets): tokens/s a
    forward with no other cost reaches then, and that as a fraction of the sustained square-GEMM ceiling."""
    m, layers, (h, kvh, d) = batch * seq, cfg.num_hidden_layers, (cfg.num_attention_heads, cfg.num_key_value_heads,
                                                                  head_dim(cfg))
    separate, _ = projections(cfg)
    xs = {k: torch.randn(m, k, device=device, dtype=torch.bfloat16) for k in {k for _, k in separate.values()}}
    ws = {name: torch.randn(n, k, device=device, dtype=torch.bfloat16) for name, (n, k) in separate.items()}
    q, kk, v = (torch.randn(batch, seq, n, d, device=device, dtype=torch.bfloat16).transpose(1, 2)
                for n in (h, kvh, kvh))

    def layer():
        for name, (_, k) in separate.items():
            F.linear(xs[k], ws[name])
        F.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=True)

    flops = 2 * m * sum(n * k for n, k in separate.values()) + 2 * batch * h * seq * seq * d
    r = sustained(layer, device, flops, seconds)
    tok = m / (layers * flops / (r["steady_tflops"] * 1e12))
    return {**r, "tokens": m, "forward_bound_tokens_per_s": round(tok, 1),
            "forward_bound_frac_of_sustained_ceiling": round(tok / sustained_ceiling, 4)}


def summary(sb: dict) -> str:
    f = sb["fused"]
    return (f"shape bound at {sb['tokens']} tokens/batch: GEMMs {sb['layer_gemm_s'] * 1e3:.3f} ms/layer "
            f"({sb['layer_gemm_tflops']:.4g} TFLOP/s; fused q/k/v, gate/up {f['layer_gemm_s'] * 1e3:.3f} ms), "
            f"attention {sb['layer_attention_s'] * 1e3:.3f} ms/layer ({sb['attention']['tflops']:.4g} TFLOP/s) -> "
            f"{sb['forward_bound_tokens_per_s']:.0f} tok/s = {sb['forward_bound_frac_of_ceiling']:.1%} of ceiling "
            f"(GEMMs alone {sb['gemm_only_frac_of_ceiling']:.1%}; fused {f['forward_bound_frac_of_ceiling']:.1%}, "
            f"alone {f['gemm_only_frac_of_ceiling']:.1%})")
