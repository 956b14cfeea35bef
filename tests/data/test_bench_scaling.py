"""bench/scaling.py: the scaling curve built over several GPU sessions, a few points each (--merge), each point
with its Spec-Bench tau (eval:KIND:S); end to end on CPU with --tiny."""

import importlib
import importlib.util
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest

from tests.data.templates import make_tokenizer

matplotlib.use("Agg")
# pyplot's first import on a fresh machine builds matplotlib's font cache by running fc-list through subprocess,
# which these tests replace with fakes: import it before they do
import matplotlib.pyplot  # noqa: E402,F401

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scaling.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_scaling", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RECIPE = {"ttt": 7, "epochs": 2.0, "lr": 1e-3, "batch": 8, "vocab": 32000, "max_length": 2048}


def earlier(tmp_path, **recipe):
    prev = tmp_path / "prev.json"
    prev.write_text(json.dumps({"target": "T", "recipe": {**RECIPE, **recipe}, "points": [
        {"kind": "raw", "size": 1000, "tokens": 1010, "tau": 1.5},
        {"kind": "regen", "size": 1000, "tokens": 990, "tau": 1.7}]}))
    return prev


def test_merged_points_are_kept_and_not_recomputed(tmp_path, monkeypatch):
    mod = load()
    ran = []
    monkeypatch.setattr(mod.Runner, "eyas", lambda self, name, *a: ran.append(name) or False)
    out = tmp_path / "scaling.json"
    # train-only calls (merged points without Spec-Bench tau are computed again by a call that evaluates: below)
    mod.main(["--target", "T", "--kinds", "raw", "--sizes", "1000", "--work", str(tmp_path / "w"), "--device", "cpu",
              "--merge", str(earlier(tmp_path)), "--out", str(out), "--skip-eval"])
    doc = json.loads(out.read_text())
    assert ran == []                                   # nothing left to compute
    assert doc["complete"] and sorted(p["kind"] for p in doc["points"]) == ["raw", "regen"]  # all merged points
    assert (tmp_path / "scaling.png").stat().st_size > 1000

    ran.clear()   # a size the earlier run lacks is computed (here: its first stage is attempted)
    mod.main(["--target", "T", "--kinds", "raw", "--sizes", "1000,2000", "--work", str(tmp_path / "w"),
              "--device", "cpu", "--merge", str(earlier(tmp_path)), "--out", str(out), "--skip-eval"])
    assert ran and not json.loads(out.read_text())["complete"]


def test_merge_refuses_another_recipe(tmp_path):
    mod = load()
    with pytest.raises(SystemExit, match="another recipe"):
        mod.main(["--target", "T", "--kinds", "raw", "--sizes", "1000", "--work", str(tmp_path / "w"),
                  "--device", "cpu", "--merge", str(earlier(tmp_path, ttt=3)), "--out", str(tmp_path / "o.json")])


def test_merge_of_two_sessions_keeps_the_first_of_a_repeated_point(tmp_path):
    mod = load()
    a = earlier(tmp_path)
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"target": "T", "recipe": RECIPE, "points": [
        {"kind": "raw", "size": 1000, "tau": 9.9}, {"kind": "self", "size": 3000, "tau": 1.8}]}))
    args = SimpleNamespace(target="T", skip_eval=True, **RECIPE)
    pts = {(p["kind"], p["size"]): p["tau"] for p in mod.merged_points([a, b], args)}
    assert pts == {("raw", 1000): 1.5, ("regen", 1000): 1.7, ("self", 3000): 1.8}


def test_merge_refuses_spec_bench_tau_of_another_eval_setting(tmp_path):
    mod = load()
    prev = earlier(tmp_path)
    doc = json.loads(prev.read_text())
    doc["points"][0].update(spec_bench_chain_tau=1.5, spec_bench_tree_tau=2.0, spec_bench_chain="chain-3",
                            spec_bench_tree="tree(total=60,depth=7,topk=10)", spec_bench_questions=13,
                            spec_bench_categories=["writing"], spec_bench_max_new_tokens=512)   # not this call's 256
    prev.write_text(json.dumps(doc))
    argv = ["--target", "T", "--kinds", "raw", "--sizes", "1000", "--work", str(tmp_path / "w"), "--device", "cpu",
            "--merge", str(prev), "--out", str(tmp_path / "o.json")]
    with pytest.raises(SystemExit, match="different eval settings"):
        mod.main(argv)
    mod.main(argv + ["--skip-eval"])   # a train-only session keeps them (one setting among the merged points)


