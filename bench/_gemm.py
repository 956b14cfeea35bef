"""Matmul timings for bench/extract.py: the square-GEMM ceiling, and a shape-aware bound (one decoder layer's
GEMMs and attention at the run's batch shape), so a forward below the ceiling can be split into "cuBLAS is
slower at the forward's shapes" and "the forward spends time outside GEMMs and attention"."""

from __future__ import annotations

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


def summary(sb: dict) -> str:
    f = sb["fused"]
    return (f"shape bound at {sb['tokens']} tokens/batch: GEMMs {sb['layer_gemm_s'] * 1e3:.3f} ms/layer "
            f"({sb['layer_gemm_tflops']:.4g} TFLOP/s; fused q/k/v, gate/up {f['layer_gemm_s'] * 1e3:.3f} ms), "
            f"attention {sb['layer_attention_s'] * 1e3:.3f} ms/layer ({sb['attention']['tflops']:.4g} TFLOP/s) -> "
            f"{sb['forward_bound_tokens_per_s']:.0f} tok/s = {sb['forward_bound_frac_of_ceiling']:.1%} of ceiling "
            f"(GEMMs alone {sb['gemm_only_frac_of_ceiling']:.1%}; fused {f['forward_bound_frac_of_ceiling']:.1%}, "
            f"alone {f['gemm_only_frac_of_ceiling']:.1%})")
