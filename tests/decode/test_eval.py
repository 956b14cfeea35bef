"""`eyas eval` end to end on a tiny saved target (char tokenizer + ChatML template) and draft dir;
load_bench parsing and errors; the cost model's replay and choice."""

import json
import re

import pytest
import torch
from conftest import random_draft, tiny_llama, write_eval_dirs

from eyas.cli import main
from eyas.decode.bench import load_bench
from eyas.decode.costmodel import Costs, choose, covers, predict, predict_from, replay_accepted
from eyas.decode.tree import TreeSpec


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return write_eval_dirs(tmp_path_factory.mktemp("eval"))


def test_eval_cli_writes_json_and_plots(tiny_dirs, capsys):
    out = tiny_dirs / "out.json"
    rc = main(["eval", "--target", str(tiny_dirs / "target"), "--draft", str(tiny_dirs / "draft"),
               "--bench", str(tiny_dirs / "bench.jsonl"), "--max-new-tokens", "8", "--chain", "2",
               "--tree", "total=6,depth=3,topk=2", "--device", "cpu", "--out", str(out),
               "--plots", str(tiny_dirs / "plots")])
    assert rc == 0
    printed = capsys.readouterr()
    # The default print is a table a person reads; the JSON goes to --out (and to stdout with --json).
    table = printed.out.splitlines()
    assert any(line.startswith("chain-2 ") for line in table) and any(line.startswith("a ") for line in table)
    assert len(table) < 22 and "{" not in printed.out
    # where each setting's time went: a turn's start in its parts against the AR's prefill, a round's draft / verify
    assert sum(bool(re.match(r"^(chain-2|tree\S+): a turn's start [\d.]+ ms \(target prefill [\d.]+, draft catch-up "
                             r"[\d.]+, first tree [\d.]+; the AR's prefill [\d.]+\), a round [\d.]+ ms", line))
               for line in table) == 2
    assert any(line.startswith("vLLM AR: no measured figure for this model on cpu") for line in table)
    # Progress with ETA goes to stderr even when it is not a terminal: one line per setting's start and end.
    assert re.search(r"^eval: greedy baseline: 0/4 turns \(0%\).*ETA", printed.err, re.M)
    assert re.search(r"^eval: chain-2: 4/4 turns \(100%\), [\d.]+ turns/s, elapsed [\d:]+, done, τ 1\.\d\d$",
                     printed.err, re.M)
    doc = json.loads(out.read_text())
    assert [r["setting"] for r in doc["results"]] == ["chain-2", "tree(total=6,depth=3,topk=2)"]
    for r in doc["results"]:
        for key in ("tau", "accept_per_position", "tokens_per_s", "baseline_tokens_per_s", "speedup"):
            assert key in r
        assert r["identical_rate"] == 1.0            # fp32 greedy: lossless
        assert set(r["per_category"]) == {"a", "b"}
        assert r["tau"] == pytest.approx(1 + sum(r["accept_per_position"]))
        assert r["time_s"]["draft"] > 0 and r["time_s"]["verify"] > 0
        parts, t = r["time_s"]["prefill_parts"], r["time_s"]
        assert 0 < sum(parts.values()) <= t["prefill"] and 0 < t["baseline_prefill"] < t["baseline_total"]
        # one record per turn, adding up to the setting's tau (a subset's tau is read from them)
        assert len(r["turns"]) == 4 and all(t["identical"] for t in r["turns"])
        assert sum(t["emitted"] for t in r["turns"]) / sum(t["steps"] for t in r["turns"]) == pytest.approx(r["tau"])
        assert {t["category"] for t in r["turns"]} == {"a", "b"}
    assert doc["hardware"]["device"] == "cpu" and "commit" in doc
    assert doc["vllm_reference"] is None and all(r["speedup_vs_vllm_ar"] is None for r in doc["results"])
    pvm = doc["cost_model"]["predicted_vs_measured"]
    # Each setting replayed from its own rounds predicts exactly its measured tau; the tree (depth 3, topk 2)
    # covers chain-2, so chain-2 is also predicted from the tree's rounds (a held-out replay).
    chain, tree = (r["setting"] for r in doc["results"])
    assert [(p["setting"], p["replayed"]) for p in pvm] == [(chain, chain), (chain, tree), (tree, tree)]
    for p in pvm:
        assert p["covered"] and p["tau"] >= 1
        if p["replayed"] == p["setting"]:
            assert p["tau"] == pytest.approx(p["measured_tau"])
            # whole turns, as measured: prefills and first trees count (a round's speedup alone overstates it)
            assert p["per"] == "turn" and p["speedup"] == pytest.approx(p["measured_speedup"], rel=0.15)
    assert (tiny_dirs / "plots" / "acceptance_by_position.png").stat().st_size > 1000
    assert (tiny_dirs / "plots" / "tau_by_category.png").stat().st_size > 1000


