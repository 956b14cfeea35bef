"""Plan scaling: a draft per (kind, size), each point with its Spec-Bench tau (eval:KIND:S), spread over calls of
a budget; stages faked, and once end to end on CPU with a random 2-layer target."""

import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest

from eyas.recipes import DONE, LEFT, load_recipe, run_recipe
from eyas.recipes import runner as R
from eyas.recipes import scaling as S
from eyas.recipes import stages
from tests.data.templates import make_tokenizer
from tests.recipes.tiny import FILES, tiny_target

matplotlib.use("Agg")
# pyplot's first import on a fresh machine builds matplotlib's font cache by running fc-list through subprocess,
# which these tests replace with fakes: import it before they do
import matplotlib.pyplot  # noqa: E402,F401


def run(tmp_path, *sets, budget=None):
    recipe = load_recipe("scaling", ["target=T", "kinds=raw", "sizes=1000", "device=cpu", *sets])
    code, doc = run_recipe(recipe, tmp_path / "w", budget)
    return code, doc


def stages_run(tmp_path, monkeypatch, *sets, budget=None):
    """A call with every eyas stage faked (exit 0): the stages started, by name, and their command lines."""
    ran = {}

    def fake(cmd, env=None, timeout=None):
        ran[cmd[3]] = cmd[4:]
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(R.subprocess, "run", fake)
    monkeypatch.setattr(S, "tokens_per_row", lambda *a: 600.0)
    code, doc = run(tmp_path, *sets, budget=budget)
    return ran, doc, code


def test_each_trained_point_gets_an_eager_spec_bench_eval(tmp_path, monkeypatch):
    ran, doc, _ = stages_run(tmp_path, monkeypatch)
    assert list(ran) == ["prepare", "train", "eval"]
    cmd = " ".join(ran["eval"])
    for part in ("--chain 3", "--tree total=60,depth=7,topk=10", "--per-category 1", "--max-new-tokens 256",
                 "--temperature 0", "--no-compile", "run-raw-1000", f"--baseline-cache {tmp_path / 'w' / 'baseline-cache'}"):
        assert part in cmd
    assert "eval:raw:1000" in json.loads((tmp_path / "w" / "state.json").read_text())["done"]
    assert doc["eval"]["spec_bench_questions"] == 13 and doc["eval"]["spec_bench_chain"] == "chain-3"


def test_a_gpu_eval_is_compiled_at_one_kv_bucket(tmp_path, monkeypatch):
    ran, _, _ = stages_run(tmp_path, monkeypatch, "eval_compile=true")   # the default where the device is cuda
    cmd = " ".join(ran["eval"])
    assert "--compile --min-bucket 1000000" in cmd and "--no-compile" not in cmd


def test_skip_eval_trains_only(tmp_path, monkeypatch):
    ran, doc, _ = stages_run(tmp_path, monkeypatch, "skip_eval=true")
    assert list(ran) == ["prepare", "train"] and doc["eval"] is None


def test_more_than_one_epoch_evaluates_held_out_at_each_epoch_end(tmp_path, monkeypatch):
    ran, _, _ = stages_run(tmp_path / "a", monkeypatch)                      # epochs 2 (the recipe's default)
    assert "--eval-every-epoch" in ran["train"]
    ran, _, _ = stages_run(tmp_path / "b", monkeypatch, "epochs=1")
    assert "--eval-every-epoch" not in ran["train"]


def test_skip_train_makes_the_data_only_and_a_later_call_trains(tmp_path, monkeypatch):
    ran, doc, code = stages_run(tmp_path, monkeypatch, "skip_train=true")
    assert list(ran) == ["prepare"] and not doc["complete"] and code == LEFT
    assert doc["left"] == ["train:raw:1000", "eval:raw:1000"] and doc["points"] == []
    ran, doc, _ = stages_run(tmp_path, monkeypatch)
    assert list(ran) == ["train", "eval"] and doc["complete"]    # the prep done before is not made again


