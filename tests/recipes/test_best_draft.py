"""Plan best-draft: data, online training, Spec-Bench tau at T=0 and T=1, spread over calls of a budget and
resumed from OUT/state.json; every eyas stage faked by a stand-in that writes what the stage would."""

import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest

from eyas.recipes import DONE, LEFT, load_recipe, run_recipe
from eyas.recipes import best_draft as B
from eyas.recipes import runner as R
from tests.data.templates import make_target_dir, make_tokenizer

matplotlib.use("Agg")
# pyplot's first import on a fresh machine builds matplotlib's font cache by running fc-list through subprocess,
# which these tests replace with fakes: import it before they do
import matplotlib.pyplot  # noqa: E402,F401

ANSWER = "the cat runs fast over the green house"


def sharegpt(path: Path, n: int = 60) -> Path:
    words = "the a cat dog runs fast slow blue green house tree river stone light dark".split()
    path.write_text(json.dumps([{"id": str(i), "conversations": [
        {"from": "human", "value": " ".join(words[(i + j) % 15] for j in range(8 + i % 7))},
        {"from": "gpt", "value": " ".join(words[(3 * i + j) % 15] for j in range(20 + i % 11))}]} for i in range(n)]))
    return path


def arg(cmd, flag):
    return cmd[cmd.index(flag) + 1]


