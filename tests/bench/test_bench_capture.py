"""bench/capture.py runs at tiny shapes on CPU and reports what BENCHMARKS.md records."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "capture.py"


def test_capture_bench_tiny_cpu(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_capture", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "r.json"
    result = bench.main(["--tiny", "--device", "cpu", "--reps", "3", "--warmup", "1", "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(capsys.readouterr().out) == result
    assert result["tokens_per_batch"] == 2 * 128 and result["aux_layer_ids"] == [2, 4, 5]
    assert len(result["plain_s"]) == len(result["capture_s"]) == 3
    assert result["plain_tokens_per_s"] > 0 and result["capture_tokens_per_s"] > 0
    assert result["overhead_pct"] == 100 * (result["capture_median_s"] / result["plain_median_s"] - 1)
    assert result["captured_bytes_per_batch"] == 2 * 128 * (3 + 1) * 64 * 4  # fp32 aux [B,T,3,H] + last
    assert result["device"] and result["dtype"] == "float32"


def test_random_llama_is_built_without_meta_leftovers():
    spec = importlib.util.spec_from_file_location("bench_capture", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model = bench.random_llama(bench.SHAPES["tiny"], torch.device("cpu"), torch.float32, "sdpa")
    assert not any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    fresh = LlamaRotaryEmbedding(LlamaConfig(**bench.SHAPES["tiny"]))
    assert torch.equal(model.model.rotary_emb.inv_freq, fresh.inv_freq)  # rebuilt, not left uninitialised