def test_an_eval_that_cannot_fit_the_budget_waits_for_the_next_call(tmp_path, monkeypatch):
    ran, doc, code = stages_run(tmp_path, monkeypatch, "eval_est_s=400", budget=300)
    assert list(ran) == ["prepare", "train"] and not doc["complete"] and code == LEFT
    assert doc["left"] == ["eval:raw:1000"]
    state = tmp_path / "w" / "state.json"   # once an eval is timed here, 1.5x that is what the next one needs
    st = json.loads(state.read_text())
    st["done"]["eval:raw:10"] = 150.0
    state.write_text(json.dumps(st))
    ran, _, _ = stages_run(tmp_path, monkeypatch, "eval_est_s=400", budget=100)
    assert "eval" not in ran
    ran, _, _ = stages_run(tmp_path, monkeypatch, "eval_est_s=400", budget=300)
    assert "eval" in ran


def test_an_eval_that_cannot_fit_does_not_hold_back_the_next_point_s_training(tmp_path, monkeypatch, capsys):
    """An eval waits for a call with time for it; the next point's training (resumable) goes on meanwhile. Then a
    call that can start nothing at all says so, so a loop of calls stops."""
    ran = []

    def fake(cmd, env=None, timeout=None):
        ran.append((cmd[3], cmd[cmd.index("--out") + 1].rsplit("/", 1)[-1]))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(R.subprocess, "run", fake)
    monkeypatch.setattr(S, "tokens_per_row", lambda *a: 600.0)
    code, _ = run(tmp_path, "sizes=1000,2000", "eval_est_s=400", budget=300)
    assert code == LEFT
    assert [r for r in ran if r[0] == "train"] == [("train", "run-raw-1000"), ("train", "run-raw-2000")]
    assert not [r for r in ran if r[0] == "eval"]
    ran.clear()
    capsys.readouterr()
    code, _ = run(tmp_path, "sizes=1000,2000", "eval_est_s=400", budget=300)
    assert code == LEFT and ran == [] and "no step fits" in capsys.readouterr().out   # only the evals are left
    code, _ = run(tmp_path, "sizes=1000,2000", "eval_est_s=100", budget=300)   # time for them: both run
    assert code == DONE and [r[1] for r in ran] == ["eval-raw-1000.json", "eval-raw-2000.json"]


def test_an_eval_longer_than_the_budget_still_gets_a_full_call(tmp_path):
    """need = 1.5x the longest eval seen, capped below the budget: an eval of 377 s would need 566 s in 540-s calls
    and never start; capped at the budget itself, a fresh 420-s call could not start one of 381 s."""
    r = SimpleNamespace(state={"done": {"eval:raw:10": 377.0}}, budget_s=540)
    p = SimpleNamespace(eval_est_s=180)
    assert stages.eval_need(r, p) == 0.9 * 540   # a fresh call has spent its first seconds before the eval
    r.state["done"]["eval:raw:10"] = 600.0   # one that cannot fit any call: 1.5x, so it never starts
    assert stages.eval_need(r, p) == 900
    assert stages.eval_need(SimpleNamespace(state={"done": {}}, budget_s=540), p) == 180


@pytest.mark.parametrize("tokens_per_row, expect_preps, expect_rows", [
    (lambda n: 1238 * n, 2, None),          # shorter rows than estimated: prepared again with more rows
    (lambda n: 2200 * n, 1, None),          # the estimate held: one prepare
    (lambda n: 1238 * min(n, 500), 3, 500),  # the source runs out at 500 rows: stops once no more come
])
def test_a_point_short_of_its_size_is_prepared_again(tmp_path, tokens_per_row, expect_preps, expect_rows):
    p = SimpleNamespace(target="T", max_length=2048, draft_vocab_size=32000)
    r = R.Runner(tmp_path / "w")
    prep, preps = tmp_path / "prep", []

    def eyas(name, *args, need=20):   # a fake `eyas prepare`: tokens from the rows asked for
        n = int(args[args.index("--max-samples") + 1])
        preps.append((name, n))
        prep.mkdir(exist_ok=True)
        (prep / "manifest.json").write_text(json.dumps({"summary": {"tokens": tokens_per_row(n)}}))
        r.state["done"][name] = 1.0
        return True

    r.eyas = eyas
    assert S.prep_to_size(r, p, "raw", "src.json", 1_000_000, 2160.0, prep)
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
    FakeEval.events, FakeEval.rc = [], rc

    def fake(cmd, env=None, timeout=None):
        FakeEval.events.append(("run", cmd[3], Path(cmd[cmd.index("--out") + 1]).name))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(R.subprocess, "run", fake)
    monkeypatch.setattr(R.subprocess, "Popen", FakeEval)
    monkeypatch.setattr(S, "tokens_per_row", lambda *a: 600.0)
    run(tmp_path, "sizes=1000,2000", "eval_background=true")
    return json.loads((tmp_path / "w" / "state.json").read_text())


