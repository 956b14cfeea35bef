"""bench/entry_points.py: the written account of every engine entry point, judged per recorded release."""

import importlib.util
import json
from pathlib import Path

from eyas.engines.adapters import ADAPTERS
from eyas.engines.entry_points import applicable

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_entry_points", ROOT / "bench/entry_points.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
ACCOUNT = ROOT / "bench/results/engine-entry-points"


def test_account_judges_every_entry_point_of_every_release(tmp_path):
    doc = bench.main(["--out", str(tmp_path / "a.json"), "--markdown", str(tmp_path / "a.md")])
    vllm = next(a for a in doc["engines"] if a["engine"] == "vllm")
    assert {r["name"] for r in vllm["entry_points"]} == {ep.name for ep in ADAPTERS["vllm"].entry_points}
    for v in vllm["tested"]:
        assert vllm["summary"][v]["failing"] == 0 and vllm["summary"][v]["drafter_rules"] == []
    assert vllm["summary"]["0.20.0"]["drafter_rules"] and "0.10.1" in vllm["releases"]
    md = (tmp_path / "a.md").read_text()
    assert "needs 0.26.0 or newer, this is 0.20.0" in md and "**drift**" in md


def test_committed_account_is_complete():
    """The account in the repository names every entry point each adapter has now (rerun the bench when one is
    added), and its verdicts are today's."""
    md = (ACCOUNT / "ENTRY_POINTS.md").read_text()
    doc = json.loads((ACCOUNT / "entry_points.json").read_text())
    for name, adapter in ADAPTERS.items():
        for ep in applicable(adapter.entry_points, bench.WRAPPED, bench.DRAFTERS):
            assert f"`{bench._short(ep.name)}`" in md, f"{ep.name}: rerun bench/entry_points.py"
        fresh = bench.account(name)
        committed = next(a for a in doc["engines"] if a["engine"] == name)
        assert committed["summary"] == fresh["summary"], f"{name}: rerun bench/entry_points.py"
