"""The eval's compiles, done beside training: a background `eyas eval --warm-only` on the first draft a training
run writes, so that inductor's on-disk caches (FX graphs, Triton kernels) hold the eval's graphs when the real
eval starts after training.

The draft's architecture, dtype and vocabulary are fixed before training ends, and its weights are inputs of the
compiled graphs, not constants: the graphs compiled for the first held-out-best draft are the final draft's
graphs. On an H200 the eval's warm-up (one torch.compile per step width) was ~107 of the GPU demo's ~208 eval
seconds. The warm-up runs at a lower CPU priority so that the trainer's host thread keeps its core.

`Background` is the one way the demo runs such a warm-up (this one, and `eyas train --warm-only` beside regenerate):
an eyas command, niced, with a bounded wait that stops it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def cli_flags(kw: dict[str, Any]) -> list[str]:
    """{'per_category': 3, 'tree': None, 'compile': False} -> ['--per-category', '3', '--no-compile']: the flags of
    an eyas command for these config fields (None left out; booleans as --x / --no-x, never left to a default that
    may differ from the caller's)."""
    out: list[str] = []
    for k, v in kw.items():
        flag = k.replace("_", "-")
        if v is None:
            continue
        out += [f"--{flag}"] if v is True else [f"--no-{flag}"] if v is False else [f"--{flag}", str(v)]
    return out


class Background:
    """`eyas ARGS...` started now at nice 10, output to LOG; `finish` waits a bounded time, then stops it."""

    def __init__(self, args: list[str], log: Path, result: Path | None = None):
        self.log_path, self.result, self._t0 = Path(log), result, time.perf_counter()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "eyas.cli", *args]
        nice = shutil.which("nice")   # (not preexec_fn: unsafe in a process with threads)
        self.proc = subprocess.Popen([nice, "-n", "10", *cmd] if nice else cmd, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def finish_waited(self, timeout: float) -> dict[str, Any]:
        """`finish`, plus how long the caller waited for it (waited_s)."""
        t = time.perf_counter()
        return {**self.finish(timeout), "waited_s": round(time.perf_counter() - t, 1)}

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait up to `timeout` s (then stop it): rc, killed, its seconds, its log and (when written) its JSON."""
        killed = False
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc, killed = self.proc.wait(), True
        self._log.close()
        info: dict[str, Any] = {"rc": rc, "killed": killed, "seconds": round(time.perf_counter() - self._t0, 1),
                                "log": str(self.log_path)}
        if self.result is not None:
            try:
                info["result"] = json.loads(self.result.read_text())
            except (OSError, ValueError):
                pass
        return info


def train_warm(out: Path, max_length: int, draft_vocab_size: int, train_flags: list[str]) -> Background:
    """`eyas train --warm-only` (train/warm.py) started beside the data stages: the training's compiles on stand-in
    rows of the real length and vocabulary, with the real run's flags; its log is OUT.log."""
    out = Path(out)
    return Background(["train", "--warm-only", "--out", str(out), "--max-length", str(max_length),
                       "--draft-vocab-size", str(draft_vocab_size), *train_flags], out.with_name(out.name + ".log"))


class Prewarm:
    """Watch RUN_DIR for a draft newer than this object; copy it to WORK/draft and start the warm-up on it.

    `finish` stops watching and waits for the warm-up (a bounded time: a partly warm cache still helps)."""

    def __init__(self, run_dir: Path, work: Path, eval_kw: dict[str, Any] | list[str], *, poll_s: float = 2.0):
        # eval_kw: EvalConfig fields, or the eval's flags as given on a command line
        self.run_dir, self.work, self.poll_s = Path(run_dir), Path(work), poll_s
        self.flags = list(eval_kw) if isinstance(eval_kw, list) else cli_flags(eval_kw)
        self.proc: subprocess.Popen | None = None
        self.job: Background | None = None
        self._t0, self._since = time.perf_counter(), time.time()
        self.started_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="eval-prewarm")
        self._thread.start()

    def _ready(self) -> bool:
        w, c = self.run_dir / WEIGHTS, self.run_dir / CONFIG
        try:
            if w.stat().st_mtime < self._since or c.stat().st_mtime < self._since:
                return False    # a draft from an earlier run in the same directory
            json.loads(c.read_text())
        except (OSError, ValueError):   # not there yet, or its config half written
            return False
        return True

    def _watch(self) -> None:
        while not self._stop.is_set():
            if self._ready():
                draft = self.work / "draft"
                draft.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.run_dir / WEIGHTS, draft / WEIGHTS)   # replaced atomically by the trainer
                shutil.copy2(self.run_dir / CONFIG, draft / CONFIG)
                try:
                    json.loads((draft / CONFIG).read_text())
                except ValueError:   # copied while the trainer rewrote it: try again at the next poll
                    self._stop.wait(self.poll_s)
                    continue
                self.job = Background(["eval", "--draft", str(draft), "--warm-only", "--json", "--out",
                                       str(self.work / "warm.json"), *self.flags],
                                      self.work / "eval-warm.log", self.work / "warm.json")
                self.proc = self.job.proc
                self.started_at = time.perf_counter() - self._t0
                return
            self._stop.wait(self.poll_s)

    def finish(self, timeout: float) -> dict[str, Any]:
        """Stop watching, wait up to `timeout` s for the warm-up (then stop it); what happened, for the report."""
        self._stop.set()
        self._thread.join()
        if self.proc is None:
            return {"started": False}
        job = self.job.finish(timeout)
        info: dict[str, Any] = {"started": True, "started_at_s": round(self.started_at, 1),
                                "ended_at_s": round(time.perf_counter() - self._t0, 1), "rc": job["rc"],
                                "killed": job["killed"], "log": job["log"]}
        if isinstance(job.get("result"), dict) and "seconds" in job["result"]:
            info["warm"] = job["result"]["seconds"]
        return info
