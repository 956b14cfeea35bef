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


Q15 = ["eyas-deps", "q15draft", "qwen15"]


def test_a_pack_holding_the_15b_draft_runs_the_15b_comparison_alone(tmp_path):
    """C15: the brought-back EAGLE-3 draft and its rows (item q15draft) and the 1.5B: their prep (the draft seeded as
    eagle3's run) once all three are in, then the recipe; never SmolLM2's lanes; one more start after a budget cut."""
    assert _tick(tmp_path / "a", ["eyas-deps", "q15draft"], {}, carried=("qwen15",)) == []
    assert _tick(tmp_path / "b", Q15, {}) == ["prep15"]
    assert "drafters15" not in _tick(tmp_path / "c", Q15, {"prep15": 1})
    assert _tick(tmp_path / "d", Q15, {"prep15": 0}) == ["prep15", "drafters15"]
    assert "drafters15b" in _tick(tmp_path / "e", Q15, {"prep15": 0, "drafters15": 3})
    assert "drafters15b" not in _tick(tmp_path / "f", Q15, {"prep15": 0, "drafters15": 0})
