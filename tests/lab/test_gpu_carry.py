"""lab/gpu_carry.sh: parts split at any byte, joined in order on the other side, every item checked by sha256."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("split") is None, reason="needs coreutils")


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "lab").mkdir(parents=True)
    for f in ("gpu_carry.sh", "rows_of.sh"):
        shutil.copy(ROOT / "lab" / f, repo / "lab")
    return repo


def _run(repo: Path, stage: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "lab/gpu_carry.sh", stage], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, **env})


def test_pack_then_recv_out_of_order_restores_every_item(tmp_path):
    repo = _repo(tmp_path)
    items = {"alpha": os.urandom(1_500_000), "beta": os.urandom(700_000)}  # alpha spans parts 0-1, beta 1-2
    (tmp_path / "stage" / "items").mkdir(parents=True)
    for name, data in items.items():  # pre-built items: pack takes them as they are (no download)
        (tmp_path / "stage" / "items" / name).write_bytes(data)
    env = {"STAGE": str(tmp_path / "stage"), "ITEMS": "alpha beta", "PART_MB": "1", "CARRY_DIR": str(tmp_path / "c")}
    r = _run(repo, "pack", env)
    assert r.returncode == 0, r.stderr
    parts = sorted(p.name for p in (repo / ".carry").iterdir())
    assert parts == ["p0", "p1", "p2"]
    assert sum((repo / ".carry" / p / "part").stat().st_size for p in parts) == 2_200_000

    held = tmp_path / "held"
    held.mkdir()
    for p in ("p1", "p2"):  # the machine gets p0 first, then p2 before p1 (a part left over from an earlier call)
        shutil.move(repo / ".carry" / p, held / p)
    assert _run(repo, "recv", env).returncode == 0
    assert not (tmp_path / "c" / "items" / "alpha").exists()  # 1 of 1.5 MB so far
    shutil.move(held / "p2", repo / ".carry" / "p2")
    r = _run(repo, "recv", env)
    assert r.returncode == 0 and "part 2 arrived before part 1" in r.stderr
    assert not (tmp_path / "c" / "got.2").exists()  # not appended out of order
    shutil.move(held / "p1", repo / ".carry" / "p1")
    r = _run(repo, "recv", env)
    assert r.returncode == 0, r.stderr
    for name, data in items.items():
        assert (tmp_path / "c" / "items" / name).read_bytes() == data


def test_recv_names_a_damaged_item(tmp_path):
    repo = _repo(tmp_path)
    (tmp_path / "stage" / "items").mkdir(parents=True)
    (tmp_path / "stage" / "items" / "alpha").write_bytes(os.urandom(300_000))
    env = {"STAGE": str(tmp_path / "stage"), "ITEMS": "alpha", "PART_MB": "1", "CARRY_DIR": str(tmp_path / "c")}
    assert _run(repo, "pack", env).returncode == 0
    part = repo / ".carry" / "p0" / "part"
    data = bytearray(part.read_bytes())
    data[1000] ^= 0xFF
    part.write_bytes(bytes(data))
    r = _run(repo, "recv", env)
    assert r.returncode != 0 and "alpha: sha256 mismatch" in r.stderr
    assert not (tmp_path / "c" / "items" / "alpha").exists()


@pytest.mark.parametrize("n, text, kept", [
    ("2", '[{"a": 1}, {"b": 2}, {"c": 3}]', [{"a": 1}, {"b": 2}]),
    ("all", '[{"a": 1},\n {"b": 2}]', [{"a": 1}, {"b": 2}]),
    ("all", '[{"a": 1}, {"b": 2}, {"c": "cut he', [{"a": 1}, {"b": 2}]),   # as the packaged ShareGPT file ends
])
def test_json_head_copies_the_first_rows(n, text, kept):
    import json

    r = subprocess.run(["python3", str(ROOT / "lab" / "json_head.py"), n], input=text, capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout) == kept
    assert ("cut off" in r.stderr) == text.endswith("he")


def test_json_head_refuses_a_bad_row_inside_a_closed_array():
    r = subprocess.run(["python3", str(ROOT / "lab" / "json_head.py"), "all"], input='[{"a": 1}, {"b": }]',
                       capture_output=True, text=True)
    assert r.returncode != 0 and "JSONDecodeError" in r.stderr


def test_qwen_items_download_the_parts_eyas_joins():
    """The carry script's part lists are the built-in table's (bash cannot import it)."""
    import re

    from eyas.target.builtins import BUILTIN_TARGETS

    text = (ROOT / "lab" / "gpu_carry.sh").read_text()
    for item, name in (("qwen05", "qwen2.5-coder-0.5b"), ("qwen15", "qwen2.5-coder-1.5b")):
        parts = BUILTIN_TARGETS[name].parts
        fmt = re.sub(r"part\d+==", "part%g==", parts[0].requirement)
        assert f'seq -f "{fmt}" 1 {len(parts)}' in text, item
        assert [fmt.replace("%g", str(i)) for i in range(1, len(parts) + 1)] == [p.requirement for p in parts]


def test_an_item_staged_from_another_wheel_list_is_rebuilt_not_carried(tmp_path):
    """A staged item remembers what it was built from (.src); after its list changes, pack rebuilds it instead
    of carrying the stale one (here the rebuild itself fails: the name is no real item)."""
    repo = _repo(tmp_path)
    items = tmp_path / "stage" / "items"
    items.mkdir(parents=True)
    (items / "alpha").write_bytes(os.urandom(1000))
    env = {"STAGE": str(tmp_path / "stage"), "ITEMS": "alpha", "PART_MB": "1", "CARRY_DIR": str(tmp_path / "c")}
    assert _run(repo, "pack", env).returncode == 0
    assert (items / "alpha.src").read_text().strip()          # an item staged before .src existed gets one
    (items / "alpha.src").write_text("built-from-an-older-list\n")
    r = _run(repo, "pack", env)
    assert r.returncode == 2 and "alpha: its wheel list or pins changed since it was staged: rebuilding" in r.stderr
    assert "unknown item alpha" in r.stderr and not (items / "alpha").exists()


def test_the_rows_brought_back_travel_as_one_item_rebuilt_when_they_change(tmp_path):
    """Only rows.tgz of what `back` brought (draft.tar.NN: the rows and a 200 MB draft) travels."""
    import io
    import tarfile

    def parts(rows: bytes) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data in (("./draft-bf16.safetensors", b"w" * 3000), ("./rows.tgz", rows)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        blob = buf.getvalue()
        for k in range(0, len(blob), 2048):
            (back / f"draft.tar.{k // 2048:02d}").write_bytes(blob[k:k + 2048])

    repo = _repo(tmp_path)
    back = repo / ".carry" / "q15back"
    back.mkdir(parents=True)
    parts(b"rows-1")
    env = {"STAGE": str(tmp_path / "stage"), "ITEMS": "q15back", "PART_MB": "1"}
    assert _run(repo, "pack", env).returncode == 0
    item = tmp_path / "stage" / "items" / "q15back"
    assert item.read_bytes() == b"rows-1" and back.is_dir()   # pack clears the parts only, never what came back
    parts(b"rows-2")                                          # another session's rows: staged again
    r = _run(repo, "pack", env)
    assert r.returncode == 0 and "rebuilding" in r.stderr and item.read_bytes() == b"rows-2"
    for p in back.iterdir():
        p.unlink()
    r = _run(repo, "pack", {**env, "STAGE": str(tmp_path / "stage2")})
    assert r.returncode != 0 and "no .carry/q15back/draft.tar" in r.stderr


def test_rows_brought_back_apart_or_committed_to_git_travel_as_the_rows_item(tmp_path):
    """`back` now sends the rows first as rows.tgz.NN; a session that committed them names them as ROWS_GIT=REV:PATH
    (only git outlives a checkout) and pack takes the blob from git, rebuilt when the revision changes."""
    repo = _repo(tmp_path)
    back = repo / ".carry" / "q15back"
    back.mkdir(parents=True)
    (back / "draft.tar.00").write_bytes(b"not read for the rows")
    (back / "rows.tgz.00").write_bytes(b"rows-")
    (back / "rows.tgz.01").write_bytes(b"apart")
    env = {"STAGE": str(tmp_path / "stage"), "ITEMS": "q15back", "PART_MB": "1"}
    assert _run(repo, "pack", env).returncode == 0
    assert (tmp_path / "stage" / "items" / "q15back").read_bytes() == b"rows-apart"

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "rows.tgz").write_bytes(b"rows-in-git-1")
    subprocess.run([*git, "add", "rows.tgz"], check=True)
    subprocess.run([*git, "commit", "-qm", "rows"], check=True)
    env2 = {**env, "STAGE": str(tmp_path / "stage2"), "ROWS_GIT": "HEAD:rows.tgz"}
    r = _run(repo, "pack", env2)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "stage2" / "items" / "q15back").read_bytes() == b"rows-in-git-1"
    (repo / "rows.tgz").write_bytes(b"rows-in-git-2")
    subprocess.run([*git, "commit", "-qam", "more rows"], check=True)
    r = _run(repo, "pack", env2)
    assert r.returncode == 0 and "rebuilding" in r.stderr
    assert (tmp_path / "stage2" / "items" / "q15back").read_bytes() == b"rows-in-git-2"
    r = _run(repo, "pack", {**env2, "ROWS_GIT": "HEAD:no-such.tgz"})
    assert r.returncode != 0
