"""bench/extract.py runs end to end on CPU at tiny shapes and reports consistent numbers."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "extract.py"


def test_bench_extract_tiny_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_extract", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
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
