"""The main job end to end on a tiny in-process target, tiny conversations and a tiny bench (no network)."""

import importlib.util
import json
from pathlib import Path

import pytest

from eyas.cli import main

_spec = importlib.util.spec_from_file_location("eyas_test_templates", Path(__file__).parent / "data" / "templates.py")
templates = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(templates)


def _tiny_target(path: Path) -> Path:
    return templates.make_model_dir(path)


def _eight_conversations_one_question(tmp_path: Path) -> Path:
    """tmp_path/data.json (8 short conversations) and the bench file of one writing question, returned."""
    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"tell me about topic {i} please"},
                                              {"from": "gpt", "value": f"topic {i} is a fine topic indeed"}]}
             for i in range(8)]
    (tmp_path / "data.json").write_text(json.dumps(convs))
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"question_id": 0, "category": "writing", "turns": ["say something"]}) + "\n")
    return bench


def test_demo_runs_every_stage_and_writes_a_report(tmp_path, capsys):
    target = _tiny_target(tmp_path / "target")
    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"tell me about topic {i} please"},
                                              {"from": "gpt", "value": f"topic {i} is a fine topic indeed"}]}
             for i in range(12)]
    # One opening too long to regenerate (the demo caps prompts at max_length // 2 = 64 tokens): dropped, and said so.
    convs.insert(3, {"id": "long", "conversations": [{"from": "human", "value": "word " * 200},
                                                     {"from": "gpt", "value": "ok"}]})
    (tmp_path / "data.json").write_text(json.dumps(convs))
    bench = tmp_path / "bench.jsonl"
    bench.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [f"say something about {c}"]})
                               for i, c in enumerate(["writing", "coding"])) + "\n")
    out = tmp_path / "demo"
    rc = main(["demo", "--target", str(target), "--data", str(tmp_path / "data.json"), "--out", str(out),
               "--max-samples", "13", "--regen-max-new-tokens", "8", "--regen-batch-size", "6", "--max-length", "128",
               "--draft-vocab-size", "64", "--epochs", "1", "--eval-max-new-tokens", "8", "--bench", str(bench),
               "--tree", "total=6,depth=3,topk=2", "--device", "cpu", "--json"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tau"] >= 1.0 and summary["identical_rate"] == 1.0      # greedy spec decoding is lossless
    assert summary["doctor"]["ok"], summary["doctor"]["fails"]
    assert set(summary["seconds"]) == {"fetch", "regenerate", "prepare", "extract", "train", "eval", "export", "doctor"}
    assert (out / "export" / "config.json").is_file() and (out / "run" / "model.safetensors").is_file()
    rows = summary["rows"]
    assert (rows["requested"], rows["regenerated"], rows["regenerate_failed"]) == (13, 12, 1)
    assert rows["regenerate_failed_by_reason"] == {"prompt_too_long": 1}
    assert rows["prepare_in"] == 12 and rows["prepare_kept"] + rows["prepare_rejected"] == 12
    assert summary["train_steps"] > 0 and summary["held_out_tau"] >= 1.0 and summary["chain"] == 3
    report = (out / "report.md").read_text()
    assert "13 read, 12 regenerated (1 failed: prompt_too_long 1)" in report
    assert f"| training steps (TTT steps) | {summary['train_steps']} (3) |" in report
    assert f"| held-out simulated τ (chain 3, best checkpoint) | {summary['held_out_tau']:.3f} |" in report
    assert "| τ (chain 3), 2 questions × 8 new tokens |" in report and "learning_curve.png" in report
    assert (out / "learning_curve.png").is_file()
    tree = summary["tree"]   # the tree is evaluated beside the chain (the GPU profile's tree-tau goal reads it)
    assert tree["setting"].startswith("tree") and tree["tau"] >= 1.0 and tree["identical_rate"] == 1.0
    assert f"| τ ({tree['setting']}) / speedup / identical | {tree['tau']:.3f} /" in report
    assert "| identical to greedy baseline | 1.000 (tie-aware 1.000; 0 not ties) |" in report   # fp32: exact
    assert tree["tie_aware_identical_rate"] == 1.0 and tree["unexplained_divergences"] == 0
    assert "| trained from | store |" in report
    # what vLLM would give needs vLLM's measured figures for this model and GPU: none for a tiny model on a CPU
    assert summary["vllm_expected"] is None and summary["speedup_vs_vllm_ar"] is None
    assert "| speedup to expect in vLLM (chain 3, batch 1) | no vLLM figures for " in report


def test_demo_online_skips_the_store(tmp_path, capsys, monkeypatch):
    """The GPU profile's way: --online (no extract stage, no store, the draft trained with the target in the loop,
    the same report; doctor passes without a store), the native generator with the flex step, self-written prompts
    joining the regenerated openings, the eval at one KV bucket, and where the eval's seconds went."""
    target = _tiny_target(tmp_path / "target")
    bench = _eight_conversations_one_question(tmp_path)
    out = tmp_path / "demo"

    def written_prompts(backend, n, path, **kw):  # a random target's own prompts are noise, too long to answer
        with open(path, "a") as f:
            f.writelines(json.dumps({"row": i, "source": "self", "messages": [
                {"role": "user", "content": f"question {i} from the target"},
                {"role": "assistant", "content": "(not answered yet)"}]}) + "\n" for i in range(n))

    monkeypatch.setattr("eyas.data.regenerate.self_prompts", written_prompts)
    rc = main(["demo", "--target", str(target), "--data", str(tmp_path / "data.json"), "--out", str(out),
               "--max-samples", "8", "--regen-max-new-tokens", "8", "--regen-batch-size", "8", "--max-length", "128",
               "--draft-vocab-size", "64", "--epochs", "1", "--eval-max-new-tokens", "8", "--bench", str(bench),
               "--online", "--device", "cpu", "--json", "--regen-backend", "native", "--regen-attention", "flex",
               "--self-prompts", "3", "--eval-min-bucket", "1000000", "--eval-warm-background",
               "--train-warm-background"])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    rows = s["rows"]
    assert rows["self_prompts"] == 3 and rows["self_answered"] == 3
    union = (out / "regenerated" / "union.jsonl").read_text().splitlines()
    assert len(union) == rows["regenerated"] + rows["self_answered"] == rows["prepare_in"]
    assert f"{rows['self_answered']} of 3 self-written prompts answered" in (out / "report.md").read_text()
    assert s["generated_tokens"] > 0
    (setting, secs), = s["eval_seconds"].items()
    assert setting == "chain-3" and {"warm", "baseline", "decode"} <= set(secs) and secs["decode"] > 0
    ev = json.loads((out / "eval" / "eval.json").read_text())
    assert len(ev["results"][0]["decode"]["kv_buckets"]) == 1   # --eval-min-bucket above the capacity
    assert "extract" not in s["seconds"] and not (out / "store").exists() and "store" not in s["paths"]
    assert s["doctor"]["ok"], s["doctor"]["fails"]
    assert s["train_from"] == "online (no store)" and s["train_steps"] > 0 and s["identical_rate"] == 1.0
    assert "| trained from | online (no store) |" in (out / "report.md").read_text()
    # the eval's warm-up beside training: started on the run's first draft, or (a run this short may write it only
    # at its end) not started; either way said in the report
    wb = s["eval_warm_background"]
    assert wb["started"] is False or (wb["rc"] == 0 and not wb["killed"])
    assert "Eval warm-up beside training: " in (out / "report.md").read_text()
    # the training step's warm-up beside the data stages: the same flags, stand-in rows, finished before training
    tw = s["train_warm_background"]
    assert tw["rc"] == 0 and not tw["killed"], (out / "train-warm.log").read_text()
    assert (out / "train-warm" / "prepared" / "manifest.json").is_file()
    assert f"Training warm-up beside the data stages: {tw['seconds']} s (rc 0)" in (out / "report.md").read_text()


def test_demo_checks_its_inputs_before_the_first_stage(tmp_path, capsys):
    """A missing bench file and a missing data file are both reported at once, before any stage starts."""
    rc = main(["demo", "--target", "smollm2-135m", "--data", str(tmp_path / "nope.json"), "--out", str(tmp_path / "d"),
               "--bench", str(tmp_path / "bench.jsonl")])
    captured = capsys.readouterr()
    assert rc == 1 and "=== fetch ===" not in captured.out
    assert "nothing was started" in captured.err and "--data" in captured.err and "--bench" in captured.err
    rc = main(["demo", "--target", "smollm2-135m", "--out", str(tmp_path / "d"), "--no-regenerate",
               "--self-prompts", "100"])
    assert rc == 1 and "--self-prompts 100 needs --regenerate" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_demo_takes_every_builtin_target(name, tmp_path):
    """`eyas demo --device cuda --target qwen2.5-coder-1.5b` is a valid invocation (checked before any fetch)."""
    from eyas.config import build_config
    from eyas.demo import DemoConfig, preflight, with_profile

    cfg = with_profile(build_config(DemoConfig, {"target": name, "device": "cuda", "out": tmp_path / "d"}), "cuda")
    (tmp_path / "d").mkdir()
    preflight(cfg, tmp_path / "d")
    assert cfg.target == name and cfg.online


def test_demo_refuses_an_out_holding_other_files_before_any_stage(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("years of work")
    rc = main(["demo", "--target", "smollm2-135m", "--out", str(mine)])
    captured = capsys.readouterr()
    assert rc == 1 and "=== fetch ===" not in captured.out and "other files (thesis.txt)" in captured.err
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.txt"]


def test_gpu_profile_fills_only_unset_fields():
    from eyas.config import build_config
    from eyas.demo import GPU_PROFILE, DemoConfig, with_profile

    cfg = build_config(DemoConfig, {"max_samples": 50})
    assert with_profile(cfg, "cpu") == cfg  # the CPU demo is unchanged
    gpu = with_profile(cfg, "cuda")
    assert gpu.max_samples == 50 and gpu.regen_backend == "native" and gpu.epochs == GPU_PROFILE["epochs"]
    assert gpu.tree == "total=60,depth=7,topk=10" and cfg.tree is None
    assert gpu.online and not cfg.online      # on the GPU no ~25 GB store: the target runs inside training
    assert gpu.eval_warm_background and not cfg.eval_warm_background
    assert gpu.train_warm_background and not cfg.train_warm_background
    assert gpu.self_prompts > 0 and cfg.self_prompts == 0 and gpu.regen_attention == "flex"
    assert with_profile(build_config(DemoConfig, {"profile": "cpu"}), "cuda").regen_backend == "hf"
    assert gpu.regen_max_prompt_tokens == GPU_PROFILE["regen_max_prompt_tokens"] and cfg.regen_max_prompt_tokens is None


@pytest.mark.parametrize("flags, cap", [([], 64), (["--regen-max-prompt-tokens", "100"], 100)])
def test_demo_regenerate_prompt_cap(tmp_path, monkeypatch, flags, cap):
    """The longest prompt regenerate answers: max_length // 2 unless --regen-max-prompt-tokens says (the gpu profile
    raises it so that long-context prompts are answered too)."""
    seen = []

    class Stop(Exception):
        pass

    def first_regenerate(cfg):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr("eyas.demo.regenerate", first_regenerate)
    target = _tiny_target(tmp_path / "target")
    (tmp_path / "data.json").write_text(json.dumps([{"id": "0", "conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]))
    with pytest.raises(Stop):
        main(["demo", "--target", str(target), "--data", str(tmp_path / "data.json"), "--out", str(tmp_path / "d"),
              "--max-samples", "8", "--max-length", "128", "--device", "cpu", *flags])
    assert seen[0].max_prompt_tokens == cap


def test_report_says_what_explains_each_divergence():
    """A bf16 eval's bare identity rate reads as lossy; the line says the tie-aware rate and each recheck verdict."""
    from eyas.demo import _identity

    r = {"identical_rate": 0.429, "tie_aware_identical_rate": 0.952, "unexplained_divergences": 3,
         "unexplained_numerics": 2, "unexplained_decoder": 0, "unexplained_unchecked": 1}
    assert _identity(r) == "0.429 (tie-aware 0.952; 3 not ties: 2 numerics, 1 unchecked)"
    assert _identity({"identical_rate": 1.0, "tie_aware_identical_rate": 1.0, "unexplained_divergences": 0}) \
        == "1.000 (tie-aware 1.000; 0 not ties)"
    assert _identity({"identical_rate": None}) == "-"   # T > 0: no identity to claim


def test_the_demo_recipe_resumes_after_a_crash_without_redoing_finished_stages(tmp_path, monkeypatch):
    """`eyas run demo-cpu --out DIR`: the demo's stages are steps of a recipe run; a crash in the eval leaves the
    stages before it done (their results kept in DIR/state.json), and the same command finishes from there."""
    from eyas.recipes import DONE, load_recipe, run_recipe

    target = _tiny_target(tmp_path / "target")
    bench = _eight_conversations_one_question(tmp_path)
    recipe = load_recipe("demo-cpu", [f"target={target}", f"data={tmp_path / 'data.json'}", "max_samples=8",
                                      "regen_max_new_tokens=8", "regen_batch_size=8", "max_length=128",
                                      "draft_vocab_size=64", "epochs=1", "eval_max_new_tokens=8", f"bench={bench}"])
    import eyas.demo as demo

    calls, real_eval, real_regen = [], demo.evaluate, demo.regenerate

    def crash(cfg):
        raise RuntimeError("the machine went away")

    monkeypatch.setattr(demo, "regenerate", lambda cfg: calls.append("regenerate") or real_regen(cfg))
    monkeypatch.setattr(demo, "evaluate", crash)
    out = tmp_path / "demo"
    with pytest.raises(RuntimeError, match="went away"):
        run_recipe(recipe, out)
    st = json.loads((out / "state.json").read_text())
    assert list(st["done"]) == ["fetch", "regenerate", "prepare", "extract", "train"] and calls == ["regenerate"]
    monkeypatch.setattr(demo, "evaluate", real_eval)
    code, summary = run_recipe(recipe, out)
    assert code == DONE and calls == ["regenerate"]   # nothing finished ran again
    assert set(summary["seconds"]) == {"fetch", "regenerate", "prepare", "extract", "train", "eval", "export", "doctor"}
    assert summary["identical_rate"] == 1.0 and summary["doctor"]["ok"] and summary["rows"]["regenerated"] == 8
    assert json.loads((out / "summary.json").read_text())["tau"] == summary["tau"]
