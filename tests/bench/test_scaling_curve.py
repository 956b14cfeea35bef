"""bench/scaling.py: the curve merged from several runs' results (scaling and best-draft), one recipe and one
Spec-Bench setting, else refused; the first file's point wins."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scaling.py"
RECIPE = {"ttt_steps": 7, "epochs": 2.0, "lr": 1e-3, "batch_size": 8, "draft_vocab_size": 32000, "max_length": 2048}
OLD = {"ttt": 7, "epochs": 2.0, "lr": 1e-3, "batch": 8, "vocab": 32000, "max_length": 2048}   # the first spelling


def load():
    spec = importlib.util.spec_from_file_location("bench_scaling", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def result(path: Path, points, recipe=None, target="T") -> Path:
    path.write_text(json.dumps({"bench": "scaling", "target": target, "recipe": recipe or RECIPE, "points": points}))
    return path


def test_points_of_several_runs_merge_the_first_of_a_repeated_point_kept(tmp_path):
    a = result(tmp_path / "a.json", [{"kind": "raw", "size": 1000, "tokens": 1010, "tau": 1.5},
                                     {"kind": "regen", "size": 1000, "tokens": 990, "tau": 1.7}], recipe=OLD)
    b = result(tmp_path / "b.json", [{"kind": "raw", "size": 1000, "tokens": 1000, "tau": 9.9},
                                     {"kind": "self", "size": 3000, "tokens": 3000, "tau": 1.8}])
    out = tmp_path / "curve.json"
    assert load().main(["--merge", str(a), str(b), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {(p["kind"], p["size"]): p["tau"] for p in doc["points"]} == \
        {("raw", 1000): 1.5, ("regen", 1000): 1.7, ("self", 3000): 1.8}
    assert doc["recipe"] == {"target": "T", **RECIPE} and out.with_suffix(".png").stat().st_size > 1000


def test_another_recipe_or_target_is_refused(tmp_path):
    a = result(tmp_path / "a.json", [{"kind": "raw", "size": 1000, "tokens": 1, "tau": 1.5}])
    for other in (result(tmp_path / "b.json", [], recipe={**RECIPE, "ttt_steps": 3}),
                  result(tmp_path / "c.json", [], target="U")):
        with pytest.raises(SystemExit, match="another recipe"):
            load().main(["--merge", str(a), str(other), "--out", str(tmp_path / "o.json")])


def test_spec_bench_tau_of_another_eval_setting_is_refused(tmp_path):
    setting = dict(spec_bench_chain="chain-3", spec_bench_tree="tree(total=60,depth=7,topk=10)",
                   spec_bench_questions=13, spec_bench_categories=["writing"], spec_bench_max_new_tokens=256)
    pt = {"kind": "raw", "size": 1000, "tokens": 1, "tau": 1.5, "spec_bench_chain_tau": 1.5, "spec_bench_tree_tau": 2.0}
    a = result(tmp_path / "a.json", [{**pt, **setting}])
    b = result(tmp_path / "b.json", [{**pt, "size": 2000, **setting, "spec_bench_max_new_tokens": 512}])
    with pytest.raises(SystemExit, match="different eval settings"):
        load().main(["--merge", str(a), str(b), "--out", str(tmp_path / "o.json")])


def best_draft_json(tmp_path, **over):
    doc = {"bench": "best_draft", "complete": True, "kinds": ["self"],
           "recipe": {"target": "T", **RECIPE}, "tokens": {"prepared": 30_123_456, "rows_out": 74_000},
           "held_out_last": {"step": 3676, "tau": 5.1, "acc": [0.9, 0.8]}, "step_seconds": {"train": 700.0},
           "eval": {"spec_bench_categories": [f"category{i}" for i in range(13)]},   # one question each
           "spec_bench": {"t0": {"chain_tau": 2.7, "tree_tau": 5.0, "chain": "chain-3",
                                 "tree": "tree(total=60,depth=7,topk=10)", "questions": 13, "max_new_tokens": 256,
                                 "compiled": True, "seconds": 120.0}}}
    doc.update(over)
    path = tmp_path / "bd.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_best_draft_run_of_one_kind_merges_as_that_kind_s_point(tmp_path):
    mod = load()
    pts = mod.merged([best_draft_json(tmp_path)])["points"]
    (pt,) = pts
    assert (pt["kind"], pt["size"], pt["tokens"], pt["tau"], pt["steps"]) == ("self", 30_123_456, 30_123_456, 5.1, 3676)
    assert (pt["spec_bench_chain_tau"], pt["spec_bench_tree_tau"], pt["spec_bench_questions"]) == (2.7, 5.0, 13)
    assert pt["from"] == "best_draft bd.json" and pt["spec_bench_compiled"] is True
    with pytest.raises(SystemExit, match="not complete"):
        mod.merged([best_draft_json(tmp_path, complete=False)])
    a = result(tmp_path / "a.json", [])
    with pytest.raises(SystemExit, match="another recipe"):
        mod.merged([a, best_draft_json(tmp_path, recipe={"target": "T", **RECIPE, "epochs": 3.0})])


def test_a_mixed_best_draft_run_is_a_point_of_its_own_on_the_first_question_of_each_category(tmp_path):
    """A run of kinds regen,self evaluated on 2 questions a category: kind "regen+self", and the tau of the first
    question of each category (the curve's 13-question setting); without those records it is refused."""
    mod = load()
    first = {"chain-3": 2.63, "tree(total=60,depth=7,topk=10)": 4.72}
    t0 = {"chain_tau": 2.67, "tree_tau": 4.79, "chain": "chain-3", "tree": "tree(total=60,depth=7,topk=10)",
          "questions": 4, "max_new_tokens": 256, "compiled": True, "seconds": 136.0,
          "settings": {s: {"tau": 0.0, "first_per_category": {"tau": t, "questions": 2, "turns": 3}}
                       for s, t in first.items()}}
    two = {"recipe": {"target": "T", **RECIPE, "eval_per_category": 2}, "kinds": ["regen", "self"]}
    (pt,) = mod.merged([best_draft_json(tmp_path, spec_bench={"t0": t0}, **two)])["points"]
    assert (pt["kind"], pt["spec_bench_chain_tau"], pt["spec_bench_tree_tau"], pt["spec_bench_questions"]) == \
        ("regen+self", 2.63, 4.72, 2)
    with pytest.raises(SystemExit, match="no first_per_category"):
        mod.merged([best_draft_json(tmp_path, spec_bench={"t0": {**t0, "settings": {}}}, **two)])


def test_the_committed_curve_merges_onto_itself():
    """bench/results/scaling.json (written by the first runner, its recipe in the first spelling) is a valid
    input: merging it alone gives back its points."""
    committed = BENCH.parent / "results" / "scaling.json"
    pts = load().merged([committed])["points"]
    key = lambda p: (p["kind"], p["size"])  # noqa: E731
    assert sorted(pts, key=key) == sorted(json.loads(committed.read_text())["points"], key=key)
