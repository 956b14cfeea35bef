"""lab/plan_q15_draft.sh tick: the recipe starts once the 1.5B is in, the served lane after it ended (with vLLM in,
where the pack carries it), and the draft comes back alone, 4 parts a call, after the served lane ended (at once in a
pack without vLLM)."""

from functools import partial

from ticks import calls

_tick = partial(calls, "plan_q15_draft.sh")


def test_recipe_starts_when_the_target_is_in(tmp_path):
    assert _tick(tmp_path, ["eyas-deps"], {}) == ["wait"]
    assert _tick(tmp_path / "b", ["eyas-deps", "qwen15"], {}) == ["scaling", "wait"]


def test_served_waits_for_vllm_and_the_recipe(tmp_path):
    assert "served" not in _tick(tmp_path, ["eyas-deps", "qwen15", "vllm-deps", "vllm"], {})
    assert "served" not in _tick(tmp_path / "b", ["eyas-deps", "qwen15"], {"scaling": 0}, carried=("vllm-deps", "vllm"))
    assert "served" in _tick(tmp_path / "c", ["eyas-deps", "qwen15", "vllm-deps", "vllm"], {"scaling": 3})
    # a pack without vLLM (B4): the evals alone once the recipe ended
    assert "served" in _tick(tmp_path / "d", ["eyas-deps", "qwen15"], {"scaling": 0})


def test_back_goes_alone_once_served_ended(tmp_path):
    have, done = ["eyas-deps", "qwen15", "vllm-deps", "vllm"], {"scaling": 0, "served": 0, "kimi_ar": 0}
    out = tmp_path / "out"
    out.mkdir()
    # `back` (here failing at once: no GPU machine's files) replaces the wait that would pack lanes.tgz beside it
    assert "wait" not in _tick(tmp_path / "a", have, done, out=out)
    assert "wait" in _tick(tmp_path / "b", have, done)              # no OUT: nothing can come back
    assert "wait" in _tick(tmp_path / "c", have, {"scaling": 0}, out=out)


def test_the_kimi_control_starts_after_the_timed_lane_unless_left_out(tmp_path):
    have = ["eyas-deps", "qwen15", "vllm-deps", "vllm"]
    assert "kimi_ar" not in _tick(tmp_path, have, {})
    assert "kimi_ar" not in _tick(tmp_path / "b", have, {"scaling": 0}, running=("served",))
    assert "kimi_ar" in _tick(tmp_path / "c", have, {"scaling": 0, "served": 0})
    assert "kimi_ar" not in _tick(tmp_path / "d", have, {"scaling": 0, "served": 0}, env={"KIMI_AR": "0"})


def test_a_pack_holding_the_rows_brought_back_starts_the_recipe_only_once_they_are_in(tmp_path):
    """B2: scaling resumes from an earlier session's rows (item q15back); started before them, it would write anew."""
    assert "scaling" not in _tick(tmp_path / "a", ["eyas-deps", "qwen15"], {}, carried=("q15back",))
    assert "scaling" in _tick(tmp_path / "b", ["eyas-deps", "qwen15", "q15back"], {})


def test_without_vllm_the_rows_and_draft_come_back_once_the_recipe_ended(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    have = ["eyas-deps", "q15back", "qwen15"]
    assert "wait" in _tick(tmp_path / "a", have, {}, out=out, running=("scaling",))
    assert "wait" not in _tick(tmp_path / "b", have, {"scaling": 0}, out=out)            # back, alone
    # with vLLM in the pack, back waits for served
    assert "wait" in _tick(tmp_path / "c", have, {"scaling": 0}, out=out, carried=("vllm-deps", "vllm"))


def test_a_pack_holding_a_draft_serves_it_and_trains_nothing(tmp_path):
    """B3: item q15draft (a draft brought back): no recipe; served once vLLM and the draft are in; nothing to send
    back afterwards."""
    full = ["eyas-deps", "q15draft", "qwen15", "vllm-deps", "vllm"]
    assert _tick(tmp_path / "a", ["eyas-deps", "q15draft", "qwen15"], {}, carried=("vllm-deps", "vllm")) == ["wait"]
    assert _tick(tmp_path / "b", full, {}) == ["served", "wait"]
    out = tmp_path / "out"
    out.mkdir()
    assert "wait" in _tick(tmp_path / "c", full, {"served": 0}, out=out, env={"KIMI_AR": "0"})   # no back


def test_a_pack_holding_sharegpt_runs_the_demo_alone(tmp_path):
    """E: ShareGPT in the pack (and no rows or draft brought back): the demo on the 1.5B once its inputs are in, no
    recipe beside it, nothing sent back after it."""
    assert _tick(tmp_path / "a", ["eyas-deps", "qwen15"], {}, carried=("sharegpt",)) == ["wait"]
    assert _tick(tmp_path / "b", ["eyas-deps", "qwen15", "sharegpt"], {}) == ["demo", "wait"]
    out = tmp_path / "out"
    out.mkdir()
    assert "wait" in _tick(tmp_path / "c", ["eyas-deps", "qwen15", "sharegpt"], {"demo": 0}, out=out)


def test_warm_mode_continues_the_brought_back_draft_and_sends_the_new_one_home(tmp_path):
    """B4w: item q15draft with SCALE_WARM=1 (no vLLM): the recipe (continuing that draft) once it and the 1.5B are in;
    once it ended, the new draft comes back while `served` times it alone (its evals only: no vLLM in the pack)."""
    have, warm = ["eyas-deps", "q15draft", "qwen15"], {"SCALE_WARM": "1"}
    assert _tick(tmp_path / "a", have[:2], {}, carried=("qwen15",), env=warm) == ["wait"]
    assert _tick(tmp_path / "b", have, {}, env=warm) == ["scaling", "wait"]
    assert "scaling" not in _tick(tmp_path / "c", have, {})                       # without the knob: B3's pack
    out = tmp_path / "out"
    out.mkdir()
    d = _tick(tmp_path / "d", have, {"scaling": 0}, out=out, env=warm)
    assert "served" in d and "wait" not in d                                       # served, then back alone
    assert "served" not in _tick(tmp_path / "e", have, {}, env=warm, running=("scaling",))
