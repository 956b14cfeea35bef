"""bench/drafters.py: the three kinds trained at equal data and equal GPU-minutes, Spec-Bench τ and speedup for each,
the served sweep per kind, and the issue's goal ratios against EAGLE-3."""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "drafters.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_drafters", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH.parent))
    spec.loader.exec_module(mod)
    return mod


def entry(kind, regime, chain_tau, tree_tau, chain_sp, tree_sp):
    return {"kind": kind, "regime": regime, "chain": {"tau": chain_tau, "speedup": chain_sp},
            "tree": {"tau": tree_tau, "speedup": tree_sp}}


def test_goals_compare_the_best_parallel_draft_with_eagle3():
    D = load()
    rows = [entry("eagle3", "data", 2.5, 3.5, 1.8, 2.0), entry("p-eagle", "data", 3.0, 4.0, 2.4, 2.2),
            entry("dflash", "data", 3.5, 4.5, 2.1, 2.7), entry("p-eagle", "time", 2.0, 3.0, 1.5, 1.4)]
    served = {"eagle3": {"best_by_batch": {"1": {"speedup": 1.34}}}, "dflash": {"best_by_batch": {"1": {"speedup": 2.0}}}}
    g = D.goals(rows, served)
    assert g["data"] == {"best_tree_tau_kind": "dflash", "tree_tau_ratio": round(4.5 / 3.5, 3), "tree_tau_goal": 1.2,
                         "fastest_kind": "dflash", "native_speedup_ratio": round(2.7 / 2.0, 3),
                         "native_speedup_goal": 1.3}
    assert "time" not in g                                        # no eagle3 row in that regime
    assert g["served_batch1"] == {"kind": "dflash", "speedup_ratio": round(2.0 / 1.34, 3), "goal": 1.3}


def test_equal_time_steps_come_from_each_kind_s_own_pace(tmp_path):
    D = load()
    for kind, steps in (("eagle3", 100), ("dflash", 50)):
        run = tmp_path / f"run-{kind}-data"
        run.mkdir()
        (run / "metrics.jsonl").write_text(json.dumps({"split": "train", "step": steps}) + "\n")
    r = SimpleNamespace(seconds={"train:eagle3:data": 300.0, "train:dflash:data": 600.0}.get)
    a = SimpleNamespace(work=tmp_path, time_budget_s=None)
    assert D.time_steps(r, a, "dflash") == 25                     # 300 s at dflash's 12 s a step
    a.time_budget_s = 120.0
    assert D.time_steps(r, a, "dflash") == 10


def test_served_sweep_exports_each_chain_and_measures_them(tmp_path, monkeypatch):
    D = load()
    calls, measured = [], {}
    r = SimpleNamespace(state={"done": {}}, ran=[], left=lambda: 1000.0, save=lambda: None,
                        eyas=lambda name, *args, **kw: calls.append((name, args)) or True,
                        count=lambda *a: None)

    def fake_measure(python, target, export, prompts, chains, batches, max_new, gpus, logs, **kw):
        measured.update(export=export, chains=chains, batches=batches, prompts=prompts)
        return {"failed": {}, "rows": [], "best_by_batch": {"1": {"speedup": 1.5}}}
    import eyas.engines.vllm_speedup as V
    monkeypatch.setattr(V, "measure", fake_measure)
    monkeypatch.setattr(D, "prompts", lambda a: [[1, 2, 3]])
    monkeypatch.setattr("eyas.engines.base.engine_python", lambda *a: Path("/venv/python"))
    a = SimpleNamespace(work=tmp_path, ttt=5, serve_chains=[2, 3], serve_chains_parallel=[3, 5, 7], serve_need=100,
                        python=None, target="T", batch_sizes=[1, 8], serve_max_new_tokens=64, gpus=["0"],
                        engines_per_gpu=2, serve_rounds=1)
    assert D.serve(r, a, "dflash")
    assert [c[0] for c in calls] == ["export:dflash:k3", "export:dflash:k5"]      # 7 > the 5 trained tokens
    assert measured["export"] == str(tmp_path / "export-dflash-k{k}") and measured["chains"] == [3, 5]
    assert "serve:dflash" in r.state["done"] and json.loads((tmp_path / "serve-dflash.json").read_text())["rows"] == []
    calls.clear()
    for k, v in dict(eval_chain=3, eval_chain_parallel=None, eval_categories="writing", serve_per_category=2).items():
        setattr(a, k, v)
    assert D.serve_check(r, a, "dflash")
    (export, e_args), (check, c_args) = calls
    assert export == "export:dflash:k5" and check == "check:dflash"             # the native chain: the 5 trained
    assert c_args[c_args.index("--draft") + 1] == str(tmp_path / "export-dflash-k5")
    assert c_args[c_args.index("--tolerance") + 1] == "1.0"                     # a gap is reported, not a failure


@pytest.mark.slow
def test_tiny_end_to_end(tmp_path):
    """The whole pipeline on CPU with a random target: every step runs, every row is filled."""
    from eyas.cli import main
    from tests.data.templates import make_model_dir

    make_model_dir(tmp_path / "target")
    words = "the a cat dog runs fast slow blue green house tree river stone light dark".split()
    chats = [{"messages": [{"role": "user", "content": " ".join(words[(i + j) % 15] for j in range(6 + i % 5))},
                           {"role": "assistant", "content": " ".join(words[(3 * i + j) % 15] for j in range(12))}]}
             for i in range(40)]
    (tmp_path / "chats.jsonl").write_text("\n".join(json.dumps(c) for c in chats))
    assert main(["prepare", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "chats.jsonl"), "--out",
                 str(tmp_path / "prep"), "--max-length", "128", "--draft-vocab-size", "64", "--workers", "0"]) == 0
    D = load()
    assert D.main(["--tiny", "--target", str(tmp_path / "target"), "--prepared", str(tmp_path / "prep"), "--work",
                   str(tmp_path / "work"), "--out", str(tmp_path / "out.json"), "--budget-s", "1200"]) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["complete"] and len(doc["rows"]) == 6
    for row in doc["rows"]:
        assert row["train_gpu_s"] > 0 and row["train_tokens"] > 0 and row["chain"]["identical_rate"] == 1.0
        assert row["tree"]["setting"] == "tree(total=6,depth=2,topk=3)" and row["tree"]["tau"] >= 1.0
    assert set(doc["goals"]) == {"data", "time"}
