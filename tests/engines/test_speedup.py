"""The speedup sweep's waves: engines that size their memory from what is free when they load (SGLang) start one
by one within a wave; engines with an explicit KV size each (vLLM) start side by side."""

from __future__ import annotations

import os
import sys
import threading
import time

import eyas.engines.speedup as sweep
from eyas.engines.sglang import SglangAdapter
from eyas.engines.vllm import VllmAdapter


def record_waves(monkeypatch, fail: str | None = None) -> list[tuple[str, str]]:
    """A stand-in worker: it takes a moment to come up, says so at the barrier and waits for its wave there."""
    events, lock = [], threading.Lock()

    def note(what, name):
        with lock:
            events.append((what, name))

    def fake_worker(python, worker, payload, **_):
        b = payload["barrier"]
        note("start", b["name"])
        time.sleep(0.3)
        if b["name"] == fail:
            raise RuntimeError("its engine died while loading")
        note("up", b["name"])
        open(os.path.join(b["dir"], f"{b['name']}.ready"), "w").close()
        while len({os.path.splitext(f)[0] for f in os.listdir(b["dir"])}) < b["count"]:
            time.sleep(0.05)
        return {"runs": [], "version": "x"}

    monkeypatch.setattr(sweep, "run_in_env", fake_worker)
    monkeypatch.setattr(sweep, "engine_path", lambda t: t)
    return events


def run(adapter, monkeypatch, tmp_path, n: int):
    monkeypatch.setattr(type(adapter), "share_memory", lambda self, jobs, *a: {j: {} for j in jobs})
    return sweep.measure(adapter, "/t", "/x", [[1]], [2, 3], [1], 4, ["0"], tmp_path / "logs", engines_per_gpu=n)


def test_sglang_engines_sharing_a_gpu_start_one_after_another(tmp_path, monkeypatch):
    events = record_waves(monkeypatch)
    res = run(SglangAdapter(sys.executable), monkeypatch, tmp_path, 3)
    assert not res["failed"]
    assert events == [("start", "base"), ("up", "base"), ("start", "k2"), ("up", "k2"), ("start", "k3"), ("up", "k3")]


def test_a_failed_start_lets_the_next_engine_of_the_wave_start(tmp_path, monkeypatch):
    events = record_waves(monkeypatch, fail="k2")
    res = run(SglangAdapter(sys.executable), monkeypatch, tmp_path, 3)
    assert list(res["failed"]) == ["k2"] and set(res["engines"]) == {"base", "k2", "k3"}
    assert events == [("start", "base"), ("up", "base"), ("start", "k2"), ("start", "k3"), ("up", "k3")]


def test_vllm_engines_with_their_own_kv_size_start_side_by_side(tmp_path, monkeypatch):
    events = record_waves(monkeypatch)
    run(VllmAdapter(sys.executable), monkeypatch, tmp_path, 3)
    assert [w for w, _ in events[:3]] == ["start"] * 3  # every engine of the wave starts before any is up
