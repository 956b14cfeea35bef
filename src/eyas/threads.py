"""CPU threading policy for eyas processes, set before torch is imported.

On a shared CPU box, OpenMP's default (threads spin for ~300k iterations at every barrier, one thread
per physical core) turns other jobs' load into eyas's slowdown: next to other work on a 2-core machine, most of
eyas's CPU goes to libgomp spin-waiting and the demo runs several times slower. So:

- `OMP_WAIT_POLICY=PASSIVE`: idle OpenMP threads sleep instead of spinning (libgomp reads it once, when
  torch loads it: hence before the import);
- threads = the CPUs this process may actually use (affinity mask and cgroup CPU quota), not the
  machine's core count.

Every setting already in the environment wins (`OMP_WAIT_POLICY`, `OMP_NUM_THREADS`), then
`$EYAS_NUM_THREADS` / `eyas --threads N`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from eyas import env as switches


def available_cpus() -> int:
    """CPUs this process may run on: the affinity mask, capped by a cgroup v2 CPU quota (containers)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def configure_cpu(threads: int | None = None) -> dict[str, str]:
    """Set the policy in the environment (and in torch when it is already imported); returns what was set."""
    env = os.environ
    set_: dict[str, str] = {}
    if "OMP_WAIT_POLICY" not in env:
        env["OMP_WAIT_POLICY"] = set_["OMP_WAIT_POLICY"] = "PASSIVE"
    wanted = switches.get("EYAS_NUM_THREADS")
    if threads is None and wanted:
        try:
            threads = int(wanted)
        except ValueError:
            raise ValueError(f"$EYAS_NUM_THREADS={wanted!r}: give a whole number") from None
    if threads is not None or "OMP_NUM_THREADS" not in env:
        n = threads or available_cpus()
        env["OMP_NUM_THREADS"] = set_["OMP_NUM_THREADS"] = str(n)
        # torch already loaded (an in-process caller): too late for the wait policy; the count is only
        # changed when asked for, so a caller's own setting (the test suite's one thread) stands.
        if threads is not None and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(n)
    return set_
