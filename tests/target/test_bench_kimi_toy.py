"""bench/kimi_toy.py's bookkeeping on CPU: the build step, the state that lets a re-run continue, the time budget."""

import json
import sys
from pathlib import Path

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


def test_vllm_ar_asks_the_engine_for_plain_greedy_on_serve_checks_prompts(tmp_path, monkeypatch):
    # vLLM's own AR through the engine interface (no draft), sharded like serve-check when --tp > 1
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import kimi_toy

    sent = []

    def fake_worker(python, worker, payload, **kw):
        sent.append(payload)
        return {"outputs": [[5, 6, 7], [8, 9, 9]], "version": "0.26.0", "startup_s": 1.5, "generate_s": 0.1,
                "counters": {}}

    monkeypatch.setattr("eyas.engines.base.run_in_env", fake_worker)
    ns = type("A", (), {"work": str(tmp_path), "python": str(Path(sys.executable)), "new_tokens": 3, "tp": 2})()
    r = kimi_toy.Run(ns, "kimi-k2.5")
    (r.dir / "serve-offline.json").write_text(json.dumps({"prompt_ids": [[1, 2], [3]],
                                                          "served_outputs": [[5, 6, 7], [8, 9, 4]]}))
    res = kimi_toy.vllm_ar(r, "offline")
    kwargs = sent[0]["engine"]["kwargs"]
    assert sent[0]["prompts"] == [[1, 2], [3]] and sent[0]["max_tokens"] == 3 and sent[0]["engine"]["draft"] is None
    assert kwargs["model"] == str(r.target) and kwargs["dtype"] == "bfloat16" and "speculative_config" not in kwargs
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["enable_expert_parallel"] is True
    assert res["identical_to_vllm_ar"] == "1/2" and res["first_difference"] == [None, 2]
    assert res["vllm_startup_s"] == 1.5
