"""The whole fault-injection harness (bench/faults.py): >= 20 kills each of extract, train (inside
save_checkpoint too) and regenerate, damage at rest, 20 server modes, and the output families (collisions,
resume with other settings, concurrent writers, non-finite training). Minutes of CPU: -m slow."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow
def test_fault_harness_nothing_wrong_lost_or_manual(tmp_path):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("faults", BENCH / "faults.py")
    faults = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(faults)
    res = faults.main(["--kills", "20", "--out", str(tmp_path / "faults.json")])
    for fam in ("extract", "train", "regenerate"):
        assert res["table"][fam]["injected"] >= 20
    assert res["table"]["server"]["injected"] >= 15
    for fam in ("collisions", "resume", "concurrent", "non-finite"):
        assert res["table"][fam]["injected"] >= 8
    for fam, row in res["table"].items():
        assert (row["wrong"], row["lost"], row["manual"], row["traceback"]) == (0, 0, 0, 0), (fam, res["notes"])
