"""bench/scaling.py --merge: the scaling curve built over several GPU sessions, a few points each."""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scaling.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_scaling", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RECIPE = {"ttt": 7, "epochs": 2.0, "lr": 3e-4, "batch": 8, "vocab": 32000, "max_length": 2048}


def earlier(tmp_path, **recipe):
    prev = tmp_path / "prev.json"
    prev.write_text(json.dumps({"target": "T", "recipe": {**RECIPE, **recipe}, "points": [
        {"kind": "raw", "size": 1000, "tokens": 1010, "tau": 1.5},
        {"kind": "regen", "size": 1000, "tokens": 990, "tau": 1.7}]}))
    return prev


def test_merged_points_are_kept_and_not_recomputed(tmp_path, monkeypatch):
    mod = load()
    ran = []
    monkeypatch.setattr(mod.Runner, "eyas", lambda self, name, *a: ran.append(name) or False)
    out = tmp_path / "scaling.json"
    mod.main(["--target", "T", "--kinds", "raw", "--sizes", "1000", "--work", str(tmp_path / "w"), "--device", "cpu",
              "--merge", str(earlier(tmp_path)), "--out", str(out)])
    doc = json.loads(out.read_text())
    assert ran == []                                   # nothing left to compute
    assert doc["complete"] and sorted(p["kind"] for p in doc["points"]) == ["raw", "regen"]  # all merged points
    assert (tmp_path / "scaling.png").stat().st_size > 1000

    ran.clear()   # a size the earlier run lacks is computed (here: its first stage is attempted)
    mod.main(["--target", "T", "--kinds", "raw", "--sizes", "1000,2000", "--work", str(tmp_path / "w"),
              "--device", "cpu", "--merge", str(earlier(tmp_path)), "--out", str(out)])
    assert ran and not json.loads(out.read_text())["complete"]


def test_merge_refuses_another_recipe(tmp_path):
    mod = load()
    with pytest.raises(SystemExit, match="another recipe"):
        mod.main(["--target", "T", "--kinds", "raw", "--sizes", "1000", "--work", str(tmp_path / "w"),
                  "--device", "cpu", "--merge", str(earlier(tmp_path, ttt=3)), "--out", str(tmp_path / "o.json")])


def test_merge_of_two_sessions_keeps_the_first_of_a_repeated_point(tmp_path):
    mod = load()
    a = earlier(tmp_path)
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"target": "T", "recipe": RECIPE, "points": [
        {"kind": "raw", "size": 1000, "tau": 9.9}, {"kind": "self", "size": 3000, "tau": 1.8}]}))
    args = SimpleNamespace(target="T", **RECIPE)
    pts = {(p["kind"], p["size"]): p["tau"] for p in mod.merged_points([a, b], args)}
    assert pts == {("raw", 1000): 1.5, ("regen", 1000): 1.7, ("self", 3000): 1.8}
