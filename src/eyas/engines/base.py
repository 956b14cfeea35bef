"""The small interface every engine adapter shares, and the one way eyas talks to an engine's env.

An engine lives in its own virtual environment (vLLM pins its own torch); eyas runs a worker script
there with `python worker.py IN.json OUT.json` and reads the JSON it writes. Workers must import only
the engine and the standard library (they run where eyas is not installed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eyas import env as switches


class EngineError(RuntimeError):
    """An engine is missing, the wrong version, or its worker failed; the message says what to do."""


@dataclass
class ProbeResult:
    entry_point: str          # e.g. "vllm.LLM.__init__"
    ok: bool
    detail: str               # what was expected / found


def engine_python(python: str | os.PathLike | None, env_var: str, how_to: str) -> Path:
    """The interpreter of the engine's environment: --python, else $ENV_VAR; else an error saying how."""
    cand = python or switches.get(env_var)
    if not cand:
        raise EngineError(f"no engine environment given: pass --python PATH or set ${env_var}.\n{how_to}")
    p = Path(cand).expanduser()
    if p.is_dir():
        p = p / "bin" / "python"
    if not p.exists():
        found = shutil.which(str(cand))
        if not found:
            raise EngineError(f"engine python {cand} does not exist.\n{how_to}")
        p = Path(found)
    return p


def run_in_env(python: Path, worker: Path, payload: dict[str, Any], *, timeout: float | None = None,
               env: dict[str, str] | None = None, log: Path | None = None) -> dict[str, Any]:
    """Run `worker` under `python` with `payload`; return the JSON it wrote. Its stdout/stderr go to
    `log` (or are kept for the error message) so an engine crash is reported, not swallowed."""
    with tempfile.TemporaryDirectory(prefix="eyas-engine-") as tmp:
        inp, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inp.write_text(json.dumps(payload))
        run_env = {**os.environ, **(env or {})}
        run_env.pop("PYTHONPATH", None)  # the engine env must not see eyas's site-packages
        sink = open(log, "w") if log else subprocess.PIPE
        try:
            # -P: the worker's own folder (eyas/engines, which holds vllm.py) must not shadow the engine package.
            proc = subprocess.run([str(python), "-P", str(worker), str(inp), str(out)], stdout=sink,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout, env=run_env)
        except subprocess.TimeoutExpired as e:
            raise EngineError(f"{worker.name} did not finish within {timeout}s" + (f"; log: {log}" if log else "")) from e
        finally:
            if log:
                sink.close()
        if proc.returncode != 0 or not out.exists():
            tail = (Path(log).read_text()[-4000:] if log else (proc.stdout or "")[-4000:])
            raise EngineError(f"{worker.name} failed (exit {proc.returncode}) under {python}:\n{tail}")
        return json.loads(out.read_text())
