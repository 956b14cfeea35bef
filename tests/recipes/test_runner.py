"""The recipe runner with a plan of listed steps and a stand-in eyas: a SIGKILL mid-step and a budget that ends
mid-step are both continued by the same call; finished steps never run twice; another recipe in the same OUT is
refused naming the key, or started over with fresh."""

import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from eyas.recipes import DONE, LEFT, load_recipe, run_recipe
from eyas.recipes import runner as R

FAKE = Path(__file__).resolve().parent / "fake_eyas.py"


@pytest.fixture(autouse=True)
def fake_eyas(monkeypatch):
    monkeypatch.setattr(R, "eyas_command", lambda: [sys.executable, str(FAKE)])


def recipe_file(tmp_path, b="b --out {out}/b.txt --hang", params=None):
    doc = {"description": "three steps", "plan": "steps", "params": params or {"size": 3},
           "steps": [{"name": "a", "run": "a --out {out}/a.txt --size {size}", "need": 0},
                     {"name": "b", "run": b, "resume": "--resume", "need": 1},
                     {"name": "c", "run": "c --out {out}/c.txt", "need": 0}]}
    path = tmp_path / "three.yaml"
    path.write_text(json.dumps(doc))   # JSON is YAML
    return path


def calls(out: Path) -> list[str]:
    return (out / "calls.log").read_text().splitlines()


def _run_killable(path, out):
    os.setsid()   # its own process group: the test kills it together with the step it is running
    run_recipe(load_recipe(path), out)


def test_a_sigkill_mid_step_is_continued_by_the_same_command(tmp_path, capsys):
    path, out = recipe_file(tmp_path), tmp_path / "out"
    proc = multiprocessing.get_context("fork").Process(target=_run_killable, args=(path, out))
    proc.start()
    deadline = time.time() + 60
    while not (out / "hanging").exists():
        assert time.time() < deadline and proc.is_alive(), "step b never started"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)   # the runner and its step, mid-step
    proc.join()
    state = json.loads((out / "state.json").read_text())
    assert list(state["done"]) == ["a"] and state["started"] == ["a", "b"]

    code, result = run_recipe(load_recipe(path), out)
    assert code == DONE and result["left"] == [] and "all steps done" in capsys.readouterr().out
    assert calls(out) == ["a --out {0}/a.txt --size 3".format(out), f"b --out {out}/b.txt --hang",
                          f"b --out {out}/b.txt --hang --resume", f"c --out {out}/c.txt"]
    state = json.loads((out / "state.json").read_text())
    assert [c["ran"] for c in state["calls"]] == [["b", "c"]]   # the killed call recorded nothing of its own
    code, _ = run_recipe(load_recipe(path), out)   # done: a third call runs nothing
    assert code == DONE and len(calls(out)) == 4


def test_a_budget_ending_mid_step_stops_cleanly_and_the_next_call_resumes(tmp_path, capsys):
    path, out = recipe_file(tmp_path, b="b --out {out}/b.txt --sleep 30"), tmp_path / "out"
    t = time.perf_counter()
    code, result = run_recipe(load_recipe(path), out, budget_s=2)
    assert time.perf_counter() - t < 20   # the step was stopped at the budget, not waited for
    text = capsys.readouterr().out
    assert code == LEFT and result["left"] == ["b", "c"]
    assert "-- b: budget reached; the next call resumes it" in text and "to do: b, c" in text
    state = json.loads((out / "state.json").read_text())
    assert list(state["done"]) == ["a"] and state["seconds"]["b"] >= 1   # the cut step's time is counted

    code, _ = run_recipe(load_recipe(path, ["size=3"]), out, budget_s=0.5)   # too short for any step
    assert code == LEFT and "no step fits" in capsys.readouterr().out and len(calls(out)) == 2

    code, result = run_recipe(load_recipe(path), out)   # no budget: b resumes, c runs
    assert code == DONE and calls(out)[2:] == [f"b --out {out}/b.txt --sleep 30 --resume", f"c --out {out}/c.txt"]


def test_another_recipe_in_the_same_out_is_refused_naming_the_key_unless_fresh(tmp_path):
    path, out = recipe_file(tmp_path, b="b --out {out}/b.txt"), tmp_path / "out"
    assert run_recipe(load_recipe(path), out)[0] == DONE
    with pytest.raises(ValueError, match=r"another recipe: size=3 there, 4 now; .* --fresh"):
        run_recipe(load_recipe(path, ["size=4"]), out)
    assert len(calls(out)) == 3
    code, _ = run_recipe(load_recipe(path, ["size=4"]), out, fresh=True)
    assert code == DONE and calls(out)[3:] == [f"a --out {out}/a.txt --size 4", f"b --out {out}/b.txt",
                                               f"c --out {out}/c.txt"]


def test_a_failing_step_stops_the_call_and_keeps_what_finished(tmp_path):
    path, out = recipe_file(tmp_path, b="b --out {out}/b.txt --fail"), tmp_path / "out"
    with pytest.raises(ValueError, match=r"step b failed \(exit 5\)"):
        run_recipe(load_recipe(path), out)
    assert list(json.loads((out / "state.json").read_text())["done"]) == ["a"]


def test_background_steps_are_reaped_and_in_process_results_kept(tmp_path):
    r = R.Runner(tmp_path / "out")
    assert r.background("bg", "x", "--out", str(tmp_path / "out" / "x.txt"), "--sleep", "0.3")
    got = []
    assert r.call("inline", lambda: got.append(1) or {"path": tmp_path, "n": 2}) == (True, {"path": str(tmp_path), "n": 2})
    r.reap(wait=True)
    assert r.done("bg") and (tmp_path / "out" / "bg.log").is_file()
    assert r.finish([]) == DONE
    r2 = R.Runner(tmp_path / "out")   # the next call: the in-process step is not run again, its result is kept
    with pytest.raises(ValueError, match="another `eyas run` is working in it"):
        R.Runner(tmp_path / "out")    # while r2 holds OUT
    assert r2.call("inline", lambda: pytest.fail("ran twice")) == (True, {"path": str(tmp_path), "n": 2})
