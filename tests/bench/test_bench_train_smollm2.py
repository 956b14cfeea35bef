"""bench/train_smollm2.sh at CPU smoke sizes, split over two invocations with STAGES the way the GPU
runs split it over calls: the first without OUT_JSON (its default once killed the script under set -e),
the second training the fp8 run and writing the summary with both curves and delta tau."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[2] / "bench" / "train_smollm2.sh"


def _run(work: Path, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("OUT_JSON", "SMOKE")}
    # The smoke sizes spelled out instead of SMOKE=1, so the full-size defaults' code path runs.
    e.update(N="24", NEW_TOKENS="8", GEN_BATCH="8", MAXLEN="256", VOCAB="2048", TTT="2", EPOCHS="1", BATCH="2",
             EVAL_EVERY="2", DEVICE="cpu", PYTHON=sys.executable, **env)
    return subprocess.run(["bash", str(SCRIPT), str(work)], env=e, capture_output=True, text=True, timeout=900)


def test_train_smollm2_split_stages(tmp_path):
    work = tmp_path / "w"
    first = _run(work, STAGES="regenerate prepare extract_bf16 extract_fp8 train_bf16", TRAIN_ARGS="--no-init-head")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "summary skipped" in first.stderr
    assert (work / "run-bf16" / "metrics.jsonl").is_file() and not (work / "run-fp8").exists()

    out = tmp_path / "summary.json"
    second = _run(work, STAGES="train_fp8", TRAIN_ARGS="--no-init-head", OUT_JSON=str(out))
    assert second.returncode == 0, second.stderr[-2000:]
    doc = json.loads(out.read_text())
    # Timings accumulate over both calls: every stage is in the summary once.
    assert set(doc["stages"]) == {"regenerate", "prepare", "extract_bf16", "extract_fp8", "train_bf16", "train_fp8"}
    for dt in ("bf16", "fp8"):
        assert doc[dt]["curve"] and 1.0 <= doc[dt]["best_tau"] <= 3.0  # chain of TTT 2 in the smoke size
    d = doc["delta_tau_bf16_minus_fp8"]
    assert d["best"] == pytest.approx(doc["bf16"]["best_tau"] - doc["fp8"]["best_tau"])
    # The flag reached `eyas train`: the run's saved config says no head init.
    cfg = (work / "run-fp8" / "train_config.yaml").read_text()
    assert "init_head: false" in cfg
