"""Processes for bench/faults.py: eyas runs forked from a warm parent, killed by real signals.

A cold `python -m eyas.cli` costs ~20 s on a loaded 2-core box (importing torch and transformers); the fork
server imports them once and forks one child per run, so 60+ kills fit in minutes. Each child is still its
own process, with its own stdout/stderr files, that SIGKILL/SIGTERM/SIGINT really hit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- processes
def _env(**extra) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Forker:
    """Starts eyas runs as forks of a warm process that has already imported torch and transformers (a cold
    `python -m eyas.cli` costs ~20 s on a loaded 2-core box; a fork costs milliseconds). Each run is still a
    separate process that a signal really kills, with its own stdout/stderr files."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(), bufsize=1)
        self.exits: dict[int, int] = {}
        self.cv = threading.Condition()
        self.pids: list[int] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.cv:
                if "pid" in msg:
                    self.pids.append(msg["pid"])
                else:
                    self.exits[msg["exit"]] = msg["rc"]
                self.cv.notify_all()

    def spawn(self, argv, env: dict, work: Path) -> "Child":
        n = time.monotonic_ns()
        out, err = work / f"run-{n}.out", work / f"run-{n}.err"
        with self.cv:
            self.pids.clear()
            self.proc.stdin.write(json.dumps({"argv": [str(a) for a in argv], "env": env, "cwd": str(work),
                                              "stdout": str(out), "stderr": str(err)}) + "\n")
            self.proc.stdin.flush()
            self.cv.wait_for(lambda: self.pids, timeout=60)
            return Child(self, self.pids[0], out, err)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class Child:
    def __init__(self, forker, pid, out, err):
        self.f, self.pid, self.out, self.err = forker, pid, out, err

    def poll(self):
        with self.f.cv:
            return self.f.exits.get(self.pid)

    def wait(self, timeout=None):
        with self.f.cv:
            if not self.f.cv.wait_for(lambda: self.pid in self.f.exits, timeout=timeout):
                raise TimeoutError(f"pid {self.pid} still running")
            return self.f.exits[self.pid]

    def send_signal(self, sig):
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def result(self, killed=False) -> dict:
        return {"killed": killed, "rc": self.wait(), "stdout": self.out.read_text(errors="replace"),
                "stderr": self.err.read_text(errors="replace")[-3000:]}


def fork_server() -> None:
    """The warm parent: import what every command needs, then fork one child per request on stdin."""
    import traceback

    import transformers  # noqa: F401
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: F401  (load the lazy modules)

    import eyas.data.regenerate  # noqa: F401
    import eyas.store.extract  # noqa: F401
    import eyas.train.loop  # noqa: F401
    from eyas.cli import main as eyas_main

    lock = threading.Lock()

    def say(obj):
        with lock:
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(0.05)
                continue
            say({"exit": pid, "rc": os.waitstatus_to_exitcode(status)})

    threading.Thread(target=reap, daemon=True).start()
    for line in sys.stdin:
        req = json.loads(line)
        with lock:
            pid = os.fork()
        if pid:
            say({"pid": pid})
            continue
        rc = 1
        try:  # the child: its own files, env and cwd; then exactly what `eyas ...` would do
            for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            os.chdir(req["cwd"])
            os.environ.update(req["env"])
            rc = eyas_main(req["argv"])
        except KeyboardInterrupt:
            traceback.print_exc()
            rc = 130
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - a crash of the command: its traceback is the evidence
            traceback.print_exc()
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)


FORKER: Forker | None = None


def start_and_kill(cmd, *, delay=None, point=None, point_env="EYAS_STORE_PAUSE_AT", sig=signal.SIGKILL,
                   work: Path, env=None, timeout=300) -> dict:
    """Run `cmd` (eyas argv); kill it with `sig` after `delay` s or once it pauses at `point`. Returns
    killed (bool), rc, stdout, stderr tail."""
    mark = work / f"mark-{time.monotonic_ns()}"
    extra = dict(env or {})
    if point:
        extra.update({point_env: point, point_env.replace("PAUSE_AT", "PAUSE_MARK"): str(mark)})
    child = FORKER.spawn(cmd, extra, work)
    t0 = time.monotonic()
    killed = False
    while child.poll() is None:
        if (point and mark.exists()) or (delay is not None and time.monotonic() - t0 >= delay):
            child.send_signal(sig)
            killed = True
            if sig != signal.SIGKILL:  # a polite signal gets a moment to finish cleanly, then the hard one
                try:
                    child.wait(timeout=30)
                except TimeoutError:
                    child.send_signal(signal.SIGKILL)
            break
        if time.monotonic() - t0 > timeout:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    return child.result(killed)


def run_to_end(cmd, *, work: Path, env=None, timeout=600) -> dict:
    return FORKER.spawn(cmd, dict(env or {}), work).result()


def one_line_error(r: dict) -> bool:
    """A user-facing failure: non-zero exit, no traceback, the message is one line."""
    lines = [x for x in r["stderr"].splitlines() if x.startswith("eyas ")]
    return r["rc"] != 0 and "Traceback" not in r["stderr"] and len(lines) == 1



if __name__ == "__main__":
    fork_server()
