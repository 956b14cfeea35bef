import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_train_online_tiny_runs_the_real_trainer(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import train_online as bench

    out = tmp_path / "t.json"
    res = bench.main(["--tiny", "--steps", "1", "--warmup", "0", "--variants", "before,edraft,base", "--profile",
                      "--top", "3", "--out", str(out)])
    assert json.loads(out.read_text()) == res
    assert [(r["variant"], r["batch"]) for r in res["runs"]] == [("before", 2), ("edraft", 2), ("base", 2)]
    for r in res["runs"]:
        assert r["tokens_per_step"] == 2 * 128 and r["tokens_per_s"] > 0
        assert set(r["phase_ms"]) == {"rows", "target", "head", "forward", "backward", "optimizer"}
        assert all(v >= 0 for v in r["phase_ms"].values()) and r["phase_ms"]["forward"] > 0
        assert 0 < len(r["profile"]["host"]) <= 3 and r["profile"]["host"][0]["ms_per_step"] > 0
        assert "device" not in r["profile"]      # CPU run: the host table only
    sys.modules.pop("train_online", None)


def test_synthetic_rows_pack_documents():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import train_online as bench
        rows = bench.Rows(3, 300, vocab=64, draft_vocab=32)
    finally:
        sys.path.remove(str(ROOT / "bench"))
        sys.modules.pop("train_online", None)
    for r in rows:
        pos = r["position_ids"]
        assert r["input_ids"].shape == r["loss_mask"].shape == pos.shape == (300,)
        starts = (pos == 0).nonzero().flatten().tolist()
        assert starts[0] == 0 and len(starts) >= 1
        # each document's second half is in the loss
        bounds = starts + [300]
        for a, b in zip(bounds[:-1], bounds[1:]):
            assert not r["loss_mask"][a:a + (b - a) // 2].any() and r["loss_mask"][a + (b - a) // 2:b].all()
    d2t, t2d = rows.vocab()
    assert d2t.numel() == 32 and int(t2d.sum()) == 32
