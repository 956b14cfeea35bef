"""lab/keep_rows.sh: rows brought home go into git history (the one thing a new checkout keeps) and out of the tree
(every tracked file travels with every device call); lab/ROWS names them for gpu_carry.sh's ROWS_GIT."""

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t"}


def _rows_parts(d: Path, n_rows: int, part: int = 700) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in (("self.jsonl", "".join(f'{{"i": {i}}}\n' for i in range(n_rows)).encode()),
                           ("self.jsonl.eyas-output.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    d.mkdir(parents=True)
    for k in range(0, len(blob), part):
        (d / f"rows.tgz.{k // part:02d}").write_bytes(blob[k:k + part])
    return blob


def _sh(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "lab/keep_rows.sh", *args], cwd=repo, capture_output=True, text=True, env=ENV)


def test_rows_are_kept_in_history_out_of_the_tree_and_named_for_the_next_pack(tmp_path):
    repo = tmp_path / "repo"
    (repo / "lab").mkdir(parents=True)
    for f in ("keep_rows.sh", "gpu_carry.sh"):
        shutil.copy(ROOT / "lab" / f, repo / "lab")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=ENV)
    subprocess.run(["git", "add", "."], cwd=repo, check=True, env=ENV)
    subprocess.run(["git", "commit", "-qm", "init"], cwd=repo, check=True, env=ENV)
    assert _sh(repo, "latest").returncode == 2                      # nothing kept yet: one line, not a guess
    blob = _rows_parts(tmp_path / "back", 300)
    r = _sh(repo, "q15-test", str(tmp_path / "back"))
    assert r.returncode == 0, r.stderr
    assert "kept 300 rows" in r.stdout
    assert not (repo / "bench" / "data" / "q15-test-rows.tgz").exists()    # out of the tree
    spec = _sh(repo, "latest").stdout.strip()
    assert spec.endswith(":bench/data/q15-test-rows.tgz") and spec == _sh(repo, "latest", "q15-test").stdout.strip()
    shown = subprocess.run(["git", "show", spec], cwd=repo, capture_output=True, check=True).stdout
    assert shown == blob
    log = subprocess.run(["git", "log", "--format=%s"], cwd=repo, capture_output=True, text=True).stdout
    assert log.count("rows: q15-test") == 2
    # the next pack takes them from there
    env = {**ENV, "STAGE": str(tmp_path / "stage"), "ITEMS": "q15back", "PART_MB": "1", "ROWS_GIT": spec}
    r = subprocess.run(["bash", "lab/gpu_carry.sh", "pack"], cwd=repo, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "stage" / "items" / "q15back").read_bytes() == blob


def test_parts_that_do_not_join_are_refused_and_nothing_is_committed(tmp_path):
    repo = tmp_path / "repo"
    (repo / "lab").mkdir(parents=True)
    shutil.copy(ROOT / "lab" / "keep_rows.sh", repo / "lab")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=ENV)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "init"], cwd=repo, check=True, env=ENV)
    _rows_parts(tmp_path / "back", 300)
    (tmp_path / "back" / "rows.tgz.00").unlink()                    # a part missing
    r = _sh(repo, "q15-test", str(tmp_path / "back"))
    assert r.returncode == 2 and "do not join" in r.stderr
    assert not (repo / "bench" / "data" / "q15-test-rows.tgz").exists()
    log = subprocess.run(["git", "log", "--format=%s"], cwd=repo, capture_output=True, text=True).stdout
    assert log.strip() == "init"