def test_eval_reports_speedup_over_vllm_ar_where_measured(tiny_dirs, tmp_path, monkeypatch, capsys):
    """With a vLLM AR figure for the target's architecture on this GPU, every setting's tok/s is read against it."""
    import importlib
    evaluate = importlib.import_module("eyas.decode.evaluate")
    from eyas.decode import vllm_reference as vr
    from eyas.target import load_config

    table = tmp_path / "ref.json"
    row = {"model": "tiny", "arch": vr.arch_key(load_config(tiny_dirs / "target")), "gpu": "Test GPU",
           "dtype": "float32", "batch": 1, "vllm": "0.0", "ar_tokens_per_s": 10.0, "prompts": 1, "max_new_tokens": 8}
    table.write_text(json.dumps({"rows": [row, dict(row, batch=8, ar_tokens_per_s=1.0)]}))
    monkeypatch.setattr(vr, "TABLE", table)
    real = evaluate.hardware
    monkeypatch.setattr(evaluate, "hardware", lambda device: dict(real(device), gpu="Test GPU"))
    assert main(["eval", "--target", str(tiny_dirs / "target"), "--draft", str(tiny_dirs / "draft"),
                 "--bench", str(tiny_dirs / "bench.jsonl"), "--max-new-tokens", "8", "--chain", "2",
                 "--device", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["vllm_reference"] == row
    r = doc["results"][0]
    assert r["speedup_vs_vllm_ar"] == pytest.approx(r["tokens_per_s"] / 10.0) and r["speedup"] > 0
    assert doc["speedup_vs_vllm_ar"] == r["speedup_vs_vllm_ar"]    # the headline carries it too
    text = evaluate.table(doc).splitlines()
    head = next(line for line in text if line.startswith("setting"))
    assert "speedup  vs vLLM AR  identical" in head
    assert f"{r['speedup_vs_vllm_ar']:.2f}x" in next(line for line in text if line.startswith("chain-2"))
    assert "vLLM AR: 10.0 tok/s (tiny, Test GPU, batch 1, float32, vLLM 0.0, 1 prompts x 8 new tokens)" in text


def test_eval_reuse_shares_models_and_runner_across_temperatures(tiny_dirs, monkeypatch):
    """bench/decode.py's loop: a second temperature reuses the loaded pair, the runner and the proposers
    (no second load or compile) and gives exactly what a fresh run at that temperature gives."""
    import importlib
    evaluate = importlib.import_module("eyas.decode.evaluate")  # the package exports a function of that name
    loads = []
    real_load = evaluate.load_pair
    monkeypatch.setattr(evaluate, "load_pair", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    kw = dict(target=str(tiny_dirs / "target"), draft=str(tiny_dirs / "draft"), bench=str(tiny_dirs / "bench.jsonl"),
              max_new_tokens=8, chain=2, tree="total=6,depth=3,topk=2", device="cpu", json=True)
    reuse: dict = {}
    runs = [evaluate.run(evaluate.EvalConfig(**kw, temperature=t), reuse=reuse) for t in (0.0, 1.0)]
    assert len(loads) == 1
    runner, props = reuse["session"]["runner"], dict(reuse["session"]["proposers"])
    assert len(props) == 2
    again = evaluate.run(evaluate.EvalConfig(**kw, temperature=0.0), reuse=reuse)
    assert reuse["session"]["runner"] is runner and reuse["session"]["proposers"] == props and len(loads) == 1
    fresh = evaluate.run(evaluate.EvalConfig(**kw, temperature=1.0))
    def strip(doc):
        return [(r["setting"], r["tau"], r["accept_per_position"], r["steps"]) for r in doc["results"]]
    assert strip(runs[1]) == strip(fresh)        # sampling: the same seeds, the same rounds
    assert strip(runs[0]) == strip(again)
    assert runs[0]["results"][0]["identical_rate"] == 1.0


def test_eval_tree_auto(tiny_dirs, capsys):
    rc = main(["eval", "--target", str(tiny_dirs / "target"), "--draft", str(tiny_dirs / "draft"),
               "--bench", str(tiny_dirs / "bench.jsonl"), "--max-new-tokens", "6", "--tree", "auto",
               "--device", "cpu", "--json", "--categories", "b", "--per-category", "1"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    auto = doc["cost_model"]["auto"]
    assert auto["chosen"] == doc["results"][-1]["setting"]
    assert auto["predictions"][0]["speedup"] >= auto["predictions"][-1]["speedup"]


def _capture_hooks(model) -> int:
    return sum(getattr(fn, "eyas_capture", False) for m in model.modules() for fn in m._forward_pre_hooks.values())


def test_eval_tree_auto_leaves_no_calibration_hooks_on_the_target(tiny_dirs):
    """--tree auto calibrates in a session of its own; its runner's capture hooks come off the target when it has
    chosen, not at some later garbage collection (one in the middle of a torch.compile trace broke dynamo's guards)."""
    import importlib
    evaluate = importlib.import_module("eyas.decode.evaluate")
    reuse: dict = {}
    evaluate.run(evaluate.EvalConfig(target=str(tiny_dirs / "target"), draft=str(tiny_dirs / "draft"),
                                     bench=str(tiny_dirs / "bench.jsonl"), max_new_tokens=6, tree="auto",
                                     device="cpu", json=True, categories=["b"], per_category=1), reuse=reuse)
    target, draft = reuse["pair"]
    assert _capture_hooks(target.model) == len(draft.config.aux_layer_ids)   # the kept session's runner only


def test_a_session_takes_its_hooks_off_when_closed_or_replaced(tiny_dirs):
    from eyas.decode.evaluate import load_pair
    from eyas.decode.session import Session
    target, draft = load_pair(str(tiny_dirs / "target"), str(tiny_dirs / "draft"), "cpu", None)
    qs = load_bench(tiny_dirs / "bench.jsonl")[:1]
    n = len(draft.config.aux_layer_ids)
    with Session(target, draft, qs, max_new_tokens=4, compile_graphs=False):
        assert _capture_hooks(target.model) == n
    assert _capture_hooks(target.model) == 0
    reuse: dict = {}
    kept = Session(target, draft, qs, max_new_tokens=4, compile_graphs=False, reuse=reuse)
    kept.close()                                   # a caller's reuse keeps its runner (and hooks) for the next session
    assert _capture_hooks(target.model) == n
    Session(target, draft, qs, max_new_tokens=40, compile_graphs=False, reuse=reuse)   # another capacity: new runner
    assert _capture_hooks(target.model) == n


def test_load_bench(tmp_path):
    qs = load_bench("spec-bench")
    assert len({q["category"] for q in qs}) == 13
    assert len(load_bench("spec-bench", ["writing", "math"], limit=2)) == 4
    with pytest.raises(ValueError, match="unknown categories"):
        load_bench("spec-bench", ["nope"])
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"question_id": 1, "category": "x"}\n')
    with pytest.raises(ValueError, match=r"b.jsonl:1: missing key 'turns'"):
        load_bench(bad)
    with pytest.raises(FileNotFoundError):
        load_bench(tmp_path / "none.jsonl")
    # JSON leaves U+2028 / U+0085 raw inside strings; they must not split a row (str.splitlines would)
    odd = tmp_path / "odd.jsonl"
    turn = "line one\u2028line two\x85end"
    odd.write_text(json.dumps({"question_id": 7, "category": "x", "turns": [turn]}, ensure_ascii=False) + "\r\n",
                   encoding="utf-8")
    assert load_bench(odd) == [{"question_id": 7, "category": "x", "turns": [turn]}]


def test_tree_spec_parse():
    assert TreeSpec.parse("total=60,depth=7,topk=10") == TreeSpec(60, 7, 10)
    with pytest.raises(ValueError, match="missing"):
        TreeSpec.parse("total=6,depth=3")
    with pytest.raises(ValueError, match="exceeds"):
        TreeSpec.parse("total=50,depth=2,topk=2")


def test_cost_model_replay_and_choice():
    # root children: n0 (score -0.1, match), n1 (-1.0); n2 child of n0 (-0.3, match); n3 child of n2 (-0.6, no)
    rnd = {"scores": [-0.1, -1.0, -0.3, -0.6], "parents": [-1, -1, 0, 2], "match": [True, False, True, False]}
    assert replay_accepted(rnd, TreeSpec(4, 3, 2)) == 2
    assert replay_accepted(rnd, TreeSpec.chain(1)) == 1
    assert replay_accepted(rnd, TreeSpec(1, 1, 1)) == 1
    costs = Costs(ar_step=1.0, verify={5: 1.2}, level={1: 0.1, 2: 0.12}, overhead=0.05)
    pr = predict([rnd], TreeSpec.chain(2), costs)
    assert pr["tau"] == 3.0 and pr["speedup"] == pytest.approx(3.0 / (2 * 0.1 + (1.0 + 0.2 * 2 / 4) + 0.05))
    # A chain's rounds miss the tree's second branch; a tree's rounds hold everything the chain drafts.
    chain_rnd = {"scores": [-0.1, -0.3], "parents": [-1, 0], "match": [False, False]}
    tree = TreeSpec(4, 3, 2)
    assert covers(tree, TreeSpec.chain(2)) and not covers(TreeSpec.chain(2), tree)
    rec = [(TreeSpec.chain(2), [chain_rnd]), (tree, [rnd])]
    got = predict_from(rec, TreeSpec(3, 2, 2), costs)            # topk 2: only the tree's rounds cover it
    assert got["replayed"] == tree.label() and got["covered"] and got["tau"] == 3.0
    assert predict_from(rec, TreeSpec.chain(2), costs)["replayed"] == "chain-2"       # own rounds first
    wide = predict_from(rec, TreeSpec(6, 3, 3), costs)                              # nothing covers topk 3
    assert not wide["covered"] and wide["replayed"] == "all" and wide["tau"] == 1.0 + (0 + 2) / 2
    # per turn of 11 new tokens: the AR's prefill and 10 steps against start + first tree + 10 / tau rounds
    turned = Costs(**{**costs.__dict__, "ar_prefill": 2.0, "turn_start": 3.0, "tokens_per_turn": 11.0})
    pt = predict([rnd], TreeSpec.chain(2), turned)
    round_s = 2 * 0.1 + (1.0 + 0.2 * 2 / 4) + 0.05
    assert pt["per"] == "turn" and pt["round_speedup"] == pytest.approx(pr["speedup"])
    assert pt["speedup"] == pytest.approx((2.0 + 10 * 1.0) / (3.0 + 2 * 0.1 + 10 / 3.0 * round_s))
    best, preds = choose([rnd], costs, [TreeSpec.chain(1), TreeSpec.chain(2), TreeSpec(4, 3, 2)])
    assert preds[0]["speedup"] >= preds[1]["speedup"] >= preds[2]["speedup"]
    assert best.label() == preds[0]["setting"]


def test_ulp_matches_the_dtype_spacing():
    import torch
    from eyas.decode.divergence import ulp

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for x in (0.375, 1.0, 17.5, -23.0, 100.0):
            t = torch.tensor(abs(x), dtype=dtype)
            # the next representable number above |x| (x is exact in every dtype here)
            nxt = torch.nextafter(t.float(), torch.tensor(float("inf"))).to(dtype) if dtype == torch.float32 else None
            step = ulp(x, dtype)
            assert float(t + torch.tensor(step, dtype=dtype)) > float(t)           # one ulp up is a new number
            assert float(t + torch.tensor(step / 4, dtype=dtype)) == float(t)      # a quarter ulp rounds back
            if nxt is not None:
                assert step == float(nxt) - float(t)


def test_logit_gap_calls_a_two_ulp_gap_a_tie():
    import types

    import torch
    from eyas.decode.divergence import TIE_ULPS, logit_gap

    logits = torch.zeros(1, 1, 8)
    logits[0, 0, 3], logits[0, 0, 5] = 20.0, 20.0 - TIE_ULPS * 0.125   # bf16 spacing at 16..32 is 0.125
    model = lambda input_ids, use_cache: types.SimpleNamespace(logits=logits)  # noqa: E731
    runner = types.SimpleNamespace(model=model, device="cpu", dtype=torch.bfloat16)
    r = logit_gap(runner, [1, 2], [7, 3], [7, 5])
    assert r["index"] == 1 and r["ulp"] == 0.125 and r["tie"]
    logits[0, 0, 5] = 20.0 - (TIE_ULPS + 1) * 0.125
    assert not logit_gap(runner, [1, 2], [7, 3], [7, 5])["tie"]


# ---------------------------------------------------------------- refused or said, never quietly wrong
def _eval(tiny_dirs, *extra, draft="draft", bench=None):
    return main(["eval", "--target", str(tiny_dirs / "target"), "--draft", str(tiny_dirs / draft), "--bench",
                 str(bench or tiny_dirs / "bench.jsonl"), "--max-new-tokens", "4", "--chain", "2", "--device", "cpu",
                 "--recheck", "0", *extra])


def _err_line(capsys):
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("eyas eval: error")]
    assert len(err) == 1, err
    return err[0]


def test_eval_out_is_never_an_input_nor_a_foreign_file(tiny_dirs, tmp_path, capsys):
    bench = tmp_path / "bench.jsonl"
    bench.write_bytes((tiny_dirs / "bench.jsonl").read_bytes())
    assert _eval(tiny_dirs, "--out", str(bench), "--overwrite", bench=bench) == 1
    assert "is the --bench" in _err_line(capsys) and bench.read_bytes() == (tiny_dirs / "bench.jsonl").read_bytes()
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    assert _eval(tiny_dirs, "--out", str(notes)) == 1
    assert "already holds a file eyas did not write" in _err_line(capsys) and "mine" in notes.read_text()
    assert _eval(tiny_dirs, "--out", str(notes), "--overwrite") == 0
    assert "results" in json.loads(notes.read_text())


def test_eval_on_a_full_disk_leaves_no_empty_out_and_no_temp_file(tiny_dirs, tmp_path, capsys, monkeypatch):
    # item 13: a full disk left a 0-byte --out and a stale *.tmpPID, and the message promised resumption.
    import errno
    from pathlib import Path
    real = Path.write_text

    def full(self, text, *a, **k):
        if ".tmp" in self.name:
            real(self, "", *a, **k)
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    out = tmp_path / "e" / "eval.json"
    assert _eval(tiny_dirs, "--out", str(out)) == 1
    line = _err_line(capsys)
    assert "disk full" in line and "resumed" not in line
    assert not out.exists() and [p.name for p in out.parent.iterdir() if "tmp" in p.name] == []


def test_eval_of_a_draft_for_another_hidden_size_or_vocabulary_is_one_line(tiny_dirs, tmp_path, capsys):
    from eyas.draft.io import save_draft
    for name, model in (("vocab", tiny_llama(seed=3, vocab=96)), ("hidden", _wider())):
        d, _ = random_draft(model)
        save_draft(d, tiny_dirs / f"other-{name}", {"target": "other"})
        assert _eval(tiny_dirs, draft=f"other-{name}") == 1
        assert f"{name} size mismatch" in _err_line(capsys) if name == "hidden" else "vocab mismatch" in \
            _err_line(capsys)


def _wider():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=48, intermediate_size=64, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2)).eval()


def test_a_repeated_question_id_is_refused(tmp_path):
    # item 11: a duplicate id made a lossless decode report identical 0.50 and --recheck blame numerics.
    p = tmp_path / "q.jsonl"
    p.write_text('{"question_id": 7, "category": "a", "turns": ["x"]}\n{"question_id": 7, "category": "b", '
                 '"turns": ["y"]}\n')
    with pytest.raises(ValueError, match=r"q.jsonl:2: question_id 7 repeats line 1"):
        load_bench(p)


def test_a_prompt_past_the_context_is_refused_and_a_long_answer_warned(tiny_dirs, tmp_path, capsys):
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["word " * 300]}) + "\n")
    assert _eval(tiny_dirs, bench=long) == 1
    assert "more than the target's max_position_embeddings (512)" in _err_line(capsys)
    edge = tmp_path / "edge.jsonl"
    edge.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["w" * 491]}) + "\n")
    assert _eval(tiny_dirs, "--json", bench=edge) == 0
    out = capsys.readouterr()
    assert "may pass the target's max_position_embeddings" in out.err
    assert json.loads(out.out)["warnings"]


