"""lab/plan_real_targets.sh tick: each lane starts once its inputs have arrived and the lanes it waits on ended."""

from functools import partial

from ticks import started

_tick = partial(started, "plan_real_targets.sh")


def test_nothing_arrived_starts_nothing(tmp_path):
    assert _tick(tmp_path, [], {}) == []


def test_lanes_start_as_their_items_arrive(tmp_path):
    assert _tick(tmp_path, ["eyas-deps", "model", "sharegpt"], {}) == ["gputests", "sgl_train"]
    assert _tick(tmp_path / "b", ["eyas-deps", "vllm-deps", "vllm", "qwen15"], {}) == ["gputests", "kimi", "convert"]


def test_sgl_check_runs_only_when_asked_and_waits_for_a_trained_draft(tmp_path):
    have = ["eyas-deps", "model", "sharegpt", "sglang"]
    asked = {"SGL_CHECK": "1"}
    assert "sgl_check" not in _tick(tmp_path / "not-asked", have, {"sgl_train": 0})
    assert "sgl_check" not in _tick(tmp_path, have, {}, env=asked)
    assert "sgl_check" not in _tick(tmp_path / "failed", have, {"sgl_train": 1}, env=asked)
    assert "sgl_check" in _tick(tmp_path / "ok", have, {"sgl_train": 0}, env=asked)


def test_timed_runs_only_after_every_other_lane_ended(tmp_path):
    have = ["eyas-deps", "vllm-deps", "vllm", "model", "sharegpt", "sglang", "qwen15"]
    before = {"gputests": 0, "sgl_train": 0, "kimi": 0, "convert": 0}
    for lane in before:
        assert "timed" not in _tick(tmp_path / f"no-{lane}", have, {k: v for k, v in before.items() if k != lane})
    assert "timed" not in _tick(tmp_path / "no-draft", have, {**before, "sgl_train": 1})
    assert "timed" in _tick(tmp_path / "all", have, before)
    asked = {"SGL_CHECK": "1"}   # a requested sgl_check runs first
    assert "timed" not in _tick(tmp_path / "asked", have, before, env=asked)
    assert "timed" in _tick(tmp_path / "asked-done", have, {**before, "sgl_check": 0}, env=asked)