def stages(tmp_path, monkeypatch, *flags):
    """main() with every eyas stage faked (exit 0): the stages started, by name, and their command lines."""
    mod = load()
    ran = {}

    def fake(cmd, env=None, timeout=None):
        ran[cmd[3]] = cmd[4:]
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(mod.subprocess, "run", fake)
    monkeypatch.setattr(mod, "tokens_per_row", lambda *a: 600.0)
    out = tmp_path / "o.json"
    mod.main(["--target", "T", "--kinds", "raw", "--sizes", "1000", "--work", str(tmp_path / "w"), "--device", "cpu",
              "--out", str(out), *flags])
    return ran, json.loads(out.read_text())


def test_each_trained_point_gets_an_eager_spec_bench_eval(tmp_path, monkeypatch):
    ran, doc = stages(tmp_path, monkeypatch)
    assert list(ran) == ["prepare", "train", "eval"]
    cmd = " ".join(ran["eval"])
    for part in ("--chain 3", "--tree total=60,depth=7,topk=10", "--per-category 1", "--max-new-tokens 256",
                 "--temperature 0", "--no-compile", "run-raw-1000", f"--baseline-cache {tmp_path / 'w' / 'baseline-cache'}"):
        assert part in cmd
    assert "eval:raw:1000" in json.loads((tmp_path / "w" / "state.json").read_text())["done"]
    assert doc["eval"]["spec_bench_questions"] == 13 and doc["eval"]["spec_bench_chain"] == "chain-3"


def test_a_gpu_eval_is_compiled_at_one_kv_bucket(tmp_path, monkeypatch):
    ran, doc = stages(tmp_path, monkeypatch, "--eval-compile")   # the default where --device is cuda
    cmd = " ".join(ran["eval"])
    assert "--compile --min-bucket 1000000" in cmd and "--no-compile" not in cmd


def test_skip_eval_trains_only(tmp_path, monkeypatch):
    ran, doc = stages(tmp_path, monkeypatch, "--skip-eval")
    assert list(ran) == ["prepare", "train"] and doc["eval"] is None


def test_an_eval_that_cannot_fit_the_budget_waits_for_the_next_call(tmp_path, monkeypatch):
    ran, doc = stages(tmp_path, monkeypatch, "--budget-s", "300", "--eval-est-s", "400")
    assert list(ran) == ["prepare", "train"] and not doc["complete"]
    state = tmp_path / "w" / "state.json"   # once an eval is timed here, 1.5x that is what the next one needs
    state.write_text(json.dumps({"done": {"eval:raw:10": 150.0}}))
    ran, _ = stages(tmp_path, monkeypatch, "--budget-s", "100", "--eval-est-s", "1")
    assert "eval" not in ran
    ran, _ = stages(tmp_path, monkeypatch, "--budget-s", "300", "--eval-est-s", "1000")
    assert "eval" in ran


def test_an_eval_that_cannot_fit_does_not_hold_back_the_next_point_s_training(tmp_path, monkeypatch, capsys):
    """An eval waits for a call with time for it; the next point's training (resumable) goes on meanwhile. Then a
    call that can start nothing at all exits 3 and says so, so a loop of calls stops (it once called 48 times)."""
    mod = load()
    ran = []

    def fake(cmd, env=None, timeout=None):
        ran.append((cmd[3], cmd[cmd.index("--out") + 1].rsplit("/", 1)[-1]))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(mod.subprocess, "run", fake)
    monkeypatch.setattr(mod, "tokens_per_row", lambda *a: 600.0)
    argv = ["--target", "T", "--kinds", "raw", "--sizes", "1000,2000", "--work", str(tmp_path / "w"),
            "--device", "cpu", "--out", str(tmp_path / "o.json"), "--budget-s", "300", "--eval-est-s", "400"]
    assert mod.main(argv) == 0
    assert [r for r in ran if r[0] == "train"] == [("train", "run-raw-1000"), ("train", "run-raw-2000")]
    assert not [r for r in ran if r[0] == "eval"]
    ran.clear()
    assert mod.main(argv) == 3 and ran == []          # only the two evals are left, and neither fits
    assert "no step fits" in capsys.readouterr().out
    assert mod.main(argv[:-2] + ["--eval-est-s", "100"]) == 0   # time for them: both run
    assert [r[1] for r in ran] == ["eval-raw-1000.json", "eval-raw-2000.json"]
    assert {"eval:raw:1000", "eval:raw:2000"} <= set(json.loads((tmp_path / "w" / "state.json").read_text())["done"])


