"""Damage at rest and unsafe paths (issue #17 items 3, 6, 8, 10 and the listed risks): detected or repaired."""

import json
import os
import shutil

import pytest

from eyas.cli import main
from eyas.store import HiddenStateStore, StoreError, verify_store
from eyas.extract import ExtractConfig, run

KW = dict(shard_mb=0.03, token_budget=96, writer_threads=1)


@pytest.fixture(scope="module")
def clean(tiny_target, prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "store"
    run(ExtractConfig(target=str(tiny_target), data=prepared, out=out, **KW))
    return out


def copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def shas(d):
    return [s["sha256"] for s in json.loads((d / "manifest.json").read_text())["shards"]]


def extract(tiny_target, prepared, out):
    return run(ExtractConfig(target=str(tiny_target), data=prepared, out=out, **KW))


def flip(p, at=-16):
    b = bytearray(p.read_bytes())
    b[at] ^= 0x5A
    p.write_bytes(bytes(b))


def test_altered_shard_bytes_are_caught_when_reading(clean, tmp_path):
    # item 3: same-size altered bytes trained with rc 0 (reads checked sizes only).
    d = copy(clean, tmp_path / "s")
    flip(d / "shard-00001.safetensors")
    m = json.loads((d / "manifest.json").read_text())
    first = m["shards"][1]["first"]
    with pytest.raises(StoreError, match="shard-00001.safetensors: sha256 differs"):
        HiddenStateStore(d)[first]


def test_resume_redoes_a_flipped_shard(clean, tiny_target, prepared, tmp_path):
    # item 3 (resume side): completed_shards kept a same-size damaged shard as done.
    d = copy(clean, tmp_path / "s")
    (d / "manifest.json").unlink()                         # an unfinished store
    flip(d / "shard-00001.safetensors")
    s = extract(tiny_target, prepared, d)
    assert s["shards_written"] == 1 and shas(d) == shas(clean) and verify_store(d) == []


@pytest.mark.parametrize("damage", ["truncate", "delete", "flip"])
def test_rerun_repairs_a_finished_store(clean, tiny_target, prepared, tmp_path, damage):
    # item 8: a finished store with a truncated or deleted shard: extract said "complete (nothing to do)".
    d = copy(clean, tmp_path / "s")
    f = d / "shard-00002.safetensors"
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[:-50])
    elif damage == "delete":
        f.unlink()
    else:
        flip(f)
    s = extract(tiny_target, prepared, d)
    assert s.get("status") != "complete (nothing to do)" and s["shards_written"] == 1
    assert shas(d) == shas(clean) and verify_store(d) == []


def test_flipped_prepared_shard_is_refused_by_extract_and_doctor(tiny_target, prepared, tmp_path, capsys):
    # item 6: prepared rows with flipped token bytes were extracted and passed doctor.
    p = copy(prepared, tmp_path / "prep")
    flip(next(p.glob("rows-*.safetensors")), -8)
    rc = main(["extract", "--target", str(tiny_target), "--data", str(p), "--out", str(tmp_path / "s"),
               "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 1 and "sha256 differs" in err and len(err.strip().splitlines()) == 1
    from eyas.doctor import check_prepared
    checks = []
    check_prepared(p, None, None, checks)
    assert checks and checks[0].status == "fail" and "sha256" in checks[0].detail


@pytest.mark.parametrize("bad", ["../shard-00000.safetensors", "/etc/passwd", "sub/shard-00000.safetensors"])
def test_manifest_paths_cannot_leave_the_store(clean, tmp_path, bad):
    d = copy(clean, tmp_path / "s")
    m = json.loads((d / "manifest.json").read_text())
    m["shards"][0]["file"] = bad
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreError, match="no paths outside the store"):
        HiddenStateStore(d)
    assert verify_store(d) and "no paths outside" in verify_store(d)[0]


def test_damaged_manifests_are_rebuilt_not_dead_ends(clean, tiny_target, prepared, tmp_path):
    d = copy(clean, tmp_path / "s")
    (d / "manifest.json").write_text('{"format": "eyas-st')   # torn
    (d / "rank-0.json").write_text("{")                         # torn too: every shard is redone
    s = extract(tiny_target, prepared, d)
    assert s["merged"] and shas(d) == shas(clean)


def test_planted_symlink_at_a_tmp_path_is_not_written_through(clean, tiny_target, prepared, tmp_path):
    d = copy(clean, tmp_path / "s")
    (d / "manifest.json").unlink()
    (d / "shard-00001.safetensors").unlink()
    victim = tmp_path / "planted.txt"   # dangling: Path.exists() is False for the link, so it was written through
    (d / "shard-00001.safetensors.tmp").symlink_to(victim)
    extract(tiny_target, prepared, d)
    assert not victim.exists() and shas(d) == shas(clean)
    assert not os.path.lexists(d / "shard-00001.safetensors.tmp")


def test_a_second_extract_on_the_same_out_is_refused(clean, tmp_path):
    from eyas.store.writer import store_lock

    d = copy(clean, tmp_path / "s")
    with store_lock(d, "rank-0", wait=False):   # another process is writing rank 0
        with pytest.raises(StoreError, match="another `eyas extract` is writing this store"):
            with store_lock(d, "rank-0", wait=False):
                pass


def test_overwrite_deletes_only_a_store(clean, tiny_target, prepared, tmp_path, capsys):
    # item 10: `extract --overwrite` deleted any directory (a thesis.txt was lost).
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.txt").write_text("years of work")
    rc = main(["extract", "--target", str(tiny_target), "--data", str(prepared), "--out", str(d), "--overwrite",
               "--device", "cpu"])
    assert rc == 1 and "thesis.txt" in capsys.readouterr().err
    assert (d / "thesis.txt").read_text() == "years of work"
    s = copy(clean, tmp_path / "store")
    assert extract(tiny_target, prepared, s)["status"].startswith("complete")
    assert main(["extract", "--target", str(tiny_target), "--data", str(prepared), "--out", str(s), "--overwrite",
                 "--device", "cpu", "--shard-mb", "0.03", "--token-budget", "96"]) == 0


def test_a_symlinked_shard_is_called_a_link(clean, tmp_path):
    # item 13: a linked shard was refused with "5527587 bytes on disk, the manifest says 5527587".
    d = copy(clean, tmp_path / "s")
    shard = d / "shard-00001.safetensors"
    shard.rename(tmp_path / "elsewhere.safetensors")
    shard.symlink_to(tmp_path / "elsewhere.safetensors")
    first = json.loads((d / "manifest.json").read_text())["shards"][1]["first"]
    with pytest.raises(StoreError, match="is a symbolic link .*elsewhere.safetensors"):
        HiddenStateStore(d)[first]
