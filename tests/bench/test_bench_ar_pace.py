"""bench/ar_pace.py on the CPU with a tiny target: eyas's AR rate, its prefill timings and the profiles of one
prefill (where its milliseconds go) and of 64 decoded tokens land in the JSON."""

from __future__ import annotations

import json

from tests.target.fixtures import write_hf_dir

from tests.scripts import load_script


def test_ar_pace_reports_the_rate_and_a_prefill_profile(tmp_path):
    bench = load_script("bench/ar_pace.py")
    target = write_hf_dir(tmp_path / "t")
    out = tmp_path / "ar.json"
    assert bench.main(["--target", str(target), "--device", "cpu", "--per-category", "1", "--max-new-tokens", "4",
                       "--prefill-tokens", "32", "--no-compile", "--out", str(out)]) == 0
    eyas = json.loads(out.read_text())["eyas"]
    assert eyas["tok_s"] > 0 and eyas["generated_tokens"] > 0
    prof = eyas["prefill_ms"]["profile"]
    assert prof["wall_ms"] > 0 and prof["ops"] > 0 and prof["device_ms"] == 0 and prof["by_device"] == []
    ops = {r["op"] for r in prof["by_host"]}
    assert "aten::mm" in ops and "aten::bmm" not in ops
    dec = eyas["decode_profile"]   # 64 tokens decoded under the profiler (no device on the CPU: no kernels)
    assert dec["tokens"] == 64 and dec["wall_ms"] > 0 and dec["ops"] > prof["ops"] and dec["kernels"] == 0
    assert dec["kernels_per_token"] == 0 and dec["device_ms_per_token"] == 0
