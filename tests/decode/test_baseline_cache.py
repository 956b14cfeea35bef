"""`eyas eval --baseline-cache`: a second draft of the same target is measured against the first eval's AR baseline
(not generated again), with the same results as without the cache; anything the baseline depends on misses."""

import importlib
import json

import pytest
import torch
from conftest import random_draft, tiny_llama, write_eval_dirs

from eyas.decode import session
from eyas.draft.io import save_draft

evaluate = importlib.import_module("eyas.decode.evaluate")   # the package exports a function of that name


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = write_eval_dirs(tmp_path_factory.mktemp("bcache"))
    draft2, _ = random_draft(tiny_llama(seed=2, vocab=128), seed=7)    # another draft of the same target
    save_draft(draft2, root / "draft2", {"target": "tiny"})
    return root


def cfg(dirs, cache, draft="draft", **kw):
    base = dict(target=str(dirs / "target"), draft=str(dirs / draft), bench=str(dirs / "bench.jsonl"),
                max_new_tokens=8, chain=2, device="cpu", json=True, baseline_cache=cache)
    return evaluate.EvalConfig(**{**base, **kw})


def first_keys(cache):
    doc = json.loads(next(cache.glob("*.json")).read_text())
    return [(t["question_id"], t["turn"]) for t in doc["turns"]]


def strip(doc):
    return [(r["setting"], r["tau"], r["accept_per_position"], r["identical_rate"]) for r in doc["results"]]