def test_background_evals_run_beside_the_next_point_s_training(tmp_path, monkeypatch):
    """eval_background (the GPU default): a point's eval starts, the next point's prepare and train run while it
    does, and both evals are recorded done (with their seconds) once they exit 0."""
    state = background_run(tmp_path, monkeypatch)
    ev = FakeEval.events
    assert ev.index(("start", "eval", "run-raw-1000")) < ev.index(("run", "train", "run-raw-2000")) \
        < ev.index(("end", "eval", "run-raw-1000"))
    assert ev.index(("start", "eval", "run-raw-2000")) < ev.index(("end", "eval", "run-raw-2000"))
    assert {"eval:raw:1000", "eval:raw:2000"} <= set(state["done"])
    assert (tmp_path / "w" / "eval-raw-1000.log").is_file()


def test_a_background_eval_says_it_shares_the_device_and_a_foreground_one_does_not(tmp_path, monkeypatch):
    """Beside training its timings describe the neighbour too: it reports tau, no speedup (--timings-shared)."""
    cmds = []
    real = FakeEval.__init__
    monkeypatch.setattr(FakeEval, "__init__", lambda self, cmd, **kw: cmds.append(cmd) or real(self, cmd, **kw))
    background_run(tmp_path, monkeypatch)
    assert cmds and all("--timings-shared" in c for c in cmds if c[3] == "eval")
    ran = {}
    monkeypatch.setattr(R.subprocess, "run", lambda cmd, env=None, timeout=None: ran.setdefault(cmd[3], cmd)
                        and subprocess.CompletedProcess(cmd, 0))
    run(tmp_path / "fg", "sizes=1000", "eval_background=false")
    assert "eval" in ran and "--timings-shared" not in ran["eval"]


def test_a_failing_background_eval_stops_the_run_naming_its_log(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"eval:raw:1000 failed \(exit 3\); see .*eval-raw-1000\.log"):
        background_run(tmp_path, monkeypatch, rc=3)


@pytest.mark.parametrize("tpr, more", [(402.0, 27364), (600.0, None)])
def test_generation_short_of_the_largest_size_is_topped_up(tmp_path, monkeypatch, tpr, more):
    """Rows shorter than est_tokens_per_row (self-written: 402 tokens, not 600) make a second gen stage that
    asks regenerate (which resumes) for the rows the measured length needs; an estimate that held makes none."""
    ran = []

    def fake(cmd, env=None, timeout=None):
        ran.append((cmd[3], cmd[cmd.index("--max-samples") + 1] if "--max-samples" in cmd else None))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(R.subprocess, "run", fake)
    monkeypatch.setattr(S, "tokens_per_row", lambda *a: tpr)
    run(tmp_path, "kinds=self", "sizes=1e7", "skip_eval=true")
    gens = [n for stage, n in ran if stage == "regenerate"]
    assert gens[0] == "18334" and gens[1:] == ([str(more)] if more else [])
    done = json.loads((tmp_path / "w" / "state.json").read_text())["done"]
    assert ("gen:self:more" in done) == bool(more)


