"""Import a script that is not part of the package (bench/, lab/, tests' data) as a module, by its path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """The module of `path` (relative to the repository root, or absolute), executed afresh."""
    p = Path(path) if Path(path).is_absolute() else ROOT / path
    spec = importlib.util.spec_from_file_location(name or f"script_{p.parent.name}_{p.stem}", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
