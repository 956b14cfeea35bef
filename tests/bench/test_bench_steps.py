"""bench/_steps.py: a step's process tree bounded in time, the state a re-run continues from."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.engines.test_base import alive

ROOT = Path(__file__).resolve().parents[2]


def test_a_step_past_its_time_is_killed_with_its_whole_tree_and_says_where_it_stood(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import _steps

    # a command whose engine worker runs in a session of its own (as eyas starts them) and never ends
    code = ("import subprocess, sys, time\n"
            "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'], start_new_session=True)\n"
            f"open({str(tmp_path / 'worker.pid')!r}, 'w').write(str(w.pid))\n"
            "print('loading the toy into the engine', flush=True)\n"
            "time.sleep(3600)\n")
    (tmp_path / "engine.log").write_text("INFO compiling\nINFO still compiling\n")
    t0 = time.monotonic()
    with pytest.raises(_steps.StepError, match="no end after 3 s") as err:
        _steps.run_logged([sys.executable, "-c", code], tmp_path / "step.log", 3, dict(os.environ), "regen-vllm",
                            engine_logs=[tmp_path / "engine.log"])
    assert time.monotonic() - t0 < 20
    assert "loading the toy into the engine" in str(err.value) and "still compiling" in str(err.value)
    worker = int((tmp_path / "worker.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(worker)


def test_a_second_call_continues_from_the_saved_state_and_redo_forgets_it(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import _steps

    ran = []

    def action(unit, step):
        ran.append((unit, step))
        if step == "b" and len(ran) == 2:   # only the first time
            raise RuntimeError("b broke")
        return {"ok": step}

    needs, todo = {"a": (), "b": ("a",), "c": ("b",)}, [("u", "a"), ("u", "b"), ("u", "c")]
    state, save = _steps.load_state(tmp_path / "state.json")
    assert _steps.run_steps(todo, needs, action, state, save, workers=2) == [("u", "b"), ("u", "c")]
    saved = json.loads((tmp_path / "state.json").read_text())["u"]
    assert "b broke" in saved["b"]["error"] and saved["a"]["ok"] == "a"
    assert all(saved[s]["wall_s"] >= 0 and saved[s]["started_s"] >= 0 for s in ("a", "b"))
    state, save = _steps.load_state(tmp_path / "state.json")
    left = [(u, s) for u, s in todo if "error" in state.get(u, {}).get(s, {"error": "not run"})]
    assert _steps.run_steps(left, needs, action, state, save, workers=2) == []
    assert ran == [("u", "a"), ("u", "b"), ("u", "b"), ("u", "c")]
    assert _steps.load_state(tmp_path / "state.json", redo=True)[0] == {}


def test_tails_name_the_root_cause_far_above_the_last_lines(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import _steps

    log = tmp_path / "engine.log"
    log.write_text("INFO start\n(Worker pid=1) ERROR [x.py:1] ValueError: No common block size for 16\n"
                   + "ERROR [x.py:1] ValueError: No common block size for 16\n" + "traceback line\n" * 40
                   + "RuntimeError: Engine core initialization failed. See root cause above.\n")
    text = _steps.tails(log, tmp_path / "absent.log", lines=2)
    head = text.splitlines()[0]
    assert head.count("No common block size") == 1 and "RuntimeError: Engine core" in head
    assert text.splitlines()[1:] == ["traceback line", "RuntimeError: Engine core initialization failed. See root "
                                     "cause above."]
