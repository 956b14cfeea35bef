"""lab/lanes.sh: a lane runs detached with its log and exit status; `stop` kills it and all below it (processes in
sessions of their own too), and `start` then runs it afresh."""

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A lane whose job starts a child in a session of its own (as eyas's engine workers are), both sleeping.
JOB = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
print("working", flush=True)
time.sleep(300)
"""


def lanes(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "LANES_DIR": str(tmp_path / "lanes"), "RES": str(tmp_path / "res")}
    env.pop("OUT", None)
    r = subprocess.run(["bash", str(ROOT / "lab" / "lanes.sh"), *args], cwd=tmp_path, capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def wait_for(cond, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.1)
    return cond()


def test_stop_kills_a_lane_with_its_detached_children_and_start_runs_it_again(tmp_path):
    job, child_pid = tmp_path / "job.py", tmp_path / "child.pid"
    job.write_text(JOB)
    assert "lane work started" in lanes(tmp_path, "start", "work", "python3", str(job), str(child_pid))
    assert wait_for(lambda: child_pid.is_file() and child_pid.read_text())
    child = int(child_pid.read_text())
    assert "lane work: running" in lanes(tmp_path, "start", "work", "python3", str(job), str(child_pid))
    assert "lane work stopped (its log kept as work.log.1" in lanes(tmp_path, "stop", "work")
    assert wait_for(lambda: not alive(child))
    d = tmp_path / "lanes"
    assert not (d / "work.pid").exists() and not (d / "work.rc").exists()
    assert "working" in (d / "work.log.1").read_text()
    assert "nothing to stop" in lanes(tmp_path, "stop", "work")
    child_pid.unlink()
    assert "lane work started" in lanes(tmp_path, "start", "work", "python3", str(job), str(child_pid))
    assert wait_for(lambda: child_pid.is_file() and child_pid.read_text())
    lanes(tmp_path, "stop", "work")
    assert wait_for(lambda: not alive(int(child_pid.read_text())))


def test_a_finished_lane_has_its_exit_status(tmp_path):
    lanes(tmp_path, "start", "quick", "bash", "-c", "echo hi; exit 3")
    assert wait_for(lambda: (tmp_path / "lanes" / "quick.rc").is_file())
    assert (tmp_path / "lanes" / "quick.rc").read_text().strip() == "3"
    assert "done rc=3" in lanes(tmp_path, "wait", "5", "quick")


def test_pack_brings_small_logs_of_extra_dirs(tmp_path):
    """PACK_EXTRA: a lane's own logs (e.g. an engine's, with its stacks) come back before the lane ends."""
    import tarfile
    work = tmp_path / "work" / "toy"
    work.mkdir(parents=True)
    (work / "engine.log").write_text("stack")
    (work / "big.log").write_bytes(b"x" * (6 << 20))
    (work / "weights.bin").write_bytes(b"w")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "LANES_DIR": str(tmp_path / "lanes"), "RES": str(tmp_path / "res"), "OUT": str(out),
           "PACK_EXTRA": f"{tmp_path / 'work'} {tmp_path / 'missing'}"}
    r = subprocess.run(["bash", str(ROOT / "lab" / "lanes.sh"), "pack"], cwd=tmp_path, capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    names = tarfile.open(out / "lanes.tgz").getnames()
    assert any(n.endswith("toy/engine.log") for n in names)
    assert not any(n.endswith(("big.log", "weights.bin")) for n in names)
