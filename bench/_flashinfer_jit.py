"""FlashInfer's JIT modules built before the first vLLM engine starts on a fresh GPU machine.

vLLM 0.26 JIT-compiles FlashInfer's top-k/top-p sampler (run once at start-up) and, in eager mode, the DeepSeek
YaRN rope when no AOT cache is installed; an engine start-up would otherwise hide a silent nvcc build of minutes.
Each module builds in its own process of vLLM's env, beside other work; every engine after loads it from
FlashInfer's cache.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from _steps import kill_tree

JIT_MODULES = {"sampling": "flashinfer.sampling:get_sampling_module", "rope": "flashinfer.rope:get_rope_module"}


def start_jit(python: str, logs: Path) -> list[tuple[str, subprocess.Popen, float]]:
    """Start one build per module with vLLM's `python`, each logging to logs/flashinfer-jit-NAME.log."""
    logs.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # ninja's compile jobs per build (FlashInfer reads MAX_JOBS as torch's extensions do): the builds together use
    # about the host's cores, not each all of them beside the other steps (nvcc jobs take GBs of host memory each)
    env.setdefault("MAX_JOBS", str(max(1, (os.cpu_count() or 2) // len(JIT_MODULES))))
    jobs = []
    for name, where in JIT_MODULES.items():
        mod, fn = where.split(":")
        with open(logs / f"flashinfer-jit-{name}.log", "w") as f:
            p = subprocess.Popen([python, "-c", f"import {mod}; {mod}.{fn}(); print('built {name}')"],
                                 stdout=f, stderr=subprocess.STDOUT, env=env)
        jobs.append((name, p, time.perf_counter()))
    return jobs


def finish_jit(jobs, timeout: float) -> dict:
    """Wait for the builds (at most `timeout` s in all); a build past it is stopped (vLLM then builds it itself)."""
    out, deadline = {}, time.perf_counter() + timeout
    for name, p, t0 in jobs:
        try:
            rc = p.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            kill_tree(p.pid)
            rc = p.wait()
        out[name] = {"rc": rc, "seconds": round(time.perf_counter() - t0, 1)}
    return out
