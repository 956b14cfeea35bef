"""lab/plan_two_gpus.sh tick: the 8B-shape multi-GPU bench starts with eyas's deps, the 1.5B's online DDP bench
after it once the 1.5B and ShareGPT are in, the Kimi toy's tensor-parallel run last once vLLM is in: one lane at a
time, since each wants both GPUs."""

from functools import partial

from ticks import started

_tick = partial(started, "plan_two_gpus.sh")

ALL = ["eyas-deps", "sharegpt", "qwen15", "vllm-deps", "vllm"]


def test_mgpu8b_starts_with_eyas_deps(tmp_path):
    assert _tick(tmp_path, [], {}) == []
    assert _tick(tmp_path / "b", ["eyas-deps"], {}) == ["mgpu8b"]


def test_each_lane_waits_for_its_items_and_the_lane_before(tmp_path):
    assert "online" not in _tick(tmp_path / "a", ALL, {})                       # mgpu8b still running
    assert "online" not in _tick(tmp_path / "b", ["eyas-deps", "sharegpt"], {"mgpu8b": 0})
    assert "online" in _tick(tmp_path / "c", ["eyas-deps", "sharegpt", "qwen15"], {"mgpu8b": 1})   # ended, failed
    assert "kimi2" not in _tick(tmp_path / "d", ALL, {"mgpu8b": 0})              # online not ended
    assert "kimi2" not in _tick(tmp_path / "e", ["eyas-deps", "sharegpt", "qwen15"], {"mgpu8b": 0, "online": 0})
    assert "kimi2" in _tick(tmp_path / "f", ALL, {"mgpu8b": 0, "online": 2})