def test_second_draft_reuses_the_baseline_and_measures_the_same(dirs, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = evaluate.run(cfg(dirs, cache))
    assert first["baseline"] == {"turns": 4, "from_cache": 0, "cache": str(cache), "cache_check": None}
    assert len(list(cache.glob("*.json"))) == 1
    plain = evaluate.run(cfg(dirs, None, draft="draft2"))              # no cache: the baseline generated
    calls = []
    real = session.ar_generate
    monkeypatch.setattr(session, "ar_generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(session.bcache, "DRIFT", 1e9)      # tiny CPU turns time too noisily for the real bound
    cached = evaluate.run(cfg(dirs, cache, draft="draft2"))
    assert calls == [1] * 3 and cached["baseline"]["from_cache"] == 4   # 3 of its 4 turns timed again, no more
    assert [(t["question_id"], t["turn"]) for t in cached["baseline"]["cache_check"]["turns"]] == \
        [first_keys(cache)[i] for i in (0, 2, 3)]                     # spread over the order they were made in
    assert cached["baseline"]["cache_check"]["used"] and cached["baseline"]["cache_check"]["same_tokens"]
    assert strip(cached) == strip(plain) and cached["results"][0]["identical_rate"] == 1.0
    assert "* AR baseline: 4 of 4 turns from the cache" in evaluate.table(cached)


@pytest.mark.parametrize("damage", ["timings", "tokens"])
def test_a_cache_whose_turn_does_not_time_or_decode_alike_here_is_not_used(dirs, tmp_path, damage, capsys):
    # item 5: a cache built beside a busy loop gave 0.88x where a fresh measurement gave 0.42x.
    cache = tmp_path / "cache"
    evaluate.run(cfg(dirs, cache))
    f = next(cache.glob("*.json"))
    doc = json.loads(f.read_text())
    for t in doc["turns"]:
        if damage == "timings":
            t["stats"]["t_total"] *= 50           # another process, 50x slower: any speedup would look 50x better
        else:
            t["ids"] = [0] + t["ids"][1:]
    f.write_text(json.dumps(doc))
    again = evaluate.run(cfg(dirs, cache, draft="draft2"))
    check = again["baseline"]["cache_check"]
    assert again["baseline"]["from_cache"] == 0 and not check["used"]
    assert (check["apart"] > 10) if damage == "timings" else not check["same_tokens"]
    assert "AR baseline: timed here; the cached one was not used" in evaluate.table(again)
    assert again["results"][0]["speedup"] < 10


def test_a_cache_a_neighbour_slowed_after_its_first_turns_is_not_used(dirs, tmp_path):
    """A baseline timed while training started beside it: its first turns quick, the rest 3x slower. One quiet turn
    (the longest first turn, as the check once chose) cannot vouch for it; turns spread over its order do."""
    cache = tmp_path / "cache"
    evaluate.run(cfg(dirs, cache))
    f = next(cache.glob("*.json"))
    doc = json.loads(f.read_text())
    firsts = [t for t in doc["turns"] if t["turn"] == 0]
    quiet = max(firsts, key=lambda t: (t["stats"]["new_tokens"], str((t["question_id"], t["turn"]))))
    for t in doc["turns"]:
        if t is not quiet:
            t["stats"]["t_total"] *= 3
    f.write_text(json.dumps(doc))
    again = evaluate.run(cfg(dirs, cache, draft="draft2"))
    assert again["baseline"]["from_cache"] == 0 and not again["baseline"]["cache_check"]["used"]
    assert again["baseline"]["cache_check"]["apart"] > 0.5


def test_an_eval_beside_other_work_reports_no_speedup_and_its_baseline_never_times_an_alone_eval(dirs, tmp_path,
                                                                                              monkeypatch):
    cache = tmp_path / "cache"
    shared = evaluate.run(cfg(dirs, cache, timings_shared=True))
    r = shared["results"][0]
    assert r["speedup"] is None and r["speedup_vs_vllm_ar"] is None and r["timed_alone"] is False
    assert all(c["speedup"] is None for c in r["per_category"].values()) and r["tau"] > 0
    assert any("--timings-shared" in w for w in shared["warnings"]) and "cost_model" not in shared
    assert "  -  " in evaluate.table(shared) or " - " in evaluate.table(shared)
    assert json.loads(next(cache.glob("*.json")).read_text())["shared"] is True
    calls = []
    real = session.ar_generate
    monkeypatch.setattr(session, "ar_generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = evaluate.run(cfg(dirs, cache, draft="draft2", timings_shared=True))   # tokens reused, nothing re-timed
    assert calls == [] and again["baseline"]["from_cache"] == 4
    alone = evaluate.run(cfg(dirs, cache, draft="draft2"))                       # times its own baseline
    assert len(calls) == 4 and alone["baseline"]["from_cache"] == 0
    assert alone["baseline"]["cache_check"] == {"used": False, "shared": True}
    assert alone["results"][0]["speedup"] > 0 and strip(alone) == strip(again)
    assert "timed while other work shared the device" in evaluate.table(alone)
    assert json.loads(next(cache.glob("*.json")).read_text())["shared"] is False   # timed alone now


@pytest.mark.parametrize("change", ["max_new_tokens", "temperature", "weights", "questions", "foreign_file"])
def test_anything_the_baseline_depends_on_misses(dirs, tmp_path, change, monkeypatch):
    cache = tmp_path / "cache"
    evaluate.run(cfg(dirs, cache))
    kw = {}
    if change == "max_new_tokens":
        kw["max_new_tokens"] = 6
    elif change == "temperature":
        kw["temperature"] = 1.0
    elif change == "questions":
        kw["bench"] = str(tmp_path / "bench.jsonl")
        rows = [json.loads(x) for x in (dirs / "bench.jsonl").read_text().splitlines()]
        rows[0]["turns"][1] = "and once more?"
        (tmp_path / "bench.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    elif change == "foreign_file":   # the file the key names holds another key (a collision, a hand edit)
        f = next(cache.glob("*.json"))
        doc = json.loads(f.read_text())
        doc["key"]["seed"] = 99
        f.write_text(json.dumps(doc))
    else:   # the target's weights: the same dir name, one value changed
        from transformers import AutoModelForCausalLM
        m = AutoModelForCausalLM.from_pretrained(dirs / "target")
        with torch.no_grad():
            m.model.layers[1].mlp.down_proj.weight[0, 0] += 0.5
        (tmp_path / "t").mkdir()
        for p in (dirs / "target").iterdir():
            if p.suffix != ".safetensors":
                (tmp_path / "t" / p.name).write_bytes(p.read_bytes())
        m.save_pretrained(tmp_path / "t")
        kw["target"] = str(tmp_path / "t")
    again = evaluate.run(cfg(dirs, cache, **kw))
    assert again["baseline"]["from_cache"] == 0 and again["baseline"]["turns"] == 4
