"""bench/extract.py runs end to end on CPU at tiny shapes and reports consistent numbers."""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "extract.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_extract", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_extract_tiny_cpu(tmp_path):
    mod = _load()
    out = tmp_path / "r.json"
    r = mod.main(["--tiny", "--tokens", "512", "--seq", "64", "--token-budget", "256", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(r))
    assert r["tokens"] == 512 and r["ceiling_tokens_per_s"] > 0 and r["forward_tokens_per_s"] > 0
    for dtype in ("bf16", "fp8"):
        s = r["stores"][dtype]
        # Disk cost = the formula plus the shard's header and small index tensors.
        assert s["formula_bytes_per_token"] <= s["disk_bytes_per_token"] < s["formula_bytes_per_token"] * 1.2
        assert s["tokens_per_s"] > 0
        assert s["loop_s"] > 0 and s["flush_s"] >= 0 and s["steady_tokens_per_s"] >= s["tokens_per_s"]
    assert r["stores"]["fp8"]["disk_bytes_per_token"] < 0.6 * r["stores"]["bf16"]["disk_bytes_per_token"]
    assert 0 < r["fp8_vs_bf16"]["max_rel_err"] < 0.06
    # eager path (no --compile on CPU): the store holds exactly the states a plain captured forward gives
    assert r["compiled"] is None and r["bf16_store_vs_eager_forward"]["bit_equal"] is True
    _check_shape_bound(r)
    _check_sustained(r)


def test_ceiling_only_matches_the_full_run(tmp_path):
    """--ceiling-only (no model, no store) counts the same FLOPs per token as the full run and reports the same
    bounds' fields."""
    mod = _load()
    args = ["--tiny", "--seq", "64", "--token-budget", "256"]
    full = mod.main([*args, "--tokens", "512", "--dtypes", "fp8", "--no-profile"])
    only = mod.main([*args, "--ceiling-only", "--out", str(tmp_path / "c.json")])
    assert only["flops_per_token"] == full["flops_per_token"]
    assert set(only["shape_bound"]) == set(full["shape_bound"]) and "stores" not in only
    _check_sustained({**only, "forward_tokens_per_s": 1.0, "forward_frac_of_sustained_ceiling":
                      1.0 / only["sustained_ceiling_tokens_per_s"], "stores": {}})


def _check_sustained(r):
    """The sustained ceiling comes from its own GEMM windows, and every fraction against it is its own division."""
    m = r["matmul_sustained"]
    assert m["windows"] >= 2 and m["min_window_tflops"] <= m["steady_tflops"]
    assert m["gpu"] is None          # no nvidia-smi samples on a CPU
    assert r["sustained_ceiling_tokens_per_s"] == pytest.approx(m["steady_tflops"] * 1e12 / r["flops_per_token"],
                                                                rel=1e-3)
    assert r["forward_frac_of_sustained_ceiling"] == pytest.approx(
        r["forward_tokens_per_s"] / r["sustained_ceiling_tokens_per_s"], rel=1e-3, abs=1e-4)
    lb = r["sustained_layer_bound"]
    assert lb["forward_bound_frac_of_sustained_ceiling"] == pytest.approx(
        lb["forward_bound_tokens_per_s"] / r["sustained_ceiling_tokens_per_s"], rel=1e-3, abs=1e-4)
    for s in r["stores"].values():
        assert s["frac_of_sustained_ceiling"] == pytest.approx(s["tokens_per_s"] / r["sustained_ceiling_tokens_per_s"],
                                                               rel=1e-3, abs=1e-4)


def _check_shape_bound(r):
    """The shape bound's parts are positive and its totals are computed from the reported parts."""
    sb, L = r["shape_bound"], r["shape"]["num_hidden_layers"]
    assert sb["tokens"] == sb["batch"] * sb["seq"] == 256 and sb["num_layers"] == L
    assert sb["layer_attention_s"] == sb["attention"]["s"] > 0
    # the timed projections are the layer's linears: their FLOPs + attention's are flops_per_token's
    size = lambda g: sum(e["out_features"] * e["in_features"] for e in g.values())  # noqa: E731
    assert 2 * L * size(sb["gemms"]) + 2 * r["shape"]["hidden_size"] * r["seq"] * L == r["flops_per_token"]
    assert size(sb["fused"]["gemms"]) == size(sb["gemms"])
    for b in (sb, sb["fused"]):
        assert all(e["s"] > 0 for e in b["gemms"].values())
        assert abs(b["layer_gemm_s"] - sum(e["s"] for e in b["gemms"].values())) < 1e-12
        tok = sb["tokens"] / (L * (b["layer_gemm_s"] + sb["layer_attention_s"]))
        assert abs(b["forward_bound_tokens_per_s"] - tok) <= 0.1
        # the JSON keeps 4 decimals of fractions that exceed 1 on a CPU (the tiny ceiling): compare relatively
        assert b["forward_bound_frac_of_ceiling"] == pytest.approx(tok / r["ceiling_tokens_per_s"], rel=1e-4, abs=1e-4)
        gemm_only = sb["tokens"] / (L * b["layer_gemm_s"]) / r["ceiling_tokens_per_s"]
        assert b["gemm_only_frac_of_ceiling"] == pytest.approx(gemm_only, rel=1e-4, abs=1e-4)
        assert b["gemm_only_frac_of_ceiling"] > b["forward_bound_frac_of_ceiling"] > 0


def test_shape_bound_projections_at_8b():
    """The GEMM shapes come from the config: Llama-3.1-8B's q/o 4096x4096, k/v 1024 (8 KV heads x 128),
    gate/up 14336, down 14336->4096; fused q/k/v 6144 and gate/up 28672 rows."""
    mod = _load()
    import _gemm  # bench/ is on sys.path once extract.py is loaded
    separate, fused = _gemm.projections(SimpleNamespace(**mod.LLAMA_8B))
    assert separate == {"q": (4096, 4096), "k": (1024, 4096), "v": (1024, 4096), "o": (4096, 4096),
                        "gate": (14336, 4096), "up": (14336, 4096), "down": (4096, 14336)}
    assert fused == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
