import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_train_tiny_runs_on_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import train as bench_train

    out = tmp_path / "t.json"
    res = bench_train.main(["--tiny", "--steps", "1", "--warmup", "0", "--variants", "plain,fused",
                            "--batch", "2", "--long-seq", "96", "--out", str(out)])
    assert json.loads(out.read_text()) == res
    assert [r["variant"] for r in res["variants"]] == ["plain", "fused"]
    assert [(r["variant"], r["seq"], r["rows"]) for r in res["variants"]] == [("plain", 64, 2), ("fused", 64, 2)]
    # the long-sequence check is one row whatever --batch is (8 rows of 16k ran out of memory on the H200)
    assert [(r["variant"], r["seq"], r["rows"]) for r in res["long_seq"]] == [("plain", 96, 1), ("fused", 96, 1)]
    assert res["profile"]["variant"] == "fused" and res["profile"]["top_ops"][0]["ms_per_step"] > 0
    assert res["tokens_per_s"] > 0 and res["ttt_steps"] == 3 and res["attention"] == "dense"
    assert res["draft_tflops_per_step"] >= 0 and res["draft_params_trainable"] > 0
    masks = res["mask_build_ms_per_step"]
    assert masks["create_block_mask"] > 0 and masks["direct"] > 0 and masks["reps"] == 3
    sys.modules.pop("train", None)


def test_flops_count_scales_with_steps():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import train as bench_train
        from types import SimpleNamespace
        from eyas.draft.model import draft_config_from_target
        cfg = draft_config_from_target(SimpleNamespace(**bench_train.LLAMA_8B), aux_layer_ids=[2, 16, 29],
                                       draft_vocab_size=32000)
        one = bench_train.draft_flops_per_token(cfg, 2048, 1, 1.0)
        seven = bench_train.draft_flops_per_token(cfg, 2048, 7, 1.0)
        assert 6 < seven / one < 7.5
        # ~ 6 x (trainable matmul params) per token per step, within attention's share
        assert one == pytest.approx(6 * (3 * 4096 * 4096 + 2 * 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336
                                         + 4096 * 32000) + 3 * 4 * 4096 * 1024, rel=1e-6)
    finally:
        sys.path.remove(str(ROOT / "bench"))
        sys.modules.pop("train", None)
