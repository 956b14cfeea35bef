"""Plan drafters: the three kinds trained at equal data and equal GPU-minutes, Spec-Bench tau and speedup for each,
the served sweep per kind, and the ratios of the best parallel draft against EAGLE-3."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from eyas.recipes import DONE, RecipeError, load_recipe, run_recipe
from eyas.recipes import drafters as D
from tests.recipes.tiny import FILES


def entry(kind, regime, chain_tau, tree_tau, chain_sp, tree_sp):
    return {"kind": kind, "regime": regime, "chain": {"tau": chain_tau, "speedup": chain_sp},
            "tree": {"tau": tree_tau, "speedup": tree_sp}}


def test_goals_compare_the_best_parallel_draft_with_eagle3():
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
    for kind, steps in (("eagle3", 100), ("dflash", 50)):
        run = tmp_path / f"run-{kind}-data"
        run.mkdir()
        (run / "metrics.jsonl").write_text(json.dumps({"split": "train", "step": steps}) + "\n")
    r = SimpleNamespace(seconds={"train:eagle3:data": 300.0, "train:dflash:data": 600.0}.get)
    p = SimpleNamespace(work=tmp_path, time_budget_s=None)
    assert D.time_steps(r, p, "dflash") == 25                     # 300 s at dflash's 12 s a step
    p.time_budget_s = 120.0
    assert D.time_steps(r, p, "dflash") == 10


def test_dflash_trees_stop_at_its_block():
    p = SimpleNamespace(eval_tree="total=60,depth=7,topk=10", ttt_steps=3)
    assert D.native_tree(p, "dflash") == "total=60,depth=3,topk=10"   # 60 of the 210 candidates depth 3 has
    assert D.native_tree(p, "eagle3") == D.native_tree(p, "p-eagle") == p.eval_tree
    p.eval_tree, p.ttt_steps = "total=60,depth=7,topk=4", 2
    assert D.native_tree(p, "dflash") == "total=20,depth=2,topk=4"    # all that depth 2 of top-4 holds
    p.ttt_steps = 7
    assert D.native_tree(p, "dflash") == p.eval_tree


def test_served_sweep_exports_each_chain_and_measures_them(tmp_path, monkeypatch):
    calls, measured, state = [], {}, {}

    def call(name, fn, need=0):
        state[name] = fn()
        return True, state[name]

    r = SimpleNamespace(eyas=lambda name, *args, **kw: calls.append((name, args)) or True, call=call)

    def fake_measure(engine, target, export, prompts, chains, batches, max_new, gpus, logs, **kw):
        measured.update(engine=engine.name, export=export, chains=chains, batches=batches, prompts=prompts)
        return {"failed": {}, "rows": [], "best_by_batch": {"1": {"speedup": 1.5}}}
    import eyas.engines.speedup as S
    monkeypatch.setattr(S, "measure", fake_measure)
    monkeypatch.setattr(D, "prompts", lambda p: [[1, 2, 3]])
    (tmp_path / "python").touch()                                              # the vLLM env's, never run here
    p = SimpleNamespace(work=tmp_path, ttt_steps=5, serve_chains=[2, 3], serve_chains_parallel=[3, 5, 7],
                        serve_need=100, python=str(tmp_path / "python"), target="T", batch_sizes=[1, 8], serve_max_new_tokens=64,
                        gpus=["0"], engines_per_gpu=2, serve_rounds=1)
    assert D.serve(r, p, "dflash")
    assert [c[0] for c in calls] == ["export:dflash:k3", "export:dflash:k5"]      # 7 > the 5 trained tokens
    assert measured["export"] == str(tmp_path / "export-dflash-k{k}") and measured["chains"] == [3, 5]
    assert measured["engine"] == "vllm" and state["serve:dflash"]["best_by_batch"]["1"]["speedup"] == 1.5
    assert json.loads((tmp_path / "serve-dflash.json").read_text())["rows"] == []
    calls.clear()
    for k, v in dict(eval_chain=3, eval_chain_parallel=None, eval_categories="writing", serve_per_category=2).items():
        setattr(p, k, v)
    assert D.serve_check(r, p, "dflash")
    (export, e_args), (check, c_args) = calls
    assert export == "export:dflash:k5" and check == "check:dflash"             # the native chain: the 5 trained
    assert c_args[c_args.index("--draft") + 1] == str(tmp_path / "export-dflash-k5")
    assert c_args[c_args.index("--tolerance") + 1] == "1.0"                     # a gap is reported, not a failure


def test_bad_params_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(RecipeError, match="prepared"):
        run_recipe(load_recipe("drafters", []), tmp_path / "w")
    (tmp_path / "prep").mkdir()
    (tmp_path / "prep" / "manifest.json").write_text("{}")
    for sets, what in ((["kinds=p-eagle"], "eagle3"), (["kind_args=[medusa=--lr 1]"], "kind_args")):
        with pytest.raises(RecipeError, match=what):
            run_recipe(load_recipe("drafters", [f"prepared={tmp_path / 'prep'}", *sets]), tmp_path / "w")
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_tiny_end_to_end(tmp_path):
    """The whole plan on CPU with a random target: every step runs, every row is filled."""
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
    recipe = load_recipe(FILES / "drafters-tiny.yaml", [f"target={tmp_path / 'target'}",
                                                        f"prepared={tmp_path / 'prep'}"])
    code, doc = run_recipe(recipe, tmp_path / "work", 1200)
    assert code == DONE and doc["complete"] and len(doc["rows"]) == 6
    for row in doc["rows"]:
        assert row["train_gpu_s"] > 0 and row["train_tokens"] > 0 and row["chain"]["identical_rate"] == 1.0
        assert row["tree"]["setting"] == "tree(total=6,depth=2,topk=3)" and row["tree"]["tau"] >= 1.0
    assert set(doc["goals"]) == {"data", "time"}
    assert json.loads(Path(doc["files"]["result"]).read_text())["rows"] == doc["rows"]
