"""The recipe runner: steps with done-markers in OUT/state.json, a time budget per call, resume after any stop.

A step is one eyas command (a subprocess, stopped when the budget ends: the next call runs it again and the
command resumes itself — regenerate skips the rows it wrote, train continues from its last checkpoint), one
started in the background beside later steps (reaped when it exits), or an in-process call whose JSON result is
kept in the state (the demo's stages). state.json is rewritten atomically after every step, so a SIGKILL at any
moment loses at most the step that was running; `started` tells a plan that a step was cut, so it resumes it
rather than starting over. The state also records the recipe's identity: another recipe in the same OUT is
refused naming the first key that differs, unless the call starts over (`fresh`).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from eyas.recipes.recipe import RecipeError

STATE = "state.json"
# Exit codes of a call: every step done, or steps left (the budget ended first, or none could start in it)
DONE, LEFT = 0, 3


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def eyas_command() -> list[str]:
    """How a step runs `eyas ...`: this interpreter (see step_env for which eyas it imports)."""
    return [sys.executable, "-m", "eyas.cli"]


def step_env() -> dict[str, str]:
    """The environment of a step: the eyas this process runs first on the path (a checkout's src/ too)."""
    src = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (src, os.environ.get("PYTHONPATH"))))}


def _claimed_by_demo(path: Path) -> bool:
    """`eyas demo` claims its OUT itself (eyas.outputs) before its recipe runs there."""
    from eyas.outputs import read_record
    return (read_record(path, True) or {}).get("kind") == "demo" or (path / "summary.json").is_file()