def test_an_eval_longer_than_the_budget_still_gets_a_full_call(tmp_path, monkeypatch):
    """need = 1.5x the longest eval seen, capped below --budget-s: an eval of 377 s once needed 566 s in 540-s calls
    and never started; capped at the budget itself, a fresh 420-s call could not start one of 381 s (2026-12-04)."""
    mod = load()
    r = SimpleNamespace(state={"done": {"eval:raw:10": 377.0}}, work=tmp_path,
                        a=SimpleNamespace(target="T", eval_categories="", eval_per_category=1, eval_max_new_tokens=256,
                                          eval_chain=3, eval_tree="total=6,depth=3,topk=2", device="cuda",
                                          eval_compile=True, eval_min_bucket=10 ** 6, budget_s=540, eval_est_s=180))
    needs = []
    r.eyas = lambda name, *args, need: needs.append(need) or True
    mod.spec_bench(r, "raw", 20)
    assert needs == [0.9 * 540]   # below the budget: a fresh call has spent its first seconds before the eval
    r.state["done"]["eval:raw:10"], needs[:] = 600.0, []   # one that cannot fit any call: 1.5x, so it never starts
    mod.spec_bench(r, "raw", 20)
    assert needs == [900]


def test_a_merged_point_without_spec_bench_tau_is_computed_again_and_replaced(tmp_path, monkeypatch):
    mod = load()
    ran, doc = stages(tmp_path, monkeypatch, "--merge", str(earlier(tmp_path)))   # raw 1000: tau 1.5, no eval
    assert list(ran) == ["prepare", "train", "eval"]
    # the fakes leave no metrics, so this call has no point of its own: the merged one stays, still unmeasured
    assert [p["tau"] for p in doc["points"] if p["kind"] == "raw"] == [1.5] and not doc["complete"]
    run = tmp_path / "w" / "run-raw-1000"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"split": "eval", "step": 4, "tau": 2.25, "acc": [0.5]}) + "\n")
    (tmp_path / "w" / "prep-raw-1000").mkdir(exist_ok=True)
    (tmp_path / "w" / "prep-raw-1000" / "manifest.json").write_text(json.dumps({"summary": {"tokens": 999}}))
    cats = {c: {} for c in doc["eval"]["spec_bench_categories"]}   # all 13: the setting this call evaluates in
    ev = {"questions": 13, "results": [
        {"setting": s, "tau": t, "per_category": cats, "decode": {"max_new_tokens": 256, "compiled": False}}
        for s, t in (("chain-3", 1.7), ("tree(total=60,depth=7,topk=10)", 2.4))]}
    (tmp_path / "w" / "eval-raw-1000.json").write_text(json.dumps(ev))
    ran, doc = stages(tmp_path, monkeypatch, "--merge", str(earlier(tmp_path)))
    raw = [p for p in doc["points"] if p["kind"] == "raw"]
    assert ran == {} and len(raw) == 1 and raw[0]["tau"] == 2.25 and raw[0]["spec_bench_tree_tau"] == 2.4
    assert raw[0]["spec_bench_compiled"] is False and doc["complete"]


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
    args = SimpleNamespace(target="T", skip_eval=True, **RECIPE)
    (pt,) = mod.merged_points([best_draft_json(tmp_path)], args)
    assert (pt["kind"], pt["size"], pt["tokens"], pt["tau"], pt["steps"]) == ("self", 30_123_456, 30_123_456, 5.1, 3676)
    assert (pt["spec_bench_chain_tau"], pt["spec_bench_tree_tau"], pt["spec_bench_questions"]) == (2.7, 5.0, 13)
    assert pt["from"] == "best_draft bd.json" and pt["spec_bench_compiled"] is True
    for over, msg in (({"complete": False}, "not complete"),
                      ({"recipe": {"target": "T", **RECIPE, "epochs": 3.0}}, "another recipe"),
                      ({"recipe": {"target": "U", **RECIPE}}, "another recipe")):
        with pytest.raises(SystemExit, match=msg):
            mod.merged_points([best_draft_json(tmp_path, **over)], args)