def test_a_stage_stopped_at_the_budget_counts_the_seconds_of_every_call(tmp_path, monkeypatch):
    """A training cut by the budget and resumed by the next call: its point's train_seconds is both calls' time."""
    calls = {"train": 0}

    def fake(cmd, env=None, timeout=None):
        if cmd[3] == "train":
            calls["train"] += 1
            time.sleep(0.3 if calls["train"] == 1 else 0.1)
            if calls["train"] == 1:
                raise subprocess.TimeoutExpired(cmd, timeout)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(R.subprocess, "run", fake)
    monkeypatch.setattr(S, "tokens_per_row", lambda *a: 600.0)
    run(tmp_path, "skip_eval=true")
    _, doc = run(tmp_path, "skip_eval=true")   # resumes the training
    state = json.loads((tmp_path / "w" / "state.json").read_text())
    assert calls["train"] == 2
    assert state["done"]["train:raw:1000"] < 0.3 <= state["seconds"]["train:raw:1000"]
    assert doc["stage_seconds"]["train:raw:1000"] >= 0.4


def test_a_size_beyond_what_the_source_holds_is_not_trained_twice(tmp_path, monkeypatch):
    """Re-answered ShareGPT holds ~11M tokens: its "20M" point would train the "10M" point's data again. It is
    recorded as exhausted (the result says so) and the run completes."""
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

    monkeypatch.setattr(R.subprocess, "run", fake)
    monkeypatch.setattr(S, "tokens_per_row", lambda *a: 500.0)
    code, doc = run(tmp_path, "sizes=1000,4000", "skip_eval=true")
    assert code == DONE and [r for r in ran if r[0] == "train"] == [("train", "run-raw-1000")]
    assert doc["exhausted"] == {"raw:4000": {"tokens": 1500, "same_as": "raw:1000"}}
    assert doc["complete"] and [p["size"] for p in doc["points"]] == [1000]


def test_bad_params_are_refused_before_anything_is_written(tmp_path):
    for bad, msg in (("sizes=1e6,lots", "sizes=1e6,lots"), ("kinds=raw,bogus", "kinds=raw,bogus")):
        with pytest.raises(ValueError, match=msg):
            run(tmp_path, bad)
    assert not (tmp_path / "w").exists()


def test_tiny_end_to_end_with_spec_bench_tau(tmp_path, monkeypatch):
    """CPU sizes, one raw point: prepare, train, eval for real (tiny chain/tree, 16 tokens, 2 questions); then a
    rerun starts nothing and gives the same points."""
    tok = tmp_path / "tok"
    make_tokenizer("smollm2").save_pretrained(tok)
    words = "the a cat dog runs fast slow blue green house tree river stone light dark".split()
    data = tmp_path / "sg.json"
    data.write_text(json.dumps([{"id": str(i), "conversations": [
        {"from": "human", "value": " ".join(words[(i + j) % 15] for j in range(8 + i % 7))},
        {"from": "gpt", "value": " ".join(words[(3 * i + j) % 15] for j in range(20 + i % 11))}]} for i in range(60)]))
    target = tiny_target(tmp_path / "tiny-target", tok)
    recipe = load_recipe(FILES / "scaling-tiny.yaml", [f"target={target}", f"data={data}", "kinds=raw",
                                                       "sizes=1500"])
    code, doc = run_recipe(recipe, tmp_path / "w")
    (raw,) = doc["points"]
    assert code == DONE and doc["complete"] and raw["kind"] == "raw"
    assert raw["spec_bench_chain_tau"] >= 1 and raw["spec_bench_tree_tau"] >= 1 and raw["tau"] >= 1
    assert list(raw["held_out_tau_by_step"].values())[-1] == raw["tau"]
    assert (raw["spec_bench_chain"], raw["spec_bench_tree"]) == ("chain-2", "tree(total=6,depth=3,topk=2)")
    assert raw["spec_bench_questions"] == 2 and raw["spec_bench_max_new_tokens"] == 16 and raw["eval_seconds"] > 0
    assert {k: raw[k] for k in doc["eval"]} == doc["eval"]
    assert Path(doc["files"]["plot"]).stat().st_size > 1000

    monkeypatch.setattr(R.subprocess, "run", lambda *a, **k: pytest.fail(f"rerun started {a}"))
    code, again = run_recipe(recipe, tmp_path / "w")   # every step is recorded done: nothing runs
    assert code == DONE and again["points"] == doc["points"]
