"""bench/kimi_toy.py's bookkeeping on CPU: the build step, the state that lets a re-run continue, the time budget."""

import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_build_step_then_budget_leaves_the_rest_for_the_next_call(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import kimi_toy

    args = ["--python", "/no/vllm/needed", "--work", str(tmp_path / "w"), "--toys", "kimi-k2.5", "--size", "tiny",
            "--device", "cpu", "--rows", "3", "--eval-prompts", "2"]
    assert kimi_toy.main([*args, "--out", str(tmp_path / "a.json"), "--steps", "build"]) == 0
    first = json.loads((tmp_path / "a.json").read_text())
    built = first["results"]["kimi-k2.5"]["build"]
    assert first["complete"] and built["toy"] == "kimi-k2.5" and built["size"] == "tiny"
    chats = (tmp_path / "w" / "kimi-k2.5" / "chats.jsonl").read_text().splitlines()
    bench = [json.loads(x) for x in (tmp_path / "w" / "kimi-k2.5" / "bench.jsonl").read_text().splitlines()]
    assert len(chats) == 3 and len(bench) == 2 and bench[0]["turns"][0] not in "".join(chats)
    # a later call with no time left starts nothing, keeps the finished build and lists what is left
    assert kimi_toy.main([*args, "--out", str(tmp_path / "b.json"), "--budget-s", "0",
                          "--steps", "build", "prepare"]) == 3
    second = json.loads((tmp_path / "b.json").read_text())
    assert second["left"] == ["kimi-k2.5:prepare"] and second["results"]["kimi-k2.5"]["build"] == built


def test_last_json_takes_the_summary_a_command_prints_last(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from kimi_toy import last_json

    assert last_json('progress {"a": 1}\nmore\n{"b": {"c": [1, 2]}}\n') == {"b": {"c": [1, 2]}}
    assert last_json("no json here") is None


@pytest.mark.parametrize("ep, dtype, torch_dtype", [(True, "bf16", "bfloat16"), (False, "fp32", "float32")])
def test_vllm_ar_asks_the_engine_for_plain_greedy_on_serve_checks_prompts(tmp_path, monkeypatch, ep, dtype,
                                                                          torch_dtype):
    # vLLM's own AR through the engine interface (no draft), sharded like serve-check when --tp > 1 (experts split
    # unless --no-ep), once for both drafts (serve-check gives both the same prompts)
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import kimi_toy

    sent = []

    def fake_worker(python, worker, payload, **kw):
        sent.append((payload, kw))
        alone = payload["engine"]["kwargs"].get("max_num_seqs") == 1   # the lone AR parts from the batched one
        return {"outputs": [[5, 6, 7], [8, 4, 4] if alone else [8, 9, 9]], "version": "0.26.0", "startup_s": 1.5,
                "generate_s": 0.1, "counters": {}}

    monkeypatch.setattr("eyas.engines.base.run_in_env", fake_worker)
    ns = type("A", (), {"work": str(tmp_path), "python": str(Path(sys.executable)), "new_tokens": 3, "tp": 2,
                        "ep": ep, "vllm_memory": 0.15, "vllm_timeout_s": 300.0, "check_dtype": dtype})()
    r = kimi_toy.Run(ns, "kimi-k2.5")
    for mode, served in (("offline", [[5, 6, 7], [8, 9, 4]]), ("online", [[5, 6, 7], [8, 9, 9]])):
        (r.dir / f"serve-{mode}.json").write_text(json.dumps({"prompt_ids": [[1, 2], [3]], "served_outputs": served}))
    res = kimi_toy.vllm_ar(r)
    (payload, kw), (alone, _) = sent   # one batched engine for both drafts, then one sequence at a time
    kwargs = payload["engine"]["kwargs"]
    assert "max_num_seqs" not in kwargs and alone["engine"]["kwargs"]["max_num_seqs"] == 1
    assert {k: v for k, v in alone["engine"]["kwargs"].items() if k != "max_num_seqs"} == kwargs
    assert payload["prompts"] == [[1, 2], [3]] and payload["max_tokens"] == 3 and payload["engine"]["draft"] is None
    assert kwargs["model"] == str(r.target) and kwargs["dtype"] == torch_dtype and "speculative_config" not in kwargs
    assert kwargs["tensor_parallel_size"] == 2 and kwargs.get("enable_expert_parallel", False) is ep
    assert kwargs["gpu_memory_utilization"] == 0.15 and kwargs["enforce_eager"] is True and kw["timeout"] == 300.0
    assert res["offline"] == {"identical_to_vllm_ar": "1/2", "first_difference": [None, 2],
                              "identical_to_vllm_ar_alone": "1/2"}
    assert res["online"] == {"identical_to_vllm_ar": "2/2", "first_difference": [None, None],
                             "identical_to_vllm_ar_alone": "1/2"}
    assert res["ar_alone_vs_batched"] == {"identical": "1/2", "first_difference": [None, 1]}
    assert res["dtype"] == dtype
    assert res["vllm_startup_s"] == 1.5


def test_vllm_start_falls_back_to_text_only_when_the_full_engine_hangs(tmp_path, monkeypatch):
    """A start-up with every modality on that outlives its bound -> one text-only start; that one up, the toy's
    vLLM steps ask for text-only engines (regenerate, extract, serve-check, vLLM AR). Neither up: the step fails."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import kimi_toy

    from eyas.engines.base import EngineError

    sent, hangs = [], {"full"}

    def fake_worker(python, worker, payload, **kw):
        text_only = payload["engine"]["kwargs"].get("language_model_only", False)
        sent.append((text_only, kw["timeout"]))
        if ("text_only" if text_only else "full") in hangs:
            raise EngineError("vllm_serve_worker.py did not finish within 240s; 3 process(es) in its session")
        return {"outputs": [[5] * 8], "version": "0.26.0", "startup_s": 2.5, "generate_s": 0.1, "counters": {}}

    monkeypatch.setattr("eyas.engines.base.run_in_env", fake_worker)
    ns = type("A", (), {"work": str(tmp_path), "python": str(Path(sys.executable)), "tp": 1, "vllm_memory": 0.15,
                        "start_timeout_s": 240.0})()
    r = kimi_toy.Run(ns, "kimi-k2.5")
    res = kimi_toy.vllm_start(r)
    assert sent == [(False, 240.0), (True, 240.0)]
    assert res["full"]["up"] is False and "did not finish" in res["full"]["error"]
    assert res["text_only_start"] == {"up": True, "startup_s": 2.5, "wall_s": res["text_only_start"]["wall_s"]}
    assert res["text_only"] is True and r.text_only() and r.text_only_flag() == ["--text-only"]
    hangs.clear()   # a re-run whose full engine comes up: the marker goes, the steps use the full engine
    sent.clear()
    res = kimi_toy.vllm_start(r)
    assert sent == [(False, 240.0)] and res["text_only"] is False and not r.text_only()
    hangs.update({"full", "text_only"})
    with pytest.raises(kimi_toy.StepError, match="with every modality on nor text-only"):
        kimi_toy.vllm_start(r)


def _fake_steps(monkeypatch, kimi_toy, calls, fail=(), slow=0.2):
    """Every step a stand-in that records when it ran (and fails where asked)."""
    def action(step):
        def run(r):
            t0 = time.monotonic()
            time.sleep(slow)
            calls.append((r.toy, step, t0, time.monotonic()))
            if (r.toy, step) in fail:
                raise RuntimeError(f"{step} broke")
            return {"ok": True}
        return run

    monkeypatch.setattr(kimi_toy, "ACTIONS", {s: action(s) for s in kimi_toy.STEPS})


def test_steps_run_after_what_they_need_both_toys_side_by_side_and_a_failure_stops_only_its_followers(
        tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import kimi_toy

    calls = []
    _fake_steps(monkeypatch, kimi_toy, calls, fail={("llava-llama", "train_online")})
    # workers enough for every ready step of both toys: with fewer, which independent steps overlap is the
    # scheduler's order (with 4, kimi's regen_hf once waited for vllm_start's worker and the overlap check failed)
    args = ["--python", "/no/vllm/needed", "--work", str(tmp_path / "w"), "--device", "cpu", "--workers", "16",
            "--out", str(tmp_path / "a.json")]
    assert kimi_toy.main(args) == 3
    doc = json.loads((tmp_path / "a.json").read_text())
    ran = {(toy, s): (a, b) for toy, s, a, b in calls}
    for (toy, s), (start, _) in ran.items():
        for need in kimi_toy.NEEDS[s]:
            assert ran[(toy, need)][1] <= start, f"{toy}:{s} started before {need} ended"
    # the two toys' builds ran at the same time, and so did independent steps of one toy
    (a0, a1), (b0, b1) = ran[("kimi-k2.5", "build")], ran[("llava-llama", "build")]
    assert a0 < b1 and b0 < a1
    (c0, c1), (d0, d1) = ran[("kimi-k2.5", "regen_hf")], ran[("kimi-k2.5", "vllm_start")]
    assert c0 < d1 and d0 < c1
    # the llava toy's online training failed: its export, serve and vLLM AR wait for a re-run, the rest went on
    assert doc["left"] == ["llava-llama:train_online", "llava-llama:export_online", "llava-llama:serve_online",
                           "llava-llama:vllm_ar"]
    assert "train_online broke" in doc["results"]["llava-llama"]["train_online"]["error"]
    assert ("llava-llama", "serve_offline") in ran and ("llava-llama", "export_online") not in ran
    assert not any(s.startswith("eval_") for _, s, _, _ in calls)   # serve-check's native side is the eval
    # a re-run does only what is left
    calls.clear()
    _fake_steps(monkeypatch, kimi_toy, calls)
    assert kimi_toy.main(args) == 0
    assert sorted((t, s) for t, s, _, _ in calls) == sorted(
        [("llava-llama", s) for s in ("train_online", "export_online", "serve_online", "vllm_ar")])


def test_ar_batch_runs_the_batched_and_the_lone_ar_on_the_toys_own_prompts(tmp_path, monkeypatch):
    # the control without drafts: the toy's first training prompts through its chat template, two AR engines
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import kimi_toy

    args = ["--python", "/no/vllm/needed", "--work", str(tmp_path / "w"), "--toys", "kimi-k2.5", "--size", "tiny",
            "--device", "cpu", "--rows", "20", "--eval-prompts", "2"]
    assert kimi_toy.main([*args, "--out", str(tmp_path / "a.json"), "--steps", "build"]) == 0
    sent = []

    def fake_worker(python, worker, payload, **kw):
        sent.append(payload)
        alone = payload["engine"]["kwargs"].get("max_num_seqs") == 1
        outs = [[7, 7, 7] for _ in payload["prompts"]]
        if alone:
            outs[3] = [7, 8, 8]
        return {"outputs": outs, "version": "0.26.0", "startup_s": 2.0, "generate_s": 0.1, "counters": {}}

    monkeypatch.setattr("eyas.engines.base.run_in_env", fake_worker)
    ns = type("A", (), {"work": str(tmp_path / "w"), "python": sys.executable, "new_tokens": 3, "tp": 1, "ep": False,
                        "vllm_memory": 0.15, "vllm_timeout_s": 300.0, "check_dtype": "bf16"})()
    res = kimi_toy.ar_batch(kimi_toy.Run(ns, "kimi-k2.5"))
    batched, alone = sent
    assert batched["prompts"] == alone["prompts"] and len(batched["prompts"]) == 16
    assert all(isinstance(t, int) for p in batched["prompts"] for t in p)
    first_user = json.loads((tmp_path / "w" / "kimi-k2.5" / "chats.jsonl").read_text().splitlines()[0])
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tmp_path / "w" / "kimi-k2.5" / "target")
    assert first_user["messages"][0]["content"] in tok.decode(batched["prompts"][0])
    assert res["ar_alone_vs_batched"] == {"identical": "15/16", "first_difference": [None] * 3 + [1] + [None] * 12}
    assert res["prompts"] == 16 and res["tokens"] == 48 and res["vllm_startup_s"] == 2.0
    assert "ar_batch" not in kimi_toy.DEFAULT_STEPS and kimi_toy.NEEDS["ar_batch"] == ("build", "vllm_start")


def test_batch_invariant_reaches_every_engine_and_keeps_its_own_work(tmp_path, monkeypatch):
    """--batch-invariant: VLLM_BATCH_INVARIANT=1 for every engine process this run starts (inherited), recorded in
    the JSON; a WORK made in the other mode is refused with one line, not mixed."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import kimi_toy

    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    args = ["--python", "/no/vllm/needed", "--toys", "kimi-k2.5", "--size", "tiny", "--device", "cpu", "--rows", "3",
            "--eval-prompts", "2", "--steps", "build"]
    assert kimi_toy.main([*args, "--work", str(tmp_path / "w"), "--out", str(tmp_path / "a.json")]) == 0
    plain = json.loads((tmp_path / "a.json").read_text())
    assert plain["results"]["batch_invariant"] is False and plain["environment"]["vllm_batch_invariant"] is False
    with pytest.raises(SystemExit, match=r"VLLM_BATCH_INVARIANT=0, this call has 1: use another --work"):
        kimi_toy.main([*args, "--work", str(tmp_path / "w"), "--out", str(tmp_path / "b.json"), "--batch-invariant"])
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    assert kimi_toy.main([*args, "--work", str(tmp_path / "bi"), "--out", str(tmp_path / "c.json"),
                          "--batch-invariant"]) == 0
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["results"]["batch_invariant"] is True and doc["environment"]["vllm_batch_invariant"] is True
    assert kimi_toy.Run(kimi_toy.argparse.Namespace(work=tmp_path / "bi"), "kimi-k2.5").env()[
        "VLLM_BATCH_INVARIANT"] == "1"                   # what serve-check's and the adapter's engines inherit