class Runner:
    def __init__(self, work: Path, budget_s: float | None = None, fresh: bool = False):
        self.work = Path(work).expanduser().resolve()   # a symlinked OUT is where it points
        foreign = [] if not self.work.is_dir() or (self.work / STATE).is_file() else sorted(
            e.name for e in self.work.iterdir() if not e.name.startswith("."))
        if foreign and not _claimed_by_demo(self.work):
            raise RecipeError(f"--out {work} holds other files ({', '.join(foreign[:5])}), not a recipe run: "
                              f"choose another --out")
        self.work.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.work / ".recipe.lock", "w")   # one call at a time in an OUT (released by close)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise RecipeError(f"{self.work}: another `eyas run` is working in it; wait for it or use another --out") \
                from None
        self.state_path = self.work / STATE
        self.state: dict[str, Any] = {"done": {}}
        if self.state_path.is_file():
            if fresh:
                self.state["fresh"] = True   # earlier outputs are stale: steps overwrite them, never resume them
            else:
                try:
                    self.state = json.loads(self.state_path.read_text())
                except ValueError as e:
                    raise RecipeError(f"{self.state_path}: not a recipe state ({e}); remove it or use --fresh") from None
        self.budget_s = math.inf if budget_s is None else float(budget_s)
        self.t0 = time.perf_counter()
        self.bg: dict[str, tuple] = {}   # name -> (process, start, log file) of steps running in the background
        self.ran: list[str] = []         # steps this call started: none (and not done) means none fits the budget
        self.done_before = set(self.state["done"])

    # -- bookkeeping -------------------------------------------------------------------------------------------
    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def save(self) -> None:
        tmp = self.state_path.with_name(STATE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, default=str))
        os.replace(tmp, self.state_path)

    def check_recipe(self, identity: dict[str, Any]) -> None:
        """The recipe this OUT was made with must be this one (the keys that decide its data, draft and tau)."""
        ident = json.loads(json.dumps(identity, default=str))
        theirs = self.state.get("recipe")
        diff = [k for k in ident if theirs is not None and theirs.get(k) != ident[k]]
        diff += [k for k in (theirs or {}) if k not in ident]
        if diff:
            k = diff[0]
            raise RecipeError(f"{self.work} was made with another recipe: {k}={theirs.get(k)!r} there, "
                              f"{ident.get(k)!r} now{f' (also {diff[1:]})' if diff[1:] else ''}; give the same "
                              "values, another --out, or --fresh to start over")
        self.state["recipe"] = ident
        self.save()

    def done(self, name: str) -> bool:
        return name in self.state["done"]

    def started(self, name: str) -> bool:
        """NAME began under this state (and may have been cut): its command should resume, not start over."""
        return name in self.state.get("started", [])

    def seconds(self, name: str) -> float | None:
        """A step's seconds over every call it ran in."""
        return self.state.get("seconds", {}).get(name, self.state["done"].get(name))

    def count(self, name: str, seconds: float, ok: bool) -> None:
        """A step ended (ok) or was stopped: its seconds add up over every call it ran in (a step cut by the budget
        cost that time too)."""
        sec = self.state.setdefault("seconds", {})
        sec[name] = round(sec.get(name, 0) + seconds, 1)
        if ok:
            self.state["done"][name] = round(seconds, 1)
            self.state.setdefault("finished_at", {})[name] = now()
        self.save()
        if ok:
            print(f"[run] step {name} done in {sec[name]:.0f} s", flush=True)

    def _begin(self, name: str, need: float, what: str = "") -> bool:
        if self.left() < need:
            print(f"-- {name}: needs ~{need:.0f} s, {self.left():.0f} s left; the next call runs it", flush=True)
            return False
        left = "" if math.isinf(self.left()) else f" ({self.left():.0f} s left)"
        print(f"== {name}{left}{': ' + what if what else ''}", flush=True)
        self.ran.append(name)
        started = self.state.setdefault("started", [])
        if name not in started:
            started.append(name)
            self.save()
        return True

    # -- steps -------------------------------------------------------------------------------------------------
    def eyas(self, name: str, *args: str, need: float = 20) -> bool:
        """`eyas ARGS` under what is left of the budget (started only with `need` seconds left); True when done.
        Stopped at the budget: False, and the next call runs it again."""
        if self.done(name):
            return True
        if not self._begin(name, need, " ".join(args)):
            return False
        t, ok = time.perf_counter(), False
        try:
            timeout = None if math.isinf(self.left()) else max(1.0, self.left())
            r = subprocess.run([*eyas_command(), *args], env=step_env(), timeout=timeout)
            if r.returncode:
                raise RecipeError(f"step {name} failed (exit {r.returncode}): `eyas {' '.join(args)}`; fix it and "
                                  "rerun: finished steps are kept")
            ok = True
            return True
        except subprocess.TimeoutExpired:
            print(f"-- {name}: budget reached; the next call resumes it", flush=True)
            return False
        finally:
            self.count(name, time.perf_counter() - t, ok)

    def background(self, name: str, *args: str, need: float = 20) -> bool:
        """`eyas ARGS` started in the background (output to OUT/NAME.log); True when started or already done.
        `reap` records it done once it exits 0."""
        if self.done(name) or name in self.bg:
            return True
        if not self._begin(name, need, "(background) " + " ".join(args)):
            return False
        log = open(self.work / (name.replace(":", "-") + ".log"), "w")
        proc = subprocess.Popen([*eyas_command(), *args], env=step_env(), stdout=log, stderr=subprocess.STDOUT)
        self.bg[name] = (proc, time.perf_counter(), log)
        return True

    def reap(self, wait: bool = False) -> None:
        """Record finished background steps; wait=True: wait for all of them within the budget and stop any
        still running when it ends (not recorded: the next call runs it again)."""
        for name, (proc, t, log) in list(self.bg.items()):
            if wait:
                try:
                    proc.wait(timeout=None if math.isinf(self.left()) else max(1.0, self.left()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    print(f"-- {name}: budget reached; the next call runs it again", flush=True)
            rc = proc.poll()
            if rc is None:
                continue
            log.close()
            del self.bg[name]
            self.count(name, time.perf_counter() - t, rc == 0)
            if rc == 0:
                tail = Path(log.name).read_text(errors="replace").splitlines()[-25:]
                print(f"== {name} done in the background; the end of {log.name}:", *tail, sep="\n", flush=True)
            elif not wait or rc > 0:
                raise RecipeError(f"step {name} failed (exit {rc}); see {log.name}; finished steps are kept")

    def call(self, name: str, fn: Callable[[], Any], need: float = 0) -> tuple[bool, Any]:
        """An in-process step: fn() once, its JSON-able result kept in the state; (done, result)."""
        if self.done(name):
            return True, self.state.get("results", {}).get(name)
        if self.left() < need:
            print(f"-- {name}: needs ~{need:.0f} s, {self.left():.0f} s left; the next call runs it", flush=True)
            return False, None
        self.ran.append(name)
        started = self.state.setdefault("started", [])
        if name not in started:
            started.append(name)
        t = time.perf_counter()
        result = json.loads(json.dumps(fn(), default=str))
        self.state.setdefault("results", {})[name] = result
        self.count(name, time.perf_counter() - t, True)
        return True, result

    def record_call(self) -> None:
        """Once a call: stop background steps past the budget and add this call (its seconds, the steps it ran and
        finished) to the state; a plan calls it before writing a result that reports the calls."""
        self.reap(wait=True)
        if self.ran and not getattr(self, "_recorded", False):
            st, wall = self.state, round(time.perf_counter() - self.t0, 1)
            st.setdefault("calls", []).append({"at": now(), "seconds": wall, "ran": self.ran,
                                               "finished": sorted(set(st["done"]) - self.done_before)})
            st["seconds_total"] = round(st.get("seconds_total", 0.0) + wall, 1)
            self.save()
        self._recorded = True

    def close(self) -> None:
        """Let another call work in OUT."""
        if not self._lock.closed:
            self._lock.close()

    def finish(self, left: list[str]) -> int:
        """The call's end: record it, say what is `left` (the plan's steps not done); DONE when nothing is."""
        self.record_call()
        self.close()
        if not left:
            print("all steps done", flush=True)
            return DONE
        print(f"[run] to do: {', '.join(left)}; run the same command again to continue", flush=True)
        if not self.ran:   # calling again with the same budget cannot help: say so, so a loop of calls stops
            print(f"no step fits: a budget of {self.budget_s:g} s starts none of what is left", flush=True)
        return LEFT
