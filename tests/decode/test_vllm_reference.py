"""The table of vLLM's measured speeds: its key, lookup, the speedups read from it, and the rows built from a sweep."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import LlamaConfig, Qwen2Config

from eyas.decode import vllm_reference as vr

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "bench" / "results" / "gpu-h200-2026-12-02e" / "vllm_speedup.json"
Q15 = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
           intermediate_size=8960, vocab_size=151936, tie_word_embeddings=False)


def smollm2_config():
    return LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)


def test_arch_key_is_the_shapes():
    assert vr.arch_key(smollm2_config()) == "llama:L30:H576:I1536:A9:KV3:V49152:tied"
    q = Qwen2Config(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                    intermediate_size=8960, vocab_size=151936, tie_word_embeddings=False)
    assert vr.arch_key(q) == "qwen2:L28:H1536:I8960:A12:KV2:V151936:untied"


def test_shipped_table_finds_smollm2_on_the_h200():
    row = vr.lookup(smollm2_config(), "NVIDIA H200", "torch.bfloat16", batch=1)
    assert row["ar_tokens_per_s"] == 636.8 and row["vllm"] == "0.26.0"
    assert vr.lookup(smollm2_config(), "NVIDIA H200", "bfloat16", batch=8)["ar_tokens_per_s"] == 2869.5
    for miss in [("NVIDIA A100", "bfloat16", 1), ("NVIDIA H200", "float32", 1), ("NVIDIA H200", "bfloat16", 2),
                 (None, "bfloat16", 1)]:
        assert vr.lookup(smollm2_config(), *miss[:2], batch=miss[2]) is None
    other = smollm2_config()
    other.num_hidden_layers = 31
    assert vr.lookup(other, "NVIDIA H200", "bfloat16") is None


@pytest.mark.parametrize("sweep, model, gpu", [
    (SWEEP, "smollm2-135m", "NVIDIA H200"),
    (REPO / "bench/results/gpu-h100-2026-12-05h/speedup_vllm_q15.json", "qwen2.5-coder-1.5b", "NVIDIA H100 80GB HBM3")])
def test_shipped_rows_are_their_sweep(sweep, model, gpu):
    """The sweep rows are what rows_from_sweep makes of the recorded sweep they cite (batch 1, 8 and 32)."""
    config = smollm2_config() if model.startswith("smol") else Qwen2Config(**Q15)
    made = vr.rows_from_sweep(json.loads(sweep.read_text()), model=model, arch=vr.arch_key(config), gpu=gpu,
                              source=str(sweep.relative_to(REPO)))
    assert [r["batch"] for r in made] == [1, 8, 32] and all(r["spec"] for r in made)
    assert made == [r for r in vr.read_table() if r["model"] == model and r["gpu"] == gpu]


def test_speedups_read_from_a_row():
    row = vr.lookup(smollm2_config(), "NVIDIA H200", "bfloat16")
    assert vr.versus(955.2, row) == pytest.approx(1.5)
    assert vr.versus(955.2, None) is None
    e = vr.expected_in_vllm(row, 3, 3.0)
    cost = 2.2871 * 636.8 / 855.3          # a K=3 step of vLLM in plain steps, as measured
    assert e["step_cost"] == pytest.approx(cost, abs=1e-3) and e["speedup"] == pytest.approx(3.0 / cost, abs=1e-3)
    assert vr.expected_in_vllm(row, 7, 3.0) is None and vr.expected_in_vllm(None, 3, 3.0) is None
    line = vr.expectation_line(e, "smollm2-135m")
    assert line.startswith("≈ 1.76× over vLLM 0.26.0 AR (637 tok/s) at batch 1 on NVIDIA H200: chain-3 τ 3.00")
    assert "no vLLM figures for qwen2.5-coder-1.5b" in vr.expectation_line(None, "qwen2.5-coder-1.5b")


def test_merge_replaces_same_key_and_last_row_wins(tmp_path):
    table = tmp_path / "t.json"
    shutil.copy(vr.TABLE, table)
    row = dict(vr.read_table(table)[0], ar_tokens_per_s=700.0, source="again")
    n = vr.merge_rows(table, [row])
    assert n == len(vr.read_table()) and vr.lookup(smollm2_config(), "NVIDIA H200", "bfloat16",
                                                    table=table)["ar_tokens_per_s"] == 700.0
    newer = dict(row, vllm="0.27.0", ar_tokens_per_s=750.0)
    vr.merge_rows(table, [newer])
    assert vr.lookup(smollm2_config(), "NVIDIA H200", "bfloat16", table=table)["ar_tokens_per_s"] == 750.0


def test_malformed_table_is_named(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"rows": [{"arch": "x", "gpu": "g"}]}))
    with pytest.raises(ValueError, match=r"t.json: row 0 lacks dtype, batch, ar_tokens_per_s"):
        vr.read_table(bad)
    bad.write_text("{")
    with pytest.raises(ValueError, match=r"t.json: not a vLLM reference table"):
        vr.read_table(bad)


@pytest.mark.parametrize("run, model, gpu", [
    ("gpu-h200-2026-12-05d/ar_pace_q15.json", "qwen2.5-coder-1.5b", "NVIDIA H200"),
    ("gpu-h100-2026-12-05e/ar_pace_smol.json", "smollm2-135m", "NVIDIA H100 80GB HBM3")])
def test_ar_pace_rows_are_their_runs(run, model, gpu):
    """Each ar_pace row of the table is what rows_from_ar_pace makes of the recorded run it cites (its GPU too)."""
    pace_path = REPO / "bench" / "results" / run
    config = Qwen2Config(**Q15) if model.startswith("qwen") else smollm2_config()
    made = vr.rows_from_ar_pace(json.loads(pace_path.read_text()), model=model, arch=vr.arch_key(config),
                                source=str(pace_path.relative_to(REPO)))
    assert made and made[0]["gpu"] == gpu
    assert made == [r for r in vr.read_table() if r["model"] == model and r["gpu"] == gpu]


def test_the_1p5b_row_is_its_ar_pace_run():
    """The 1.5B's H200 row gives "vs vLLM AR" but no expectation (no chain measured); a run whose vLLM half did
    not happen makes none."""
    pace = json.loads((REPO / "bench" / "results" / "gpu-h200-2026-12-05d" / "ar_pace_q15.json").read_text())
    q = Qwen2Config(**Q15)
    row = vr.lookup(q, "NVIDIA H200", "bfloat16", batch=1)
    assert row["ar_tokens_per_s"] == 360.5 and row["vllm"] == "0.26.0" and row["spec"] == {}
    assert vr.expected_in_vllm(row, 3, 3.0) is None   # no chain measured yet: no expectation, only "vs vLLM AR"
    assert vr.versus(400.0, row) == pytest.approx(400.0 / 360.5)
    assert vr.rows_from_ar_pace({k: v for k, v in pace.items() if k != "vllm"}, model="m", arch="a") == []


def test_a_sweep_names_its_engine_version():
    sweep = {"base_tok_s": {"1": 100.0}, "rows": [], "engine": "vllm", "engine_version": "0.26.0"}
    assert vr.rows_from_sweep(sweep, model="m", arch="a", gpu="g")[0]["vllm"] == "0.26.0"
