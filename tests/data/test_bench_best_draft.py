"""bench/best_draft.py: issue 13's one-script recipe (data, training, Spec-Bench tau at T=0 and T=1), spread over
calls of at most --budget-s, resumed from WORK/state.json, and carried between GPU sessions by --pack / --unpack."""

import importlib
import importlib.util
import io
import json
import subprocess
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest
import torch
from safetensors.torch import load as load_weights, save_file

from tests.data.templates import make_tokenizer

matplotlib.use("Agg")
# pyplot's first import on a fresh machine builds matplotlib's font cache by running fc-list through subprocess,
# which these tests replace with fakes: import it before they do
import matplotlib.pyplot  # noqa: E402,F401

BENCH = Path(__file__).resolve().parents[2] / "bench" / "best_draft.py"
ANSWER = "the cat runs fast over the green house"


def load():
    spec = importlib.util.spec_from_file_location("bench_best_draft", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
def tok_dir(tmp_path):
    make_tokenizer("smollm2").save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def run(mod, tmp_path, tok_dir, *flags):
    out = tmp_path / "o.json"
    rc = mod.main(["--target", str(tok_dir), "--data", str(sharegpt(tmp_path / "sg.json")), "--work",
                   str(tmp_path / "w"), "--device", "cpu", "--rows", "5", "--self-prompts", "3", "--out", str(out),
                   *flags])
    return rc, json.loads(out.read_text())


def test_steps_resume_across_calls_and_the_json_says_what_was_reached(tmp_path, tok_dir, monkeypatch):
    mod = load()
    fake = FakeStages(cut=["train"])
    monkeypatch.setattr(mod.S.subprocess, "run", fake)
    rc, doc = run(mod, tmp_path, tok_dir)
    assert rc == 0 and not doc["complete"]
    assert fake.stages() == ["regenerate", "regenerate", "prepare", "train"]   # train cut by the budget
    cmds = dict(fake.cmds)
    assert arg(cmds["prepare"], "--data") == str(tmp_path / "w" / "union.jsonl")
    assert sum(1 for _ in open(tmp_path / "w" / "union.jsonl")) == 5 + 3     # regen rows, then self rows
    t = cmds["train"]
    assert "--online" in t and "--resume" not in t
    assert [arg(t, f) for f in ("--save-every", "--ttt-steps", "--batch-size", "--lr")] == ["200", "7", "8", "0.001"]
    assert arg(fake.cmds[1][1], "--data") == "self:3"

    fake.cmds.clear()
    rc, doc = run(mod, tmp_path, tok_dir)
    assert rc == 0 and doc["complete"]
    assert fake.stages() == ["train", "eval", "eval"]              # nothing finished is redone
    assert "--resume" in fake.cmds[0][1]                            # from the checkpoint the cut call left
    assert [arg(c, "--temperature") for s, c in fake.cmds[1:]] == ["0", "1"]
    st = json.loads((tmp_path / "w" / "state.json").read_text())
    assert [c["ran"] for c in st["calls"]] == [["gen:regen", "gen:self", "count:regen", "count:self", "prep", "train"],
                                               ["train", "eval:t0", "eval:t1"]]
    assert doc["gpu_seconds_total"] == pytest.approx(sum(c["seconds"] for c in st["calls"]), abs=0.11)
    assert set(doc["step_seconds"]) == {"gen:regen", "gen:self", "prep", "train", "eval:t0", "eval:t1"}
    n = len(make_tokenizer("smollm2")(ANSWER, add_special_tokens=False)["input_ids"])
    q = [len(make_tokenizer("smollm2")(f"question {i}", add_special_tokens=False)["input_ids"]) for i in range(3)]
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
    assert Path(doc["png"]).stat().st_size > 1000

    fake.cmds.clear()   # done: a third call starts nothing, says so, adds no GPU seconds
    rc, doc2 = run(mod, tmp_path, tok_dir)
    assert rc == 0 and fake.cmds == [] and doc2["gpu_seconds_total"] == doc["gpu_seconds_total"]


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


def test_the_two_evals_run_side_by_side_on_request(tmp_path, tok_dir, monkeypatch, capsys):
    """--eval-parallel (the GPU default): eval:t0 and eval:t1 overlap in time and both are recorded done, with
    their seconds and the end of their logs in the output; without it they run one after the other."""
    for flag, overlap in (("--eval-parallel", True), ("--no-eval-parallel", False)):
        mod = load()
        fake = FakeStages(eval_s=0.5)
        monkeypatch.setattr(mod.S.subprocess, "run", fake)
        monkeypatch.setattr(mod.S.subprocess, "Popen", lambda *a, **k: FakePopen(fake, *a, **k))
        work = tmp_path / flag
        rc = mod.main(["--target", str(tok_dir), "--data", str(sharegpt(tmp_path / "sg.json")), "--work", str(work),
                       "--device", "cpu", "--rows", "5", "--self-prompts", "3", "--out", str(work / "o.json"), flag])
        assert rc == 0 and json.loads((work / "o.json").read_text())["complete"]
        (a0, b0), (a1, b1) = fake.spans["0"], fake.spans["1"]
        assert (max(a0, a1) < min(b0, b1)) == overlap, (flag, fake.spans)
        st = json.loads((work / "state.json").read_text())
        assert {"eval:t0", "eval:t1"} <= set(st["done"]) and st["seconds"]["eval:t1"] > 0
        assert {"eval:t0", "eval:t1"} <= set(st["calls"][-1]["ran"]) and "eval:t1" in st["finished_at"]
        assert ("a background stage's table" in capsys.readouterr().out) == overlap


def test_warm_ups_run_beside_the_data_steps_and_beside_training(tmp_path, tok_dir, monkeypatch):
    """--warm-background (the GPU default): `eyas train --warm-only` starts before the first data step with the
    training's own graph-deciding flags and is waited for before training starts; `eyas eval --warm-only` starts on
    the first draft the training writes, with the evals' own flags, and is waited for before the evals."""
    import eyas.decode.prewarm as prewarm

    mod = load()
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
    monkeypatch.setattr(mod.S.subprocess, "run", fake)
    monkeypatch.setattr(prewarm.subprocess, "Popen", Proc)
    rc, doc = run(mod, tmp_path, tok_dir, "--warm-background", "--eval-compile", "--no-eval-parallel")
    assert rc == 0 and doc["complete"]
    seq = [e[:2] for e in events]
    assert seq.index(("start", "train")) < seq.index(("run", "regenerate"))
    assert seq.index(("run", "prepare")) < seq.index(("end", "train")) < seq.index(("run", "train")) \
        < seq.index(("start", "eval")) < seq.index(("end", "eval")) < seq.index(("run", "eval"))
    train_warm = next(e[2] for e in events if e[:2] == ("start", "train"))
    eval_warm = next(e[2] for e in events if e[:2] == ("start", "eval"))
    train = next(c for st, c in fake.cmds if st == "train")
    ev = next(c for st, c in fake.cmds if st == "eval")
    a = type("A", (), dict(target=str(tok_dir), ttt=7, batch=8, lr=1e-3, device="cpu", train_args=""))
    flags = mod.train_flags(a)
    assert " ".join(flags) in " ".join(train_warm) and " ".join(flags) in " ".join(train)
    assert "--warm-only" in train_warm and arg(train_warm, "--max-length") == "2048"
    assert arg(train_warm, "--draft-vocab-size") == "32000"
    assert "--warm-only" in eval_warm and "--compile --min-bucket 1000000" in " ".join(eval_warm)
    for f in ("--per-category", "--max-new-tokens", "--chain", "--tree", "--target"):
        assert arg(eval_warm, f) == arg(ev, f)
    assert doc["train_warm"]["rc"] == 0 and doc["eval_warm"]["started"] and doc["eval_warm"]["rc"] == 0


def test_a_call_that_can_start_nothing_fails(tmp_path, tok_dir, monkeypatch):
    mod = load()
    monkeypatch.setattr(mod.S.subprocess, "run", FakeStages())
    rc, doc = run(mod, tmp_path, tok_dir, "--budget-s", "5")
    assert rc == 3 and not doc["complete"] and doc["gpu_seconds_total"] == 0


def test_another_recipe_is_refused_naming_the_key(tmp_path, tok_dir, monkeypatch):
    mod = load()
    monkeypatch.setattr(mod.S.subprocess, "run", FakeStages())
    run(mod, tmp_path, tok_dir, "--kinds", "raw")
    with pytest.raises(SystemExit, match=r"another recipe: lr=0.001 there, 0.002 now"):
        run(mod, tmp_path, tok_dir, "--kinds", "raw", "--lr", "2e-3")
    with pytest.raises(SystemExit, match=r"kinds='raw' there, 'regen' now"):
        run(mod, tmp_path, tok_dir, "--kinds", "regen")


def test_bad_inputs(tmp_path, tok_dir):
    mod = load()
    with pytest.raises(SystemExit, match="--data /nope.json: no such file"):
        mod.main(["--target", str(tok_dir), "--data", "/nope.json", "--work", str(tmp_path / "w"), "--device", "cpu"])
    with pytest.raises(SystemExit, match="--kinds regen,bogus"):
        mod.main(["--kinds", "regen,bogus", "--work", str(tmp_path / "w"), "--device", "cpu"])
    for kinds in ("regen,task", "task,self"):   # tasks are made from the self-written answers
        with pytest.raises(SystemExit, match="put self before it"):
            mod.main(["--kinds", kinds, "--work", str(tmp_path / "w"), "--device", "cpu"])


def half_trained(tmp_path, tok_dir, twin):
    """A WORK cut in training: the target's bf16 embedding in fp32 in the draft (as training on a GPU makes it),
    the best draft = the latest checkpoint's weights (twin) or older ones, generated rows on disk."""
    torch.manual_seed(0)
    target = tmp_path / "target"
    target.mkdir()
    emb = torch.randn(50, 8).to(torch.bfloat16)
    save_file({"model.embed_tokens.weight": emb, "lm_head.weight": torch.randn(50, 8)},
              str(target / "model.safetensors"))
    for f in tok_dir.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    w = tmp_path / "w"
    ck = w / "run" / "checkpoints" / "step-400"
    ck.mkdir(parents=True)
    draft = {"embed_tokens.weight": emb.float(), "fc.weight": torch.randn(8, 24), "lm_head.weight": torch.randn(20, 8)}
    save_file(draft, str(ck / "model.safetensors"), metadata={"format": "pt"})
    if twin:
        (w / "run" / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes())
    else:
        save_file({**draft, "fc.weight": torch.randn(8, 24)}, str(w / "run" / "model.safetensors"),
                  metadata={"format": "pt"})
    old = w / "run" / "checkpoints" / "step-200"   # an older checkpoint: not packed
    old.mkdir()
    (old / "state.pt").write_bytes(b"old")
    torch.save({"step": 400, "optimizer": {"m": torch.randn(100)}}, ck / "state.pt")
    (ck / "config.json").write_text("{}")
    (w / "run" / "metrics.jsonl").write_text(json.dumps({"split": "eval", "step": 400, "tau": 2.0}) + "\n")
    (w / "regen.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    return w, ["--target", str(target), "--work", str(w), "--device", "cpu", "--kinds", "regen", "--data",
               str(sharegpt(tmp_path / "sg.json")), "--out", str(tmp_path / "o.json")]


@pytest.mark.parametrize("twin", [True, False])
def test_pack_unpack_round_trip_and_a_bad_part_is_named(tmp_path, tok_dir, twin, monkeypatch):
    mod = load()
    w, args = half_trained(tmp_path, tok_dir, twin)
    assert mod.main(args + ["--budget-s", "0"]) == 3   # stores the recipe, starts nothing
    st = json.loads((w / "state.json").read_text())
    st.update(done={"gen:regen": 10.0, "prep": 2.0}, prep={"tokens": 1}, gpu_seconds_total=12.0)
    (w / "state.json").write_text(json.dumps(st))
    monkeypatch.setattr(mod.P, "PART_BYTES", 1000)   # several parts from a small run (the module is shared)
    pk = tmp_path / "pk"
    assert mod.main(args + ["--pack", str(pk), "--pack-data"]) == 0
    man = json.loads((pk / "manifest.json").read_text())
    assert len(man["parts"]) >= 2 and all(p["bytes"] <= 1000 for p in man["parts"])
    assert sum(p["bytes"] for p in man["parts"]) == man["total_bytes"]
    # the embedding is the target's bf16 one in fp32: left out, rebuilt on unpack; the twin weights stored once
    stripped = ["run/model.safetensors"] + ([] if twin else ["run/checkpoints/step-400/model.safetensors"])
    assert man["embedding_from_target"] == {n: {"cast": "none", "dtype": "float32"} for n in stripped}
    assert man["copies"] == ({"run/checkpoints/step-400/model.safetensors": "run/model.safetensors"} if twin else {})
    assert "run/checkpoints/step-200/state.pt" not in man["files"] and "regen.jsonl" in man["files"]
    blob = b"".join((pk / p["name"]).read_bytes() for p in man["parts"])
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == sorted(set(man["files"]) - set(man["copies"]))
        for n in stripped:
            assert set(load_weights(tar.extractfile(n).read())) == {"fc.weight", "lm_head.weight"}
    files = {n: (w / n).read_bytes() for n in man["files"]}

    w.rename(tmp_path / "w-old")
    assert mod.main(args + ["--unpack", str(pk)]) == 0
    assert {n: (w / n).read_bytes() for n in man["files"] if n != "state.json"} == \
        {n: b for n, b in files.items() if n != "state.json"}
    st2 = json.loads((w / "state.json").read_text())
    assert st2["done"] == {"gen:regen": 10.0} and "prep" not in st2   # rows carried; prep is redone from them
    assert st2["gpu_seconds_total"] == 12.0 and st2["recipe"] == st["recipe"]
    assert not (w / "run" / "checkpoints" / "step-200").exists()

    with pytest.raises(SystemExit, match="already holds a run"):
        mod.main(args + ["--unpack", str(pk)])
    (w / "state.json").unlink()
    with pytest.raises(SystemExit, match="another recipe: ttt=7 there, 3 now"):
        mod.main(args + ["--ttt", "3", "--unpack", str(pk)])
    with pytest.raises(SystemExit, match="unpack into that same --work"):
        mod.main(args + ["--work", str(tmp_path / "elsewhere"), "--unpack", str(pk)])
    part = pk / man["parts"][1]["name"]
    part.write_bytes(part.read_bytes()[:-1] + b"\0")
    with pytest.raises(SystemExit, match=f"part {part.name} is corrupt"):
        mod.main(args + ["--unpack", str(pk)])
    part.unlink()
    with pytest.raises(SystemExit, match=f"part {part.name} is missing"):
        mod.main(args + ["--unpack", str(pk)])


@pytest.mark.slow   # ~60 s on a busy 2-core box; the FakeStages tests above cover the same logic fast
def test_tiny_end_to_end_over_two_calls(tmp_path, monkeypatch):
    """--tiny on CPU for real: a first call too short for the evals (their first estimate is 60 s > the 40 s
    budget) makes progress and stops; the second finishes without redoing the first's steps; pack, unpack into
    a fresh WORK (the tiny target rebuilt, its embedding checked), and a rerun starts nothing."""
    mod = load()
    make_tokenizer("smollm2").save_pretrained(tmp_path / "tok")
    work, out = tmp_path / "w", tmp_path / "o.json"
    argv = ["--tiny", "--target", str(tmp_path / "tok"), "--data", str(sharegpt(tmp_path / "sg.json")),
            "--work", str(work), "--out", str(out), "--kinds", "regen,self,task"]
    assert mod.main(argv + ["--budget-s", "40"]) == 0
    first = json.loads((work / "state.json").read_text())
    assert first["calls"][0]["finished"] and "eval:t0" not in first["done"]
    assert not json.loads(out.read_text())["complete"]
    assert mod.main(argv + ["--budget-s", "600"]) == 0
    doc = json.loads(out.read_text())
    st = json.loads((work / "state.json").read_text())
    assert doc["complete"] and len(st["calls"]) == 2
    assert not set(st["calls"][1]["ran"]) & set(first["calls"][0]["finished"])
    assert all(st["finished_at"][s] == first["finished_at"][s] for s in first["calls"][0]["finished"])
    assert doc["gpu_seconds_total"] == pytest.approx(sum(c["seconds"] for c in st["calls"]), abs=0.11)
    # each step's seconds and each call's are rounded to 0.1 s apart: their sums may differ by 0.05 a step
    steps = doc["step_seconds"]
    assert doc["gpu_seconds_total"] + 0.05 * len(steps) >= sum(steps.values()) > 0
    for t in ("t0", "t1"):
        sb = doc["spec_bench"][t]
        assert sb["chain_tau"] >= 1 and sb["tree_tau"] >= 1 and sb["seconds"] > 0
        assert (sb["chain"], sb["tree"], sb["questions"]) == ("chain-2", "tree(total=6,depth=3,topk=2)", 2)
        assert len(sb["settings"]["chain-2"]["accept_per_position"]) == 2
    assert all(x.get("unexplained_divergences", 0) == 0 for x in doc["spec_bench"]["t0"]["settings"].values())
    assert doc["goals"]["tree_tau_met"] is False and doc["goals"]["chain_tau_met"] is False
    assert len(doc["held_out_curve"]) >= 2 and all(p["tau"] >= 1 for p in doc["held_out_curve"])
    assert doc["tokens"]["generated"]["regen"] > 0 and doc["tokens"]["generated"]["self"] > 0
    assert doc["tokens"]["generated"]["task"] > 0 and doc["tokens"]["union_rows"]["task"] > 0   # over self's answers
    assert doc["tokens"]["trained"] > doc["tokens"]["prepared"] > 0   # 3 epochs
    # what bench/scaling.py --merge reads of a one-kind run (the point: prepared tokens, last held-out eval, T=0)
    (pt,) = importlib.import_module("_scaling_points").best_draft_point(out, {**doc, "kinds": ["self"]})
    assert pt["tokens"] == doc["tokens"]["prepared"] and pt["rows"] == doc["tokens"]["rows_out"] > 0
    assert pt["tau"] == doc["held_out_curve"][-1]["tau"] and pt["steps"] == doc["held_out_curve"][-1]["step"]
    assert pt["spec_bench_tree_tau"] == doc["spec_bench"]["t0"]["tree_tau"] and pt["spec_bench_compiled"] is False

    assert mod.main(argv + ["--pack", str(tmp_path / "pk")]) == 0
    man = json.loads((tmp_path / "pk" / "manifest.json").read_text())
    assert man["train_done"] and not any("checkpoints" in n for n in man["files"])   # a finished run: its draft only
    assert "run/model.safetensors" in man["embedding_from_target"]
    work.rename(tmp_path / "w-old")
    assert mod.main(argv + ["--unpack", str(tmp_path / "pk")]) == 0
    assert (work / "run" / "model.safetensors").read_bytes() == (tmp_path / "w-old/run/model.safetensors").read_bytes()
    monkeypatch.setattr(mod.S.subprocess, "run", lambda *a, **k: pytest.fail(f"rerun started {a}"))
    assert mod.main(argv) == 0
    assert json.loads(out.read_text())["spec_bench"] == doc["spec_bench"]


def test_first_per_category_tau_is_the_one_per_category_question_set():
    """Two questions per category: tau over each category's first question alone (what a one-per-category eval
    measures); with one question per category nothing is added."""
    turns = [{"question_id": 1, "category": "a", "steps": 10, "emitted": 30},
             {"question_id": 1, "category": "a", "steps": 10, "emitted": 20},
             {"question_id": 2, "category": "a", "steps": 10, "emitted": 10},
             {"question_id": 7, "category": "b", "steps": 20, "emitted": 40},
             {"question_id": 8, "category": "b", "steps": 20, "emitted": 20}]
    bd = load()
    got = bd.first_per_category(turns)["first_per_category"]
    assert got == {"tau": (30 + 20 + 40) / (10 + 10 + 20), "questions": 2, "turns": 3}
    assert bd.first_per_category([t for t in turns if t["question_id"] in (1, 7)]) == {}
    assert bd.first_per_category([]) == {}


def test_a_work_seeded_with_more_rows_than_asked_trains_only_on_the_asked_ones(tmp_path):
    """gpu_session.sh seeds WORK with an earlier session's rows (50,000 self-written ones): a run asking for fewer
    takes the rows of its first --self-prompts / --rows inputs, in the union and in the generated-token count."""
    mod = load()
    work = tmp_path / "w"
    work.mkdir()
    tok = tmp_path / "tok"
    make_tokenizer("smollm2").save_pretrained(tok)

    def rows(kind, n):
        with open(work / f"{kind}.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"row": i, "messages": [{"role": "user", "content": f"{kind} q{i}"},
                                                           {"role": "assistant", "content": ANSWER}]}) + "\n")

    rows("self", 5)
    rows("regen", 4)
    a = SimpleNamespace(work=work, rows=2, self_prompts=3, task_prompts=9, target=str(tok))
    assert mod.write_union(a, ["regen", "self"]) == {"regen": 2, "self": 3}
    union = [json.loads(x) for x in (work / "union.jsonl").read_text().splitlines()]
    assert [r["messages"][0]["content"] for r in union] == ["regen q0", "regen q1", "self q0", "self q1", "self q2"]
    one = mod.generated_tokens(SimpleNamespace(**{**vars(a), "self_prompts": 1}), "self")
    assert mod.generated_tokens(a, "self") == 3 * one > 0
