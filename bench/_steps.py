"""A resumable bench procedure's machinery: steps run once what they need is done, several at once, each command's
whole process tree bounded in time, the state kept in a JSON file so a re-run does only what is left.

    state, save = load_state(WORK / "state.json", redo=False)
    left = run_steps(todo, needs, action, state, save, workers=4, budget_s=480)

`todo` is a list of (unit, step) pairs (a unit: one toy, one model...), `needs[step]` the steps of the same unit it
waits for, `action(unit, step)` returns the step's JSON-able result or raises. A result holding "error" is a failed
step: the steps after it are left for a re-run, the others go on.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Hashable


class StepError(RuntimeError):
    """A step that failed or ran past its time; the message ends with the last lines of its logs."""


# A line naming an exception: vLLM's root cause sits far above its closing "Engine core initialization failed".
ERROR_LINE = re.compile(r"\b[A-Z]\w*(Error|Exception)\b: ")


def tails(*logs: Path, lines: int = 15) -> str:
    """Each existing log's first lines naming an exception (3 at most, distinct) and its last `lines` lines."""
    out = []
    for log in logs:
        if Path(log).is_file():
            text = Path(log).read_text(errors="replace").splitlines()
            found = (ERROR_LINE.search(x) for x in text)
            errors = list(dict.fromkeys(x[m.start():][:300] for x, m in zip(text, found) if m))[:3]
            out.append(f"--- {log}" + (" (errors: " + " | ".join(errors) + ")" if errors else "")
                       + " (last lines):\n" + "\n".join(x[-300:] for x in text[-lines:]))
    return "\n".join(out)


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it, read from /proc (its whole tree, whatever their sessions: eyas's
    engine workers run in sessions of their own, their engine cores below them)."""
    children = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children[int(stat.read_text().rsplit(")", 1)[1].split()[1])].append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):   # a process that ended meanwhile
            continue
    tree, stack = [], [pid]
    while stack:
        tree.append(stack.pop())
        stack += children.get(tree[-1], [])
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_logged(argv: list[str], log: Path, timeout: float, env: dict, name: str, engine_logs=()) -> int:
    """Run `argv`, its output written to `log` as it comes; return its exit code. Past `timeout` it is killed with
    every process below it and StepError names the last lines of `log` and of `engine_logs`."""
    with open(log, "w") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(p.pid)
            p.wait()
            raise StepError(f"{name}: no end after {timeout:.0f} s: stopped with its processes\n"
                            + tails(log, *engine_logs)) from None
        except BaseException:
            kill_tree(p.pid)
            p.wait()
            raise


def load_state(path: Path, redo: bool = False) -> tuple[dict, Callable[[], None]]:
    """The state a previous call left in `path` (empty with `redo`), and a thread-safe save() writing it back
    atomically."""
    state = {} if redo or not path.is_file() else json.loads(path.read_text())
    lock = threading.Lock()

    def save():
        with lock:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(state, indent=1))
            os.replace(tmp, path)

    return state, save


def run_steps(todo: list[tuple[Hashable, str]], needs: dict[str, tuple[str, ...]],
              action: Callable[[Hashable, str], dict], state: dict, save: Callable[[], None], *, workers: int,
              budget_s: float | None = None, t0: float | None = None) -> list[tuple[Hashable, str]]:
    """Run each (unit, step) of `todo` once the steps it needs are done in state[unit], `workers` at a time, in
    `todo`'s order among those ready; no step starts `budget_s` after `t0`. Each result (a raised exception as
    {"error"}) goes to state[unit][step] with its wall_s and started_s (after `t0`), and is saved. Returns the
    pairs left: failed, waiting for one that failed or was not asked for, or past the budget."""
    t0 = time.perf_counter() if t0 is None else t0
    todo = list(todo)

    def done(unit, s):
        return s in state.get(unit, {}) and "error" not in state[unit][s]

    def one(unit, s):
        s0 = time.perf_counter()
        try:
            res = action(unit, s)
        except Exception as e:  # noqa: BLE001 - a failed step is a result; the steps after it wait for a re-run
            res = {"error": f"{type(e).__name__}: {e}"[-4000:]}
        # when it started (seconds into this call) and how long it took: the call's timeline
        res = {**res, "wall_s": res.get("wall_s", round(time.perf_counter() - s0, 2)),
               "started_s": round(s0 - t0, 1)}
        state.setdefault(unit, {})[s] = res
        save()

    left, running = [], {}
    with ThreadPoolExecutor(workers) as pool:
        while todo or running:
            for unit, s in list(todo):
                coming = set(todo) | set(running.values())
                if any(not done(unit, n) and (unit, n) not in coming for n in needs[s]):
                    todo.remove((unit, s))   # a step it needs failed, ran out of budget or was not asked for
                    left.append((unit, s))
                elif all(done(unit, n) for n in needs[s]):
                    todo.remove((unit, s))
                    if budget_s is not None and time.perf_counter() - t0 > budget_s:
                        left.append((unit, s))
                    else:
                        running[pool.submit(one, unit, s)] = (unit, s)
            if running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in finished:
                    unit, s = running.pop(f)
                    if f.exception() is not None:   # the bookkeeping itself failed: say so, as a step error
                        state.setdefault(unit, {})[s] = {"error": f"{type(f.exception()).__name__}: {f.exception()}"}
                    if "error" in state[unit][s]:
                        left.append((unit, s))
            elif todo:   # nothing can run and nothing runs: what is left waits for steps not asked for
                left += todo
                todo = []
    return left