class FakeStages:
    """Every eyas stage faked by writing what it would write; `cut` names stages that hit the budget once
    (after writing a checkpoint, as train does). Records each call's command lines by stage."""

    def __init__(self, tau=(2.7, 3.9), cut=(), eval_s=0.0):
        self.tau, self.cut, self.cmds, self.eval_s, self.spans = tau, set(cut), [], eval_s, {}

    def __call__(self, cmd, env=None, timeout=None):
        stage, args = cmd[3], cmd[4:]
        self.cmds.append((stage, args))
        out = Path(arg(args, "--out"))
        if stage == "regenerate":
            n = int(arg(args, "--max-samples"))
            out.write_text("".join(json.dumps({"row": i, "messages": [
                {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": ANSWER}]}) + "\n"
                for i in range(n)))
        elif stage == "prepare":
            out.mkdir(parents=True, exist_ok=True)
            rows = sum(1 for _ in open(arg(args, "--data")))
            (out / "manifest.json").write_text(json.dumps({"summary": {
                "tokens": 4000, "rows_out": rows, "packed_rows": 4, "masked_tokens": 2500}}))
        elif stage == "train":
            out.mkdir(parents=True, exist_ok=True)
            (out / "checkpoints" / "step-200").mkdir(parents=True, exist_ok=True)
            (out / "checkpoints" / "step-200" / "state.pt").write_bytes(b"x")
            (out / "metrics.jsonl").write_text("".join(json.dumps({"split": "eval", "step": s, "tau": 1 + s / 1000})
                                                       + "\n" for s in (400, 800)))
            if "train" in self.cut:
                self.cut.discard("train")
                raise subprocess.TimeoutExpired(cmd, timeout)
        elif stage == "eval":
            t0 = time.perf_counter()
            time.sleep(self.eval_s)
            self.spans[arg(args, "--temperature")] = (t0, time.perf_counter())
            out.write_text(json.dumps({"questions": 13, "results": [
                {"setting": "chain-3", "tau": self.tau[0], "accept_per_position": [0.7, 0.5, 0.4],
                 "identical_rate": 0.5, "unexplained_divergences": 0, "per_category": {"writing": {"tau": 2.5},
                                                                                         "coding": {"tau": 2.9}}},
                {"setting": "tree(total=60,depth=7,topk=10)", "tau": self.tau[1], "per_category": {"writing": {"tau": 4}},
                 "decode": {"max_new_tokens": 256}}]}))
        return subprocess.CompletedProcess(cmd, 0)

    def stages(self):
        return [s for s, _ in self.cmds]


@pytest.fixture
def target(tmp_path):
    return make_target_dir(tmp_path / "target")


def run(tmp_path, target, *sets, budget=None, out=None):
    recipe = load_recipe("best-draft", [f"target={target}", f"data={sharegpt(tmp_path / 'sg.json')}", "device=cpu",
                                        "max_samples=5", "self_prompts=3", *sets])
    return run_recipe(recipe, out or tmp_path / "w", budget)


def test_steps_resume_across_calls_and_the_result_says_what_was_reached(tmp_path, target, monkeypatch):
    fake = FakeStages(cut=["train"])
    monkeypatch.setattr(R.subprocess, "run", fake)
    code, doc = run(tmp_path, target)
    assert code == LEFT and not doc["complete"] and doc["left"] == ["train", "eval:t0", "eval:t1"]
    assert fake.stages() == ["regenerate", "regenerate", "prepare", "train"]   # train cut by the budget
    cmds = dict(fake.cmds)
    assert arg(cmds["prepare"], "--data") == str(tmp_path / "w" / "union.jsonl")
    assert sum(1 for _ in open(tmp_path / "w" / "union.jsonl")) == 5 + 3     # regen rows, then self rows
    t = cmds["train"]
    assert "--online" in t and "--resume" not in t
    assert [arg(t, f) for f in ("--save-every", "--ttt-steps", "--batch-size", "--lr")] == ["200", "7", "8", "0.001"]
    assert arg(fake.cmds[1][1], "--data") == "self:3"

    fake.cmds.clear()
    code, doc = run(tmp_path, target)
    assert code == DONE and doc["complete"] and doc["left"] == []
    assert fake.stages() == ["train", "eval", "eval"]              # nothing finished is redone
    assert "--resume" in fake.cmds[0][1]                            # from the checkpoint the cut call left
    assert [arg(c, "--temperature") for s, c in fake.cmds[1:]] == ["0", "1"]
    st = json.loads((tmp_path / "w" / "state.json").read_text())
    assert [c["ran"] for c in st["calls"]] == [["gen:regen", "gen:self", "prep", "train"],
                                               ["train", "eval:t0", "eval:t1"]]
    assert doc["seconds_total"] == pytest.approx(sum(c["seconds"] for c in st["calls"]), abs=0.11)
    assert set(doc["step_seconds"]) == {"gen:regen", "gen:self", "prep", "train", "eval:t0", "eval:t1"}
    tok = make_tokenizer("smollm2")
    n = len(tok(ANSWER, add_special_tokens=False)["input_ids"])
    q = [len(tok(f"question {i}", add_special_tokens=False)["input_ids"]) for i in range(3)]
    assert doc["tokens"]["generated"] == {"regen": 5 * n, "self": 3 * n + sum(q)}   # self: its prompts too
    assert doc["tokens"]["prepared"] == 4000 and doc["tokens"]["trained"] == 800 * 8 * 1000   # steps x rows x tok/row
    assert [(p["step"], p["tau"]) for p in doc["held_out_curve"]] == [(400, 1.4), (800, 1.8)]
    t0 = doc["spec_bench"]["t0"]
    assert (t0["chain_tau"], t0["tree_tau"], t0["chain"], t0["questions"]) == (2.7, 3.9, "chain-3", 13)
    assert doc["spec_bench"]["t1"]["temperature"] == 1
    chain = t0["settings"]["chain-3"]   # what a reader asks next, copied from eval's JSON
    assert chain["accept_per_position"] == [0.7, 0.5, 0.4] and chain["unexplained_divergences"] == 0
    assert chain["tau_by_category"] == {"coding": 2.9, "writing": 2.5}
    assert t0["settings"]["tree(total=60,depth=7,topk=10)"]["tau_by_category"] == {"writing": 4}
    assert doc["goals"] == {"tree_tau_goal": 4.0, "chain_tau_goal": 2.6, "tree_tau_met": False, "chain_tau_met": True}
    assert doc["recipe"]["epochs"] == 3.0 and doc["recipe"]["kinds"] == "regen,self"
    assert Path(doc["files"]["plot"]).stat().st_size > 1000
    assert json.loads((tmp_path / "w" / "result.json").read_text())["complete"]

    fake.cmds.clear()   # done: a third call starts nothing and adds no seconds
    code, doc2 = run(tmp_path, target)
    assert code == DONE and fake.cmds == [] and doc2["seconds_total"] == doc["seconds_total"]


class FakePopen:
    """subprocess.Popen for a background stage: the fake stage runs when waited for (so a span is start -> wait)."""

    def __init__(self, fake, cmd, env=None, stdout=None, stderr=None):
        self.fake, self.cmd, self.code, self.t0 = fake, cmd, None, time.perf_counter()
        stdout.write("a background stage's table\n")

    def poll(self):
        return self.code

    def wait(self, timeout=None):
        if self.code is None:
            self.fake(self.cmd)
            temp = arg(self.cmd[4:], "--temperature")
            self.fake.spans[temp] = (self.t0, self.fake.spans[temp][1])
            self.code = 0
        return self.code

    def kill(self):
        self.code = -9


@pytest.mark.parametrize("parallel", [True, False])
def test_the_two_evals_run_side_by_side_on_request(tmp_path, target, monkeypatch, capsys, parallel):
    """eval_parallel (the GPU default): eval:t0 and eval:t1 overlap in time and both are recorded done, with
    their seconds and the end of their logs in the output; without it they run one after the other."""
    fake = FakeStages(eval_s=0.5)
    monkeypatch.setattr(R.subprocess, "run", fake)
    monkeypatch.setattr(R.subprocess, "Popen", lambda *a, **k: FakePopen(fake, *a, **k))
    code, doc = run(tmp_path, target, f"eval_parallel={str(parallel).lower()}")
    assert code == DONE and doc["complete"]
    (a0, b0), (a1, b1) = fake.spans["0"], fake.spans["1"]
    assert (max(a0, a1) < min(b0, b1)) == parallel, fake.spans
    st = json.loads((tmp_path / "w" / "state.json").read_text())
    assert {"eval:t0", "eval:t1"} <= set(st["done"]) and st["seconds"]["eval:t1"] > 0
    assert {"eval:t0", "eval:t1"} <= set(st["calls"][-1]["ran"]) and "eval:t1" in st["finished_at"]
    assert ("a background stage's table" in capsys.readouterr().out) == parallel


def test_warm_ups_run_beside_the_data_steps_and_beside_training(tmp_path, target, monkeypatch):
    """warm_background (the GPU default): `eyas train --warm-only` starts before the first data step with the
    training's own graph-deciding flags and is waited for before training starts; `eyas eval --warm-only` starts on
    the first draft the training writes, with the evals' own flags, and is waited for before the evals."""
    import eyas.decode.prewarm as prewarm

    events = []

    class Stages(FakeStages):
        def __call__(self, cmd, env=None, timeout=None):
            events.append(("run", cmd[3]))
            done = super().__call__(cmd, env, timeout)
            if cmd[3] == "train":   # a draft, then time for Prewarm's watcher (it polls every 2 s) to see it
                out = Path(arg(cmd[4:], "--out"))
                (out / "model.safetensors").write_bytes(b"w")
                (out / "config.json").write_text("{}")
                time.sleep(2.5)
            return done

    class Proc:   # a niced background `python -m eyas.cli ...`
        def __init__(self, cmd, stdout=None, stderr=None):
            self.cmd, self.stage = cmd, cmd[cmd.index("eyas.cli") + 1]
            events.append(("start", self.stage, cmd))

        def wait(self, timeout=None):
            events.append(("end", self.stage))
            return 0

        def kill(self):
            pass

    fake = Stages()
    monkeypatch.setattr(R.subprocess, "run", fake)
    monkeypatch.setattr(prewarm.subprocess, "Popen", Proc)
    code, doc = run(tmp_path, target, "warm_background=true", "eval_compile=true", "eval_parallel=false")
    assert code == DONE and doc["complete"]
    seq = [e[:2] for e in events]
    assert seq.index(("start", "train")) < seq.index(("run", "regenerate"))
    assert seq.index(("run", "prepare")) < seq.index(("end", "train")) < seq.index(("run", "train")) \
        < seq.index(("start", "eval")) < seq.index(("end", "eval")) < seq.index(("run", "eval"))
    train_warm = next(e[2] for e in events if e[:2] == ("start", "train"))
    eval_warm = next(e[2] for e in events if e[:2] == ("start", "eval"))
    train = next(c for st, c in fake.cmds if st == "train")
    ev = next(c for st, c in fake.cmds if st == "eval")
    p = SimpleNamespace(target=str(target), ttt_steps=7, batch_size=8, lr=1e-3, device="cpu", train_args="")
    flags = B.train_flags(p)
    assert " ".join(flags) in " ".join(train_warm) and " ".join(flags) in " ".join(train)
    assert "--warm-only" in train_warm and arg(train_warm, "--max-length") == "2048"
    assert arg(train_warm, "--draft-vocab-size") == "32000"
    assert "--warm-only" in eval_warm and "--compile --min-bucket 1000000" in " ".join(eval_warm)
    for f in ("--per-category", "--max-new-tokens", "--chain", "--tree", "--target"):
        assert arg(eval_warm, f) == arg(ev, f)
    assert doc["train_warm"]["rc"] == 0 and doc["eval_warm"]["started"] and doc["eval_warm"]["rc"] == 0


def test_a_call_that_can_start_nothing_says_so(tmp_path, target, monkeypatch, capsys):
    monkeypatch.setattr(R.subprocess, "run", FakeStages())
    code, doc = run(tmp_path, target, budget=5)
    assert code == LEFT and not doc["complete"] and doc["seconds_total"] == 0
    assert "no step fits" in capsys.readouterr().out


def test_another_recipe_is_refused_naming_the_key_and_fresh_starts_over(tmp_path, target, monkeypatch):
    fake = FakeStages()
    monkeypatch.setattr(R.subprocess, "run", fake)
    run(tmp_path, target, "kinds=raw")
    with pytest.raises(ValueError, match=r"another recipe: lr=0.001 there, 0.002 now"):
        run(tmp_path, target, "kinds=raw", "lr=2e-3")
    with pytest.raises(ValueError, match=r"kinds='raw' there, 'regen' now"):
        run(tmp_path, target, "kinds=regen")
    fake.cmds.clear()
    recipe = load_recipe("best-draft", [f"target={target}", f"data={tmp_path / 'sg.json'}", "device=cpu",
                                        "max_samples=5", "kinds=raw", "lr=2e-3"])
    code, doc = run_recipe(recipe, tmp_path / "w", fresh=True)
    assert code == DONE and fake.stages() == ["prepare", "train", "eval", "eval"]
    assert "--overwrite" in dict(fake.cmds)["train"]   # the earlier recipe's run is replaced, not resumed


def test_bad_params(tmp_path, target):
    with pytest.raises(ValueError, match="data=/nope.json: no such file"):
        run_recipe(load_recipe("best-draft", [f"target={target}", "data=/nope.json", "device=cpu"]), tmp_path / "w")
    with pytest.raises(ValueError, match="kinds=regen,bogus"):
        run(tmp_path, target, "kinds=regen,bogus")
    for kinds in ("regen,task", "task,self"):   # tasks are made from the self-written answers
        with pytest.raises(ValueError, match="put self before it"):
            run(tmp_path, target, f"kinds={kinds}", out=tmp_path / kinds)


def test_first_per_category_tau_is_the_one_per_category_question_set():
    """Two questions per category: tau over each category's first question alone (what a one-per-category eval
    measures); with one question per category nothing is added."""
    turns = [{"question_id": 1, "category": "a", "steps": 10, "emitted": 30},
             {"question_id": 1, "category": "a", "steps": 10, "emitted": 20},
             {"question_id": 2, "category": "a", "steps": 10, "emitted": 10},
             {"question_id": 7, "category": "b", "steps": 20, "emitted": 40},
             {"question_id": 8, "category": "b", "steps": 20, "emitted": 20}]
    got = B.first_per_category(turns)["first_per_category"]
    assert got == {"tau": (30 + 20 + 40) / (10 + 10 + 20), "questions": 2, "turns": 3}
    assert B.first_per_category([t for t in turns if t["question_id"] in (1, 7)]) == {}
    assert B.first_per_category([]) == {}


def test_an_out_seeded_with_more_rows_than_asked_trains_only_on_the_asked_ones(tmp_path, target):
    """An OUT seeded with rows generated earlier (50,000 self-written ones, say): a recipe asking for fewer takes
    the rows of its first self_prompts / max_samples inputs, in the union and in the generated-token count."""
    work = tmp_path / "w"
    work.mkdir()

    def rows(kind, n):
        with open(work / f"{kind}.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"row": i, "messages": [{"role": "user", "content": f"{kind} q{i}"},
                                                           {"role": "assistant", "content": ANSWER}]}) + "\n")

    rows("self", 5)
    rows("regen", 4)
    p = SimpleNamespace(work=work, max_samples=2, self_prompts=3, task_prompts=9, target=str(target))
    assert B.write_union(p, ["regen", "self"]) == {"regen": 2, "self": 3}
    union = [json.loads(x) for x in (work / "union.jsonl").read_text().splitlines()]
    assert [r["messages"][0]["content"] for r in union] == ["regen q0", "regen q1", "self q0", "self q1", "self q2"]
    one = B.generated_tokens(SimpleNamespace(**{**vars(p), "self_prompts": 1}), "self")
    assert B.generated_tokens(p, "self") == 3 * one > 0


@pytest.mark.slow   # ~2 min on a busy 2-core box; the FakeStages tests above cover the same logic fast
def test_tiny_end_to_end_over_two_calls(tmp_path, monkeypatch):
    """CPU sizes for real: a first call too short for the evals (their first estimate is 60 s > what is left of a
    40 s budget) makes progress and stops; the second finishes without redoing the first's steps; a third starts
    nothing."""
    from tests.recipes.tiny import FILES, tiny_target

    make_tokenizer("smollm2").save_pretrained(tmp_path / "tok")
    target = tiny_target(tmp_path / "tiny-target", tmp_path / "tok")
    recipe = load_recipe(FILES / "best-draft-tiny.yaml", [f"target={target}", f"data={sharegpt(tmp_path / 'sg.json')}",
                                                          "kinds=regen,self,task"])
    out = tmp_path / "w"
    code, _ = run_recipe(recipe, out, budget_s=40)
    first = json.loads((out / "state.json").read_text())
    assert code == LEFT and first["calls"][0]["finished"] and "eval:t0" not in first["done"]
    code, doc = run_recipe(recipe, out, budget_s=600)
    st = json.loads((out / "state.json").read_text())
    assert code == DONE and doc["complete"] and len(st["calls"]) == 2
    assert not set(st["calls"][1]["ran"]) & set(first["calls"][0]["finished"])
    assert all(st["finished_at"][s] == first["finished_at"][s] for s in first["calls"][0]["finished"])
    assert doc["seconds_total"] == pytest.approx(sum(c["seconds"] for c in st["calls"]), abs=0.11)
    for t in ("t0", "t1"):
        sb = doc["spec_bench"][t]
        assert sb["chain_tau"] >= 1 and sb["tree_tau"] >= 1 and sb["seconds"] > 0
        assert (sb["chain"], sb["tree"], sb["questions"]) == ("chain-2", "tree(total=6,depth=3,topk=2)", 2)
    assert all(x.get("unexplained_divergences", 0) == 0 for x in doc["spec_bench"]["t0"]["settings"].values())
    assert len(doc["held_out_curve"]) >= 2 and all(p["tau"] >= 1 for p in doc["held_out_curve"])
    assert doc["tokens"]["generated"]["task"] > 0 and doc["tokens"]["union_rows"]["task"] > 0   # over self's answers
    assert doc["tokens"]["trained"] > doc["tokens"]["prepared"] > 0   # 3 epochs
    monkeypatch.setattr(R.subprocess, "run", lambda *a, **k: pytest.fail(f"rerun started {a}"))
    code, again = run_recipe(recipe, out)
    assert code == DONE and again["spec_bench"] == doc["spec_bench"]
