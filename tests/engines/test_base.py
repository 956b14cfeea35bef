"""eyas.engines.base.run_in_env: a worker in an engine's environment, its output in the log as it is written, and
on a timeout the worker and everything it started stopped, the log's last lines in the error."""

import os
import sys
import time

import pytest

from eyas.engines.base import EngineError, run_in_env

# A worker that starts a child (as an engine starts its core process), says so, and never finishes.
STUCK = """
import json, os, sys, time
if os.fork() == 0:
    open(json.load(open(sys.argv[1]))["pid_file"], "w").write(str(os.getpid()))
    time.sleep(3600)
print("loading the engine", flush=True)
time.sleep(3600)
"""

DONE = """
import json, sys
print("engine says hello")
json.dump({"ok": True, "payload": json.load(open(sys.argv[1]))}, open(sys.argv[2], "w"))
"""


def alive(pid: int) -> bool:
    """The process runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_a_worker_past_its_timeout_is_stopped_with_its_children(tmp_path):
    worker = tmp_path / "stuck.py"
    worker.write_text(STUCK)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="did not finish within 3s") as err:
        run_in_env(sys.executable, worker, {"pid_file": str(tmp_path / "child.pid")}, timeout=3,
                   log=tmp_path / "engine.log")
    assert time.monotonic() - t0 < 20
    assert "loading the engine" in str(err.value) and str(tmp_path / "engine.log") in str(err.value)
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)


# A worker whose start-up hangs in two processes (its own and its engine core's) while a JIT build runs below it.
HUNG = """
import json, os, subprocess, sys, time
cfg = json.load(open(sys.argv[1]))
def engine_core_init():
    time.sleep(3600)
def load_weights():
    subprocess.Popen([cfg["ninja"], "3600"])
    if os.fork() == 0:
        engine_core_init()
    print("loading the engine", flush=True)
    time.sleep(3600)
load_weights()
"""


def test_a_hung_worker_leaves_its_processes_and_stacks_in_the_log(tmp_path):
    """Past its bound, the log names every process of the worker's session and each Python process's stack
    (faulthandler on SIGABRT), and the error names a compiler build among them: where a start-up stood."""
    worker, ninja = tmp_path / "hung.py", tmp_path / "ninja"
    worker.write_text(HUNG)
    ninja.symlink_to("/bin/sleep")
    log = tmp_path / "engine.log"
    with pytest.raises(EngineError, match=r"did not finish within 3s; 3 process\(es\) in its session, building: "
                                          r"ninja, their stacks in the log") as err:
        run_in_env(sys.executable, worker, {"ninja": str(ninja)}, timeout=3, log=log)
    text = log.read_text()
    assert "[eyas] the worker outlived its bound" in text and f"{ninja} 3600" in text
    assert "in engine_core_init" in text and "in load_weights" in text   # both Python processes' stacks
    assert "load_weights" in str(err.value)                                 # the log's tail is in the error


def test_a_worker_that_finishes_returns_its_json_and_logs(tmp_path):
    worker = tmp_path / "done.py"
    worker.write_text(DONE)
    assert run_in_env(sys.executable, worker, {"x": 1}, timeout=60, log=tmp_path / "w.log") == \
        {"ok": True, "payload": {"x": 1}}
    assert "engine says hello" in (tmp_path / "w.log").read_text()


def test_release_numbers_and_drafter_rules():
    from eyas.engines.entry_points import drafter_problems, release
    assert release("0.32.0+cpu") == (0, 32, 0) and release("0.26.0rc1") == (0, 26, 0) and release("1.2") == (1, 2)
    since = {"dflash": ("0.26.0", "layers mean other things")}
    assert drafter_problems("0.20.0", ["dflash"], since) == [
        "dflash: needs 0.26.0 or newer, this is 0.20.0: layers mean other things"]
    assert drafter_problems("0.26.0rc1", ["dflash"], since) == []     # the release candidate counts as 0.26
    assert drafter_problems("0.20.0", ["eagle3"], since) == drafter_problems(None, ["dflash"], since) == []