def test_a_mixed_best_draft_run_is_a_point_of_its_own_on_the_first_question_of_each_category(tmp_path):
    """A run of kinds regen,self evaluated on 2 questions a category: kind "regen+self", and the tau of the first
    question of each category (the curve's 13-question setting), not the 26-question mean; without those records
    it is refused (a 26-question tau is not comparable)."""
    mod = load()
    args = SimpleNamespace(target="T", skip_eval=True, **RECIPE)
    first = {"chain-3": 2.63, "tree(total=60,depth=7,topk=10)": 4.72}
    t0 = {"chain_tau": 2.67, "tree_tau": 4.79, "chain": "chain-3", "tree": "tree(total=60,depth=7,topk=10)",
          "questions": 4, "max_new_tokens": 256, "compiled": True, "seconds": 136.0,
          "settings": {s: {"tau": 0.0, "first_per_category": {"tau": t, "questions": 2, "turns": 3}}
                       for s, t in first.items()}}
    two = {"recipe": {"target": "T", **RECIPE, "eval_per_category": 2}, "kinds": ["regen", "self"]}
    (pt,) = mod.merged_points([best_draft_json(tmp_path, spec_bench={"t0": t0}, **two)], args)
    assert (pt["kind"], pt["spec_bench_chain_tau"], pt["spec_bench_tree_tau"], pt["spec_bench_questions"]) == \
        ("regen+self", 2.63, 4.72, 2)
    old = {**t0, "settings": {}}
    with pytest.raises(SystemExit, match="no first_per_category"):
        mod.merged_points([best_draft_json(tmp_path, spec_bench={"t0": old}, **two)], args)


def test_tiny_end_to_end_with_spec_bench_tau(tmp_path, monkeypatch):
    """--tiny on CPU, one raw point: prepare, train, eval for real (tiny chain/tree, 16 tokens, 2 questions), merged
    with an old-style point that has no Spec-Bench tau; then a rerun starts nothing."""
    mod = load()
    tok = tmp_path / "tok"
    make_tokenizer("smollm2").save_pretrained(tok)
    words = "the a cat dog runs fast slow blue green house tree river stone light dark".split()
    data = tmp_path / "sg.json"
    data.write_text(json.dumps([{"id": str(i), "conversations": [
        {"from": "human", "value": " ".join(words[(i + j) % 15] for j in range(8 + i % 7))},
        {"from": "gpt", "value": " ".join(words[(3 * i + j) % 15] for j in range(20 + i % 11))}]} for i in range(60)]))
    work, out = tmp_path / "w", tmp_path / "scaling.json"
    old = tmp_path / "old.json"   # written before this change: no "eval", no spec_bench_* keys
    old.write_text(json.dumps({"target": str(work / "tiny-target"), "points": [
        {"kind": "regen", "size": 1500, "tokens": 1490, "tau": 1.2}],
        "recipe": {"ttt": 2, "epochs": 1.0, "lr": 1e-3, "batch": 2, "vocab": 512, "max_length": 256}}))
    argv = ["--tiny", "--target", str(tok), "--data", str(data), "--kinds", "raw", "--sizes", "1500",
            "--work", str(work), "--merge", str(old), "--out", str(out)]
    mod.main(argv)
    doc = json.loads(out.read_text())
    pts = {p["kind"]: p for p in doc["points"]}
    raw = pts["raw"]
    assert doc["complete"] and set(pts) == {"raw", "regen"} and "spec_bench_tree_tau" not in pts["regen"]
    assert raw["spec_bench_chain_tau"] >= 1 and raw["spec_bench_tree_tau"] >= 1 and raw["tau"] >= 1
    assert (raw["spec_bench_chain"], raw["spec_bench_tree"]) == ("chain-2", "tree(total=6,depth=3,topk=2)")
    assert raw["spec_bench_questions"] == 2 and raw["spec_bench_max_new_tokens"] == 16 and raw["eval_seconds"] > 0
    assert {k: raw[k] for k in importlib.import_module("_scaling_points").EVAL_KEYS} == doc["eval"]
    assert out.with_suffix(".png").stat().st_size > 1000

    monkeypatch.setattr(mod.subprocess, "run", lambda *a, **k: pytest.fail(f"rerun started {a}"))
    mod.main(argv)   # every step is recorded done, so nothing runs and the same points come back
    assert json.loads(out.read_text())["points"] == doc["points"]


