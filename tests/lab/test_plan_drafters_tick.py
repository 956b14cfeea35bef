"""lab/plan_drafters.sh tick: the data first, the recipe once the data succeeded and vLLM is in, and one more start
of the recipe (which resumes) when its first start ended with steps left."""

from functools import partial

from ticks import started

_tick = partial(started, "plan_drafters.sh")
ALL = ["eyas-deps", "model", "sharegpt", "vllm-deps", "vllm"]


def test_prep_starts_when_model_and_data_are_in(tmp_path):
    assert _tick(tmp_path, ["eyas-deps", "model"], {}) == []
    assert _tick(tmp_path / "b", ["eyas-deps", "model", "sharegpt"], {}) == ["prep"]


def test_recipe_needs_the_data_and_vllm(tmp_path):
    assert "drafters" not in _tick(tmp_path, ALL, {})
    assert "drafters" not in _tick(tmp_path / "b", ALL, {"prep": 1})
    assert "drafters" not in _tick(tmp_path / "c", ALL[:3], {"prep": 0})
    assert "drafters" in _tick(tmp_path / "d", ALL, {"prep": 0})


def test_recipe_with_steps_left_starts_again(tmp_path):
    assert "drafters2" not in _tick(tmp_path, ALL, {"prep": 0, "drafters": 0})
    assert "drafters2" not in _tick(tmp_path / "b", ALL, {"prep": 0, "drafters": 1})
    assert "drafters2" in _tick(tmp_path / "c", ALL, {"prep": 0, "drafters": 3})
