"""`eyas eval --warm-only` (compile and capture, decode nothing) and the background warm-up beside training
(decode/prewarm.py): started on the first draft a run writes after it began, never on an older one, with the
eval's own flags."""

import json
import os
import shutil
import time

import pytest
from conftest import write_eval_dirs

from eyas.cli import main
from eyas.decode.prewarm import Prewarm, cli_flags


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return write_eval_dirs(tmp_path_factory.mktemp("prewarm"))


def test_cli_flags():
    assert cli_flags({"per_category": 3, "tree": None, "json": True, "compile": False, "min_bucket": 1000000}) == \
        ["--per-category", "3", "--json", "--no-compile", "--min-bucket", "1000000"]


def test_warm_only_decodes_nothing(tiny_dirs, tmp_path, monkeypatch):
    """Every setting's warm-up runs (eager: nothing to compile) and no turn is decoded or timed."""
    from eyas.decode import session
    decoded = []
    monkeypatch.setattr(session, "ar_generate", lambda *a, **k: decoded.append(a) or ([], None))
    out = main(["eval", "--target", str(tiny_dirs / "target"), "--draft", str(tiny_dirs / "draft"), "--bench",
                str(tiny_dirs / "bench.jsonl"), "--device", "cpu", "--chain", "2", "--tree", "total=6,depth=3,topk=2",
                "--warm-only", "--out", str(tmp_path / "w.json")])
    w = json.loads((tmp_path / "w.json").read_text())
    assert out == 0 and w["warm_only"] and w["compiled"] is False and not decoded
    assert list(w["seconds"]) == ["chain-2", "tree(total=6,depth=3,topk=2)"]
    assert main(["eval", "--target", str(tiny_dirs / "target"), "--draft", str(tiny_dirs / "draft"), "--tree", "auto",
                 "--warm-only", "--device", "cpu"]) != 0


def test_prewarm_waits_for_a_new_draft_then_warms_it(tiny_dirs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_dirs / "draft", run)           # an earlier run's draft: never warmed
    old = time.time() - 60
    for f in run.iterdir():
        os.utime(f, (old, old))
    eval_kw = dict(target=str(tiny_dirs / "target"), bench=str(tiny_dirs / "bench.jsonl"), chain=2, device="cpu",
                   tree=None)
    pw = Prewarm(run, tmp_path / "warm", eval_kw, poll_s=0.05)
    time.sleep(0.5)
    assert pw.proc is None
    for f in run.iterdir():                            # the trainer writes its first best draft
        os.utime(f, None)
    for _ in range(200):
        if pw.proc is not None:
            break
        time.sleep(0.05)
    info = pw.finish(timeout=300)
    assert info["started"] and info["rc"] == 0 and not info["killed"], (tmp_path / "warm" / "eval-warm.log").read_text()
    assert info["warm"] == {"chain-2": pytest.approx(info["warm"]["chain-2"])}
    assert (tmp_path / "warm" / "draft" / "model.safetensors").is_file()


def test_prewarm_that_never_saw_a_draft_says_so(tmp_path):
    pw = Prewarm(tmp_path / "nothing", tmp_path / "warm", {}, poll_s=0.05)
    assert pw.finish(timeout=1) == {"started": False}


def test_prewarm_finish_without_waiting_stops_it(tiny_dirs, tmp_path):
    """A failed training must leave no warm-up running: finish(timeout=0) kills it."""
    run = tmp_path / "run"
    shutil.copytree(tiny_dirs / "draft", run)
    pw = Prewarm(run, tmp_path / "warm", dict(target=str(tiny_dirs / "target"), device="cpu"), poll_s=0.01)
    for f in run.iterdir():
        os.utime(f, (time.time() + 5, time.time() + 5))   # written after the watcher started
    for _ in range(500):
        if pw.proc is not None:
            break
        time.sleep(0.01)
    info = pw.finish(timeout=0)
    assert info["started"] and info["killed"] and pw.proc.poll() is not None
