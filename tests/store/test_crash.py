"""kill -9 at chosen moments of a real `eyas extract` subprocess, restart, and check the store.

The writer pauses at a named point when EYAS_STORE_PAUSE_AT is set (it announces itself in the file
EYAS_STORE_PAUSE_MARK); the test then SIGKILLs the process there. After each kill a restart must
finish the store with every sample exactly once and byte-identical shards to an uninterrupted run.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from eyas.store import HiddenStateStore, verify_store
from eyas.extract import ExtractConfig, run

FLAGS = ["--shard-mb", "0.03", "--token-budget", "96", "--writer-threads", "1"]


def _cmd(target, data, out):
    return [sys.executable, "-m", "eyas.cli", "extract", "--target", str(target), "--data", str(data),
            "--out", str(out), *FLAGS]


def kill_at(point, cmd, tmp_path):
    mark = tmp_path / f"mark-{point}"
    env = {**os.environ, "EYAS_STORE_PAUSE_AT": point, "EYAS_STORE_PAUSE_MARK": str(mark)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while not mark.exists():
        if proc.poll() is not None:
            pytest.fail(f"extract exited (rc {proc.returncode}) before reaching {point}: {proc.stderr.read()[-2000:]}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"extract never reached {point}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()


def _check_against_clean_run(out, clean):
    assert verify_store(out) == []
    got, want = (json.loads((d / "manifest.json").read_text()) for d in (out, clean))
    assert [s["sha256"] for s in got["shards"]] == [s["sha256"] for s in want["shards"]]
    store = HiddenStateStore(out)
    assert [int(store[i]["input_ids"].numel()) for i in range(len(store))] == \
        [int(HiddenStateStore(clean)[i]["input_ids"].numel()) for i in range(len(store))]
    entries = [e["shard"] for p in out.glob("rank-*.json") for e in json.loads(p.read_text())["shards"]]
    assert len(entries) == len(set(entries)), "a shard was recorded twice"
    assert not list(out.glob("*.tmp"))


def _sweep(points, tiny_target, prepared, tmp_path):
    clean = tmp_path / "clean"
    run(ExtractConfig(target=str(tiny_target), data=prepared, out=clean, shard_mb=0.03, token_budget=96,
                      writer_threads=1))
    out = tmp_path / "killed"
    for point in points:
        kill_at(point, _cmd(tiny_target, prepared, out), tmp_path)
        assert not (out / "manifest.json").exists()
    done = subprocess.run(_cmd(tiny_target, prepared, out), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["merged"]
    _check_against_clean_run(out, clean)


def test_kill9_mid_write_and_between_shards(tiny_target, prepared, tmp_path):
    # A half-written temp file, then a kill right after a shard was recorded.
    _sweep(["shard-partial", "rank-manifest-written"], tiny_target, prepared, tmp_path)


@pytest.mark.slow
def test_kill9_at_every_point(tiny_target, prepared, tmp_path):
    _sweep(["shard-partial", "shard-before-rename", "shard-renamed", "rank-manifest-written", "before-merge"],
           tiny_target, prepared, tmp_path)


@pytest.mark.slow
def test_two_concurrent_ranks_merge(tiny_target, prepared, tmp_path):
    # torchrun's environment without torchrun: ranks share nothing but the directory.
    clean = tmp_path / "clean"
    run(ExtractConfig(target=str(tiny_target), data=prepared, out=clean, shard_mb=0.03, token_budget=96))
    out = tmp_path / "ranks"
    procs = [subprocess.Popen(_cmd(tiny_target, prepared, out), env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2",
                                                                     "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    results = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in results]
    assert any(json.loads(o)["merged"] for o, _ in results)
    _check_against_clean_run(out, clean)