@pytest.mark.parametrize("tokens_per_row, expect_preps, expect_rows", [
    (lambda n: 1238 * n, 2, None),          # shorter rows than estimated: prepared again with more rows
    (lambda n: 2200 * n, 1, None),          # the estimate held: one prepare
    (lambda n: 1238 * min(n, 500), 3, 500),  # the source runs out at 500 rows: stops once no more come
])
def test_a_point_short_of_its_size_is_prepared_again(tmp_path, tokens_per_row, expect_preps, expect_rows):
    mod = load()
    a = SimpleNamespace(target="T", max_length=2048, vocab=32000, budget_s=1e9)
    r = SimpleNamespace(a=a, state={"done": {}})
    prep, preps = tmp_path / "prep", []

    def eyas(name, *args, need=20):   # a fake `eyas prepare`: tokens from the rows asked for
        n = int(args[args.index("--max-samples") + 1])
        preps.append((name, n))
        prep.mkdir(exist_ok=True)
        (prep / "manifest.json").write_text(json.dumps({"summary": {"tokens": tokens_per_row(n)}}))
        r.state["done"][name] = 1.0
        return True

    r.eyas = eyas
    assert mod.prep_to_size(r, "raw", "src.json", 1_000_000, 2160.0, prep)
    assert len(preps) == expect_preps and preps[0] == ("prep:raw:1000000", 488)
    got = json.loads((prep / "manifest.json").read_text())["summary"]["tokens"]
    if expect_rows is None:
        assert got >= 950_000
    else:
        assert got == 1238 * expect_rows
    if expect_preps > 1:
        assert preps[1][0] == "prep:raw:1000000:1" and preps[1][1] > 488


class FakeEval:
    """subprocess.Popen for a background `eyas eval`: still running until waited for, then exits with `rc`."""
    events: list = []
    rc = 0

    def __init__(self, cmd, env=None, stdout=None, stderr=None):
        self.cmd, self.code = cmd, None
        FakeEval.events.append(("start", cmd[3], Path(cmd[cmd.index("--draft") + 1]).name))

    def poll(self):
        return self.code

    def wait(self, timeout=None):
        self.code = FakeEval.rc
        FakeEval.events.append(("end", self.cmd[3], Path(self.cmd[self.cmd.index("--draft") + 1]).name))
        return self.code

    def kill(self):
        self.code = -9


def background_run(tmp_path, monkeypatch, rc=0):
    mod = load()
    FakeEval.events, FakeEval.rc = [], rc

    def fake(cmd, env=None, timeout=None):
        FakeEval.events.append(("run", cmd[3], Path(cmd[cmd.index("--out") + 1]).name))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(mod.subprocess, "run", fake)
    monkeypatch.setattr(mod.subprocess, "Popen", FakeEval)
    monkeypatch.setattr(mod, "tokens_per_row", lambda *a: 600.0)
    mod.main(["--target", "T", "--kinds", "raw", "--sizes", "1000,2000", "--work", str(tmp_path / "w"),
              "--device", "cpu", "--eval-background", "--out", str(tmp_path / "o.json")])
    return json.loads((tmp_path / "w" / "state.json").read_text())


def test_background_evals_run_beside_the_next_point_s_training(tmp_path, monkeypatch):
    """--eval-background (the GPU default): a point's eval starts, the next point's prepare and train run while it
    does, and both evals are recorded done (with their seconds) once they exit 0."""
    state = background_run(tmp_path, monkeypatch)
    ev = FakeEval.events
    assert ev.index(("start", "eval", "run-raw-1000")) < ev.index(("run", "train", "run-raw-2000")) \
        < ev.index(("end", "eval", "run-raw-1000"))
    assert ev.index(("start", "eval", "run-raw-2000")) < ev.index(("end", "eval", "run-raw-2000"))
    assert {"eval:raw:1000", "eval:raw:2000"} <= set(state["done"])
    assert (tmp_path / "w" / "eval-raw-1000.log").is_file()


def test_a_failing_background_eval_stops_the_run_naming_its_log(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match=r"eval:raw:1000 failed \(exit 3\); see .*eval-raw-1000\.log"):
        background_run(tmp_path, monkeypatch, rc=3)


