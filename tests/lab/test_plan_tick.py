"""lab/plan_real_targets.sh tick: each lane starts once its inputs have arrived and the lanes it waits on ended."""

from functools import partial

from ticks import calls, started

_tick = partial(started, "plan_real_targets.sh")


def test_nothing_arrived_starts_nothing(tmp_path):
    assert _tick(tmp_path, [], {}) == []


def test_lanes_start_as_their_items_arrive(tmp_path):
    assert _tick(tmp_path, ["eyas-deps", "model", "sharegpt"], {}) == ["gputests", "sgl_train"]
    assert _tick(tmp_path / "b", ["eyas-deps", "vllm-deps", "vllm", "qwen15"], {}) == ["gputests", "convert", "kimi"]
    assert _tick(tmp_path / "c", ["eyas-deps", "vllm-deps", "vllm", "qwen15"], {}, env={"KIMI_FIRST": "1"}) == \
        ["gputests", "convert", "kimi"]


def test_sgl_check_runs_only_when_asked_and_waits_for_a_trained_draft(tmp_path):
    have = ["eyas-deps", "model", "sharegpt", "sglang"]
    asked = {"SGL_CHECK": "1"}
    assert "sgl_check" not in _tick(tmp_path / "not-asked", have, {"sgl_train": 0})
    assert "sgl_check" not in _tick(tmp_path, have, {}, env=asked)
    assert "sgl_check" not in _tick(tmp_path / "failed", have, {"sgl_train": 1}, env=asked)
    assert "sgl_check" in _tick(tmp_path / "ok", have, {"sgl_train": 0}, env=asked)


def test_timed_runs_alone_kimi_stopped_meanwhile_and_resumed_after(tmp_path):
    """kimi starts with vLLM's parts; once gputests, convert and a trained draft are done, a running kimi is
    stopped and timed starts alone; kimi starts again (resuming) once timed ended, or at once when the draft
    failed (timed cannot run). KIMI_FIRST=1: timed after kimi, which is never stopped."""
    have = ["eyas-deps", "vllm-deps", "vllm", "model", "sharegpt", "sglang", "qwen15"]
    before = {"gputests": 0, "sgl_train": 0, "convert": 0}
    for lane in before:
        assert "timed" not in _tick(tmp_path / f"no-{lane}", have, {k: v for k, v in before.items() if k != lane})
    assert "kimi" in _tick(tmp_path / "early", have, {"gputests": 0})           # the carry's minutes
    assert "timed" not in _tick(tmp_path / "no-draft", have, {**before, "sgl_train": 1})
    assert "kimi" in _tick(tmp_path / "no-draft-kimi", have, {**before, "sgl_train": 1})
    asked = calls("plan_real_targets.sh", tmp_path / "ready", have, before, running=("kimi",))
    assert asked.index("stop:kimi") < asked.index("timed") and "kimi" not in asked
    assert "stop:kimi" not in calls("plan_real_targets.sh", tmp_path / "ready-idle", have, before)
    assert "kimi" in _tick(tmp_path / "after", have, {**before, "timed": 0})
    assert "timed" not in _tick(tmp_path / "after-timed", have, {**before, "timed": 0})
    sgl = {"SGL_CHECK": "1"}   # a requested sgl_check runs first
    assert "timed" not in _tick(tmp_path / "asked", have, before, env=sgl)
    assert "timed" in _tick(tmp_path / "asked-done", have, {**before, "sgl_check": 0}, env=sgl)
    first = {"KIMI_FIRST": "1"}
    assert "timed" not in _tick(tmp_path / "kimi-first", have, before, env=first)
    assert "stop:kimi" not in calls("plan_real_targets.sh", tmp_path / "kimi-first-running", have, before,
                                    env=first, running=("kimi",))
    assert "timed" in _tick(tmp_path / "kimi-first-done", have, {**before, "kimi": 0}, env=first)


def test_no_q15_lets_timed_run_without_the_1p5b(tmp_path):
    """NO_Q15=1 (a short session carries p0-p10 only): timed needs no 1.5B parts nor its conversion."""
    have = ["eyas-deps", "vllm-deps", "vllm", "model", "sharegpt", "sglang"]
    done = {"gputests": 0, "sgl_train": 0}
    assert "timed" not in _tick(tmp_path / "default", have, done)
    assert "timed" in _tick(tmp_path / "short", have, done, env={"NO_Q15": "1"})
    assert "timed" not in _tick(tmp_path / "short-no-draft", have, {**done, "sgl_train": 1}, env={"NO_Q15": "1"})


def test_skipped_lanes_never_start_and_count_as_ended(tmp_path):
    have = ["eyas-deps", "vllm-deps", "vllm", "model", "sharegpt", "sglang"]
    short = {"NO_Q15": "1", "SKIP": "kimi gputests"}
    assert _tick(tmp_path / "carry", have, {}, env=short) == ["sgl_train"]
    assert "timed" in _tick(tmp_path / "ready", have, {"sgl_train": 0}, env=short)
    assert "kimi" not in _tick(tmp_path / "after", have, {"sgl_train": 0, "timed": 0}, env=short)


def test_the_kimi_first_short_form_waits_for_kimi_only(tmp_path):
    """`KIMI_FIRST=1 NO_Q15=1 SKIP="gputests convert"` (p0-p10: the Kimi toy's vLLM steps, then a subset of timed):
    timed waits for kimi and a trained draft, not for the skipped lanes or the 1.5B."""
    have = ["eyas-deps", "vllm-deps", "vllm", "model", "sharegpt", "sglang"]
    env = {"KIMI_FIRST": "1", "NO_Q15": "1", "SKIP": "gputests convert"}
    assert _tick(tmp_path / "start", have, {}, env=env) == ["sgl_train", "kimi"]
    assert "timed" not in _tick(tmp_path / "kimi-running", have, {"sgl_train": 0}, env=env)
    assert "timed" in _tick(tmp_path / "kimi-done", have, {"sgl_train": 0, "kimi": 0}, env=env)
    assert "timed" in _tick(tmp_path / "kimi-failed", have, {"sgl_train": 0, "kimi": 1}, env=env)
