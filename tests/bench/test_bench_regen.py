"""bench/regen.py's attribution of non-tie divergences, end to end on a tiny random Llama (fp32, CPU), where HF
`generate` and the native generator agree exactly: one side's batched answer is corrupted on purpose (one token
swapped for the reference's lowest-ranked one) and the verdict must name that side, with the signed gap's sign."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from eyas.data.generate import NativeBackend
from tests.data.templates import make_tokenizer

BENCH = Path(__file__).resolve().parents[2] / "bench" / "regen.py"
ROW, MAX_NEW = 1, 8


def load():
    spec = importlib.util.spec_from_file_location("bench_regen", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def target():
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_tokenizer("smollm2")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=512, eos_token_id=tok.eos_token_id,
                                         pad_token_id=tok.pad_token_id)).eval()
    return model, tok


@pytest.fixture
def bench(target, tmp_path, monkeypatch):
    """The script with its backend built from the tiny target, and a runner that returns its JSON."""
    model, tok = target
    mod = load()
    monkeypatch.setattr(mod, "NativeBackend", lambda t, **kw: NativeBackend(t, model=model, tokenizer=tok, **kw))
    data = tmp_path / "sg.json"
    data.write_text(json.dumps([{"id": str(i), "conversations": [
        {"from": "human", "value": f"question {i} " + "word " * (2 + 3 * i)}, {"from": "gpt", "value": "old"}]}
        for i in range(5)]))

    def run(*extra):
        out = tmp_path / "regen.json"
        mod.main(["--target", "t", "--data", str(data), "--rows", "5", "--batch", "4", "--max-new", str(MAX_NEW),
                  "--hf-sample", "4", "--hf-batch", "2", "--max-prompt", "200", "--device", "cpu", *extra,
                  "--out", str(out)])
        return json.loads(out.read_text())

    return mod, run


def corrupt(model, prompt, ans, k, eos):
    """ans with token k swapped for the one the reference forward ranks lowest (never an EOS)."""
    assert len(ans) > k, "the tiny model ended this answer early: pick another row"
    with torch.no_grad():
        z = model(torch.tensor([prompt + ans[:k]])).logits[0, -1]
    z[eos] = float("inf")
    return ans[:k] + [int(z.argmin())] + ans[k + 1:]


@pytest.mark.parametrize("lone_leaves_early", [False, True])
def test_corrupted_hf_batch_is_named_hf_side(bench, target, monkeypatch, lone_leaves_early):
    mod, run = bench
    model, _ = target
    real, seen = mod.hf_generate, {}
    k = MAX_NEW // 2

    def hf_generate(m, prompts, max_new, eos, *a):
        out = real(m, prompts, max_new, eos, *a)
        if len(prompts) > 1:  # the batched run; the lone runs get one prompt each
            seen.update(prompt=prompts[ROW], honest=out[ROW])
            out[ROW] = corrupt(model, prompts[ROW], out[ROW], k, eos)
        elif lone_leaves_early and prompts[0] == seen["prompt"]:  # the lone HF run leaves before the divergence
            out[0] = corrupt(model, prompts[0], out[0], k - 1, eos)
        return out

    monkeypatch.setattr(mod, "hf_generate", hf_generate)
    doc = run()
    m = doc["match"]
    assert m["differing"] == m["unexplained"] == m["unexplained_examined"] == 1 and m["differing_at_tie"] == 0
    d = m["divergences"][0]
    assert (d["row"], d["position"], d["tie"]) == (ROW, k, False)
    assert d["gap"] > d["tie_threshold"] and d["signed_gap"] == pytest.approx(-d["gap"])  # HF's token is the low one
    assert d["native_token"]["id"] == seen["honest"][k] == d["ref_argmax"]["id"] and d["ref_argmax_by"] == "native"
    assert d["hf_token"]["id"] != seen["honest"][k] and d["hf_token"]["rank"] > 0
    alone = d["alone"]
    assert alone["side"] == "hf" and alone["verdict"].startswith("hf side")
    assert alone["native"]["at_divergence"] == "native" and alone["native"]["equals"] == "native_batched"
    assert alone["native"]["first_diff_vs_hf_batched"] == k and alone["native"]["first_diff_vs_native_batched"] is None
    assert (m["unexplained_hf_side"], m["unexplained_native_side"], m["unexplained_undecided"]) == (1, 0, 0)
    if lone_leaves_early:  # the lone runs decide nothing: the reference argmax (native's token) names HF
        assert alone["basis"] == "reference forward" and m["unexplained_by_reference"] == 1
        assert alone["hf"]["at_divergence"] == "earlier" and alone["hf"]["equals"] == "neither"
        assert alone["hf"]["left_common_at"] == k - 1 and alone["hf"]["left_common_at_tie"] is False
    else:
        assert alone["basis"] == "lone runs" and m["unexplained_by_reference"] == 0
        assert alone["hf"]["at_divergence"] == "native" and alone["hf"]["equals"] == "native_batched"
        assert "HF batch-2 (left-padded) diverged" in alone["verdict"]

    m0 = run("--attribute", "0")["match"]  # not examined: counted undecided, no lone runs
    assert "alone" not in m0["divergences"][0] and m0["unexplained_undecided"] == 1 and m0["unexplained_hf_side"] == 0


def test_corrupted_native_batch_is_named_native_side(bench, target, monkeypatch):
    mod, run = bench
    model, _ = target
    real, seen = mod.run_native, {}
    k = 3

    def run_native(gen, prompts, max_new, on_finish=lambda *a: None, log=True):
        def finish(i, toks, reason):
            if i == ROW:  # the batched native answer; the lone native run does not come through here
                seen["honest"] = list(toks)
                toks = corrupt(model, prompts[i], list(toks), k, sorted(gen.eos))
            on_finish(i, toks, reason)
        return real(gen, prompts, max_new, finish, log)

    monkeypatch.setattr(mod, "run_native", run_native)
    m = run()["match"]
    assert m["differing"] == m["unexplained"] == 1
    d = m["divergences"][0]
    assert (d["row"], d["position"], d["tie"]) == (ROW, k, False)
    assert d["signed_gap"] == pytest.approx(d["gap"]) and d["signed_gap"] > d["tie_threshold"]  # native's is low
    assert d["hf_token"]["id"] == seen["honest"][k] == d["ref_argmax"]["id"] and d["ref_argmax_by"] == "hf"
    alone = d["alone"]
    assert (alone["side"], alone["basis"]) == ("native", "lone runs")
    assert alone["native"]["at_divergence"] == "hf" and alone["native"]["equals"] == "hf_batched"
    assert alone["hf"]["at_divergence"] == "hf" and alone["hf"]["equals"] == "hf_batched"
    assert alone["native"]["first_diff_vs_native_batched"] == k
    assert (m["unexplained_hf_side"], m["unexplained_native_side"], m["unexplained_undecided"]) == (0, 1, 0)


def test_no_divergence_without_corruption(bench):
    m = bench[1]()["match"]  # fp32: the two engines agree token for token
    assert (m["exact"], m["differing"], m["unexplained"], m["divergences"]) == (4, 0, 0, [])


@pytest.mark.parametrize("hf_alone,native_alone,ref_by,want", [
    ("native", "native", "native", ("hf", "lone runs")),
    ("native", "other", "hf", ("hf", "lone runs")),        # a lone run's evidence outranks the reference
    ("hf", "hf", "native", ("native", "lone runs")),
    ("earlier", "hf", "neither", ("native", "lone runs")),
    ("hf", "native", "native", ("hf", "reference forward")),  # each engine repeats itself alone
    ("hf", "native", "hf", ("native", "reference forward")),
    ("native", "hf", "hf", ("native", "reference forward")),  # both flip: the lone runs contradict each other
    ("earlier", "earlier", "neither", ("undecided", None)),
    ("other", "other", "both", ("undecided", None)),
])
def test_verdict_table(hf_alone, native_alone, ref_by, want):
    assert load().verdict(hf_alone, native_alone, ref_by) == want
