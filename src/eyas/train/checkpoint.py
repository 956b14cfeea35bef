"""Trainer checkpoints: atomic save, rotation, safe load, RNG state, and who owns a RUN dir.

RUN/checkpoints/step-N/ = a draft dir (config.json + model.safetensors, eyas.draft.io) + state.pt
(optimizer, scheduler, RNG, step, best tau, metric history, config). Rules, each one a failure that fault
injection (bench/faults.py) can provoke:
  - a checkpoint is complete or absent: written to step-N.tmp, renamed into place; a killed save
    leaves only step-N.tmp, which the next run deletes (never a dead end needing a manual delete);
  - names that are not `step-<int>` (a .tmp, a user's copy) are never parsed as steps;
  - state.pt is read with weights_only=True: a crafted pickle cannot run code on `--resume`;
  - on resume metrics.jsonl is cut back to the checkpoint's step, so steps are never logged twice;
  - a fresh run refuses a RUN dir that already holds a run (checkpoints or metrics) unless told
    `--resume` (continue it) or `--overwrite` (delete that run's files first): eyas.outputs, kind "run".
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from eyas import env
from eyas.faultpoints import pause_at

CHECKPOINTS = "checkpoints"
STATE = "state.pt"
METRICS = "metrics.jsonl"
_STEP = re.compile(r"step-(\d+)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or read; the message names the file and the fix."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during training; the message says how to continue (the CLI prints it as one line, exit 130)."""


# ---------------------------------------------------------------- RNG
def rng_state() -> dict:
    s = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: dict) -> None:
    random.setstate(_as_tuples(s["python"]))
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def _as_tuples(x):
    """random.setstate needs tuples; a round trip through some loaders hands back lists."""
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---------------------------------------------------------------- finding checkpoints
def checkpoints(out: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (state.pt present) as (step, dir), oldest first; other names are ignored."""
    found = []
    for p in (Path(out) / CHECKPOINTS).glob("step-*"):
        m = _STEP.fullmatch(p.name)
        if m and (p / STATE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(out: Path) -> Path | None:
    cks = checkpoints(out)
    return cks[-1][1] if cks else None


def clean_partial(out: Path) -> None:
    """Delete what a killed save left behind (step-N.tmp): it was never a checkpoint."""
    for p in (Path(out) / CHECKPOINTS).glob("step-*.tmp"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink()


# ---------------------------------------------------------------- the RUN dir (claimed through eyas.outputs)
def truncate_metrics(out: Path, step: int) -> None:
    """Keep the log lines of steps <= `step` (the checkpoint resumed from); a torn last line goes too."""
    path = Path(out) / METRICS
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= step:
            keep.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(keep))
    os.replace(tmp, path)


# ---------------------------------------------------------------- save / load
def save_checkpoint(out: Path, step: int, write_draft: Callable[[Path], Any], state: dict, keep: int) -> Path:
    """Write checkpoints/step-`step` atomically and keep the newest `keep` (this one always among them).

    `write_draft(dir)` writes the draft dir (config + weights); `state` goes to state.pt."""
    root = Path(out) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    ck = root / f"step-{step}"
    tmp = root / f"step-{step}.tmp"
    clean_partial(out)
    try:
        write_draft(tmp)
        _crash_point("checkpoint-draft-written")
        torch.save(state, tmp / STATE)
        _crash_point("checkpoint-state-written")
    except (RuntimeError, OSError) as e:  # torch.save reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"{ck}: could not write the checkpoint ({type(e).__name__}: {str(e)[:200]}); "
                              f"free disk space and continue with --resume (the last complete checkpoint "
                              f"is kept)") from None
    if ck.exists():
        shutil.rmtree(ck)
    tmp.rename(ck)  # a checkpoint is complete or absent
    _crash_point("checkpoint-renamed")
    older = [p for s, p in checkpoints(out) if s < step]
    for p in older[:max(0, len(older) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return ck


# What state.pt holds, each with its type: a file of the right keys but other values is not a checkpoint either.
_STATE_TYPES = {"optimizer": dict, "scheduler": dict, "rng": dict, "step": int, "config": dict,
                "best_tau": (int, float), "history": list}


def load_state(ck: Path) -> dict:
    """state.pt of a checkpoint, loaded as plain tensors and containers (no code can run)."""
    path = Path(ck) / STATE
    way_out = (f"delete {Path(ck).name} to resume from the one before it, or start over with --overwrite")
    try:
        st = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:   # PyTorch's own text advises weights_only=False, i.e. running the file's code
        raise CheckpointError(f"{path}: not a loadable eyas checkpoint (it holds objects other than tensors and "
                              f"plain containers, which are never unpickled); {way_out}") from None
    except (RuntimeError, EOFError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path}: not a loadable eyas checkpoint ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200] if str(e) else ''}); {way_out}") from None
    if not isinstance(st, dict):
        raise CheckpointError(f"{path}: holds a {type(st).__name__}, not an eyas checkpoint; {way_out}")
    missing = [k for k in _STATE_TYPES if k not in st]
    if missing:
        raise CheckpointError(f"{path}: missing keys {missing}; not an eyas checkpoint")
    wrong = [f"{k} is a {type(st[k]).__name__}" for k, t in _STATE_TYPES.items()
             if not isinstance(st[k], t) or (t is int and isinstance(st[k], bool))]
    if not wrong and st["step"] < 0:
        wrong = [f"step is {st['step']}"]
    if wrong:
        raise CheckpointError(f"{path}: {'; '.join(wrong)}, not what an eyas checkpoint holds; {way_out}")
    return st


def _crash_point(name: str) -> None:
    """Fault-injection hook (tests, bench/faults.py): EYAS_TRAIN_PAUSE_AT=name hangs here so the caller
    can kill the process at exactly this moment (announced in $EYAS_TRAIN_PAUSE_MARK);
    EYAS_TRAIN_DISK_FULL_AT=name fails here the way torch.save does on a full disk. A no-op otherwise."""
    if env.get("EYAS_TRAIN_DISK_FULL_AT") == name:
        raise RuntimeError("[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed (injected: no space left on device)")
    pause_at("TRAIN", name)
