import json
from pathlib import Path

from eyas.target.fastload import safetensors_files

ROOT = Path(__file__).resolve().parents[2]


def test_bench_load_tiny_runs_on_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import load as bench_load

    out, d = tmp_path / "l.json", tmp_path / "ckpt"
    res = bench_load.main(["--tiny", "--dir", str(d), "--drop", "fadvise", "--keep", "--out", str(out)])
    assert json.loads(out.read_text()) == res
    assert res["shards"] == len(safetensors_files(d)) > 1 and res["all_params_on_device"]
    assert res["fast_cold_s"] > 0 and res["fast_warm_s"] > 0 and res["from_pretrained_warm_s"] > 0
    assert res["cache_drop"].startswith("posix_fadvise")