def test_a_draft_trained_for_other_weights_is_warned(tiny_dirs, tmp_path, capsys):
    from eyas.draft.io import load_draft, save_draft
    from eyas.outputs import input_id
    d, meta = load_draft(tiny_dirs / "draft")
    save_draft(d, tmp_path / "d", {"target": {"name": "A", "sha256": "0" * 64}})
    assert main(["eval", "--target", str(tiny_dirs / "target"), "--draft", str(tmp_path / "d"), "--bench",
                 str(tiny_dirs / "bench.jsonl"), "--max-new-tokens", "4", "--chain", "2", "--device", "cpu",
                 "--json"]) == 0
    out = capsys.readouterr()
    assert "the draft was trained for target A" in out.err and json.loads(out.out)["warnings"]
    save_draft(d, tmp_path / "d", {"target": {"name": "A", "sha256": input_id(tiny_dirs / "target")["sha256"]}})
    assert main(["eval", "--target", str(tiny_dirs / "target"), "--draft", str(tmp_path / "d"), "--bench",
                 str(tiny_dirs / "bench.jsonl"), "--max-new-tokens", "4", "--chain", "2", "--device", "cpu",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []


def test_a_non_finite_draft_is_refused_by_eval_export_and_doctor(tiny_dirs, tmp_path, capsys):
    # item 4: a draft full of NaN was accepted by doctor, export and eval (τ 1.00).
    from eyas.draft.io import load_draft, save_draft
    d, _ = load_draft(tiny_dirs / "draft")
    with torch.no_grad():
        d.fc.weight[0, 0] = float("nan")
    save_draft(d, tmp_path / "nan", {"target": "tiny"})
    base = ["--target", str(tiny_dirs / "target"), "--draft", str(tmp_path / "nan")]
    assert main(["eval", *base, "--bench", str(tiny_dirs / "bench.jsonl"), "--device", "cpu"]) == 1
    assert "fc.weight hold NaN or inf" in capsys.readouterr().err
    assert main(["export", "--draft", str(tmp_path / "nan"), "--out", str(tmp_path / "x"), "--verifier", "t"]) == 1
    assert "fc.weight hold NaN or inf" in capsys.readouterr().err
    assert main(["doctor", *base]) == 1
    assert "NaN" in capsys.readouterr().out


def test_an_eval_whose_prefill_graphs_went_off_says_so(tiny_dirs, tmp_path, monkeypatch, capsys):
    """A failed capture turns the prefill graphs off for good; the eval's timings then hold eager prefills, and its
    JSON says so (a warning, and each setting's decode.prefill_graphs)."""
    import eyas.decode.session as session
    from eyas.decode.prefill import _graphs_off

    class Failing(session.TargetRunner):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            _graphs_off(self, RuntimeError("operation not permitted when stream is capturing"))
    monkeypatch.setattr(session, "TargetRunner", Failing)
    out = tmp_path / "e.json"
    with pytest.warns(RuntimeWarning, match="prefills run eagerly"):
        assert main(["eval", "--target", str(tiny_dirs / "target"), "--draft", str(tiny_dirs / "draft"), "--bench",
                     str(tiny_dirs / "bench.jsonl"), "--max-new-tokens", "6", "--chain", "2", "--device", "cpu",
                     "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert any(w.startswith("prefills ran eagerly after a CUDA graph capture failed (RuntimeError: operation not")
               for w in doc["warnings"])
    assert [r["decode"]["prefill_graphs"] for r in doc["results"]] == [False]


def test_an_eval_records_the_decoder_switches_it_ran_with(tiny_dirs, tmp_path, monkeypatch):
    """An A/B's two JSONs say which is which: the diagnosis switches set off their default."""
    from eyas import env
    for name in env.SWITCHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EYAS_PREFILL_SDPA", "any")
    assert _eval(tiny_dirs, "--out", str(tmp_path / "e.json")) == 0
    assert json.loads((tmp_path / "e.json").read_text())["switches"] == {"EYAS_PREFILL_SDPA": "any"}