@pytest.mark.parametrize("tpr, more", [(402.0, 27364), (600.0, None)])
def test_generation_short_of_the_largest_size_is_topped_up(tmp_path, monkeypatch, tpr, more):
    """Rows shorter than --est-tokens-per-row (self-written: 402 tokens, not 600) make a second gen stage that
    asks regenerate (which resumes) for the rows the measured length needs; an estimate that held makes none."""
    mod = load()
    ran = []

    def fake(cmd, env=None, timeout=None):
        ran.append((cmd[3], cmd[cmd.index("--max-samples") + 1] if "--max-samples" in cmd else None))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(mod.subprocess, "run", fake)
    monkeypatch.setattr(mod, "tokens_per_row", lambda *a: tpr)
    mod.main(["--target", "T", "--kinds", "self", "--sizes", "1e7", "--work", str(tmp_path / "w"), "--device", "cpu",
              "--skip-eval", "--out", str(tmp_path / "o.json")])
    gens = [n for stage, n in ran if stage == "regenerate"]
    assert gens[0] == "18334" and gens[1:] == ([str(more)] if more else [])
    done = json.loads((tmp_path / "w" / "state.json").read_text())["done"]
    assert ("gen:self:more" in done) == bool(more)


def test_a_stage_stopped_at_the_budget_counts_the_seconds_of_every_call(tmp_path, monkeypatch):
    """A training cut by the budget and resumed by the next call: its point's train_seconds is both calls' time
    (the done entry alone held the second call's)."""
    import time

    mod = load()
    calls = {"train": 0}

    def fake(cmd, env=None, timeout=None):
        if cmd[3] == "train":
            calls["train"] += 1
            time.sleep(0.3 if calls["train"] == 1 else 0.1)
            if calls["train"] == 1:
                raise subprocess.TimeoutExpired(cmd, timeout)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(mod.subprocess, "run", fake)
    monkeypatch.setattr(mod, "tokens_per_row", lambda *a: 600.0)
    argv = ["--target", "T", "--kinds", "raw", "--sizes", "1000", "--work", str(tmp_path / "w"), "--device", "cpu",
            "--skip-eval", "--out", str(tmp_path / "o.json")]
    mod.main(argv)
    mod.main(argv)   # resumes the training
    state = json.loads((tmp_path / "w" / "state.json").read_text())
    assert calls["train"] == 2
    assert state["done"]["train:raw:1000"] < 0.3 <= state["seconds"]["train:raw:1000"]
    assert json.loads((tmp_path / "o.json").read_text())["stage_seconds"]["train:raw:1000"] >= 0.4


def test_a_size_beyond_what_the_source_holds_is_not_trained_twice(tmp_path, monkeypatch):
    """Re-answered ShareGPT holds ~11M tokens: its "20M" point would train the "10M" point's data again. It is
    recorded as exhausted (the JSON says so, and a merging call does not try it again), and the run completes."""
    mod = load()
    ran = []

    def fake(cmd, env=None, timeout=None):
        out = Path(cmd[cmd.index("--out") + 1])
        ran.append((cmd[3], out.name))
        out.mkdir(parents=True, exist_ok=True)
        if cmd[3] == "prepare":   # the source holds 1,500 tokens, however many rows are asked for
            (out / "manifest.json").write_text(json.dumps({"summary": {"tokens": 1500, "rows_out": 3}}))
        if cmd[3] == "train":
            (out / "metrics.jsonl").write_text(json.dumps({"split": "eval", "step": 4, "tau": 2.0}) + "\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(mod.subprocess, "run", fake)
    monkeypatch.setattr(mod, "tokens_per_row", lambda *a: 500.0)
    out = tmp_path / "o.json"
    argv = ["--target", "T", "--kinds", "raw", "--sizes", "1000,4000", "--device", "cpu", "--skip-eval"]
    assert mod.main(argv + ["--work", str(tmp_path / "w"), "--out", str(out)]) == 0
    assert [r for r in ran if r[0] == "train"] == [("train", "run-raw-1000")]
    doc = json.loads(out.read_text())
    assert doc["exhausted"] == {"raw:4000": {"tokens": 1500, "same_as": "raw:1000"}}
    assert doc["complete"] and [p["size"] for p in doc["points"]] == [1000]
    ran.clear()   # a later call merging this JSON (another work dir) leaves the size alone
    assert mod.main(argv + ["--work", str(tmp_path / "w2"), "--out", str(tmp_path / "o2.json"), "--merge", str(out)]) == 0
    assert ran == [] and json.loads((tmp_path / "o2.json").read_text())["complete"]
