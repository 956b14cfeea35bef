"""Run a lab plan's `tick` against a stubbed lanes.sh: which lanes it would start, given the carry items installed
and the lanes ended (with their exit codes)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUB = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
"""


def calls(script: str, tmp_path: Path, installed: list[str], ended: dict[str, int],
          out: Path | None = None, env: dict | None = None, running: tuple[str, ...] = (),
          carried: tuple[str, ...] = ()) -> list[str]:
    """What the tick asked of lanes.sh, in order: a started lane's name, `stop:NAME`, or the verb (`wait`); the
    once-per-machine `snap` is left out. `running`: lanes started and not ended; the pack's index names the items
    installed and `carried` (still arriving)."""
    repo, carry, lanes = tmp_path / "repo", tmp_path / "carry", tmp_path / "lanes"
    for d in (repo / "lab", carry, lanes):
        d.mkdir(parents=True, exist_ok=True)
    for name in (script, "tick.sh"):
        shutil.copy(ROOT / "lab" / name, repo / "lab")
    (repo / "lab" / "lanes.sh").write_text(STUB)   # records what would start; starts nothing
    for name in installed:
        (carry / f"installed.{name}").touch()
    names = list(dict.fromkeys([*installed, *carried]))
    (carry / "index.json").write_text(json.dumps([{"name": n, "offset": 0, "size": 1} for n in names]))
    for name, rc in ended.items():
        (lanes / f"{name}.rc").write_text(f"{rc}\n")
    for name in running:   # started, not ended
        (lanes / f"{name}.pid").write_text("1\n")
    log = tmp_path / "calls"
    log.write_text("")
    env = {**{k: v for k, v in os.environ.items() if k != "OUT"}, **(env or {})}
    if out is not None:
        env["OUT"] = str(out)
    r = subprocess.run(["bash", f"lab/{script}", "tick", "0"], cwd=repo, capture_output=True, text=True,
                       env={**env, "CARRY_DIR": str(carry), "LANES_DIR": str(lanes), "CALLS": str(log)})
    assert r.returncode == 0, r.stderr
    return [line.split()[1] if line.startswith("start ") else
            "stop:" + line.split()[1] if line.startswith("stop ") else line.split()[0]
            for line in log.read_text().splitlines() if not line.startswith("snap")]


def started(*args, **kw) -> list[str]:
    return [c for c in calls(*args, **kw) if c not in ("wait", "pack") and not c.startswith("stop:")]
