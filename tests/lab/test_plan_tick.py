"""lab/plan_real_targets.sh tick: each lane starts once its inputs have arrived and the lanes it waits on ended."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUB = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
"""


def _tick(tmp_path: Path, installed: list[str], ended: dict[str, int]) -> list[str]:
    repo, carry, lanes = tmp_path / "repo", tmp_path / "carry", tmp_path / "lanes"
    for d in (repo / "lab", carry, lanes):
        d.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "lab" / "plan_real_targets.sh", repo / "lab")
    (repo / "lab" / "lanes.sh").write_text(STUB)   # records what would start; starts nothing
    for name in installed:
        (carry / f"installed.{name}").touch()
    for name, rc in ended.items():
        (lanes / f"{name}.rc").write_text(f"{rc}\n")
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    r = subprocess.run(["bash", "lab/plan_real_targets.sh", "tick", "0"], cwd=repo, capture_output=True, text=True,
                       env={**env, "CARRY_DIR": str(carry), "LANES_DIR": str(lanes), "CALLS": str(calls)})
    assert r.returncode == 0, r.stderr
    return [line.split()[1] for line in calls.read_text().splitlines() if line.startswith("start ")]


def test_nothing_arrived_starts_nothing(tmp_path):
    assert _tick(tmp_path, [], {}) == []


def test_lanes_start_as_their_items_arrive(tmp_path):
    assert _tick(tmp_path, ["eyas-deps", "model", "sharegpt"], {}) == ["gputests", "sgl_train"]
    assert _tick(tmp_path / "b", ["eyas-deps", "vllm-deps", "vllm", "qwen15"], {}) == ["gputests", "kimi", "convert"]


def test_sgl_check_waits_for_a_trained_draft(tmp_path):
    have = ["eyas-deps", "model", "sharegpt", "sglang"]
    assert "sgl_check" not in _tick(tmp_path, have, {})
    assert "sgl_check" not in _tick(tmp_path / "failed", have, {"sgl_train": 1})
    assert "sgl_check" in _tick(tmp_path / "ok", have, {"sgl_train": 0})


def test_timed_runs_only_after_every_other_lane_ended(tmp_path):
    have = ["eyas-deps", "vllm-deps", "vllm", "model", "sharegpt", "sglang", "qwen15"]
    before = {"gputests": 0, "sgl_train": 0, "kimi": 0, "convert": 0}
    assert "timed" not in _tick(tmp_path, have, before)
    assert "timed" in _tick(tmp_path / "all", have, {**before, "sgl_check": 0})
