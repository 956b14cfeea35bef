"""`eyas doctor` on Kimi-K2.5 (the wrapped MLA + MoE target): the toy passes with the engine probe and names the
wrapper path, MLA and MoE; the full-size config is read without remote code; a wrong aux id, wrapper path or draft
hidden size fails with one line, before the engine is even probed."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from eyas.doctor import DoctorConfig, diagnose
from eyas.draft.io import save_draft
from eyas.draft.model import Eagle3Draft, draft_config_from_target
from eyas.engines.vllm import KIMI_K25, entry_points_for
from eyas.target import load_config
from eyas.target.toys import build_toy, toy_tokenizer

_spec = importlib.util.spec_from_file_location("fake_engine", Path(__file__).parents[1] / "engines/data/fake_engine.py")
fake_engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_engine)
FULL = Path(__file__).parents[1] / "target" / "data" / "kimi-k2.5-config.json"


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return str(build_toy(tmp_path_factory.mktemp("kimi"), "kimi-k2.5", size="tiny"))


def by_name(checks):
    return {c.name: c for c in checks}


def test_toy_with_the_engine_probe_passes_and_names_wrapper_mla_moe(toy, tmp_path):
    checks = by_name(diagnose(DoctorConfig(target=toy, engine="vllm", python=str(fake_engine.make_fake_vllm(tmp_path)))))
    assert [n for n, c in checks.items() if c.status == "fail"] == []
    assert checks["decoder layers"].detail.startswith(
        "language_model.model.layers (8 x DeepseekV3DecoderLayer in KimiK25ForConditionalGeneration (text model "
        "DeepseekV3ForCausalLM))")
    blocks = checks["decoder blocks"].detail
    assert "attention MLA (2 heads, q_lora_rank 32, kv_lora_rank 32" in blocks and "mlp MoE (8 routed experts, top-2, " \
        "1 shared, first 1 layer(s) dense" in blocks
    n = len(entry_points_for(KIMI_K25))
    assert n > len(entry_points_for()) and f"{n}/{n} vLLM entry points bind" in checks["engine: entry points"].detail
    assert "serves KimiK25ForConditionalGeneration with its decoder layers at language_model.model.layers " \
           "(DeepseekV2ForCausalLM) (eyas captures language_model.model.layers)" in checks["engine: target"].detail


def test_an_engine_without_the_wrapper_fails_naming_it(toy, tmp_path):
    py = fake_engine.make_fake_vllm(tmp_path, replace={("vllm/model_executor/models/kimi_k25.py",
                                                        "    def set_aux_hidden_state_layers(self, layers):\n"): (
        "    def set_aux_layers(self, layers):\n")})
    bad = {c.name: c.detail for c in diagnose(DoctorConfig(target=toy, engine="vllm", python=str(py)))
           if c.status == "fail"}
    assert "lacks ['set_aux_hidden_state_layers']" in bad["engine: vllm.model_executor.models.kimi_k25."
                                                          "KimiK25ForConditionalGeneration"]
    assert "lacks what serving KimiK25ForConditionalGeneration needs" in bad["engine: target"]


def _fails_before_the_probe(checks) -> dict[str, str]:
    """The failing checks, one line each; the engine (a python that does not exist) was never started."""
    by = by_name(checks)
    assert by["engine: vllm"].status == "skip" and "fix the failures above first" in by["engine: vllm"].detail
    bad = {c.name: c.detail for c in checks if c.status == "fail"}
    assert bad and all("\n" not in d for d in bad.values())
    return bad


def test_aux_id_out_of_range_fails_before_the_probe(toy):
    bad = _fails_before_the_probe(diagnose(DoctorConfig(target=toy, engine="vllm", python="/no/such/python",
                                                        aux_layer_ids=[2, 4, 8])))
    assert "[8] out of range: the target has 8 decoder layers" in bad["aux layer ids"]


def test_aux_id_zero_fails_for_vllms_deepseek_decoder(toy):
    bad = _fails_before_the_probe(diagnose(DoctorConfig(target=toy, engine="vllm", python="/no/such/python",
                                                        aux_layer_ids=[0, 3, 5])))
    assert "aux id 0: vLLM runs a deepseek_v3 text model with DeepseekV2Model" in bad["engine: aux layer ids"]


def test_wrong_wrapper_path_fails_before_the_probe(toy):
    bad = _fails_before_the_probe(diagnose(DoctorConfig(target=toy, engine="vllm", python="/no/such/python",
                                                        layers_path="model.language_model.layers")))
    assert bad["layer path"].startswith("--layers-path model.language_model.layers does not exist in "
                                        "KimiK25ForConditionalGeneration (text model DeepseekV3ForCausalLM); the "
                                        "decoder layers are at language_model.model.layers")


def test_draft_for_another_hidden_size_fails_before_the_probe(toy, tmp_path):
    text = load_config(toy).text_config
    text.hidden_size = 128
    draft = save_draft(Eagle3Draft(draft_config_from_target(text, aux_layer_ids=[2, 4, 5], draft_vocab_size=64)),
                       tmp_path / "draft", {"target": "other"})
    bad = _fails_before_the_probe(diagnose(DoctorConfig(target=toy, engine="vllm", python="/no/such/python",
                                                        draft=draft)))
    assert "hidden size mismatch: draft expects target hidden 128, target has 64" in bad["draft vs target"]


def test_full_size_kimi_k25_fits_eight_h200_as_int4(tmp_path):
    path = tmp_path / "k25"
    path.mkdir()
    shutil.copy(FULL, path / "config.json")
    toy_tokenizer().save_pretrained(path)
    checks = by_name(diagnose(DoctorConfig(target=str(path), gpus=8, gpu_memory_gib=141, max_samples=1000,
                                           max_length=4096, store=tmp_path)))
    assert checks["decoder layers"].detail.startswith("language_model.model.layers (61 x DeepseekV3DecoderLayer in "
                                                      "KimiK25ForConditionalGeneration")
    assert "MLA (64 heads" in checks["decoder blocks"].detail and "MoE (384 routed experts, top-8" in \
        checks["decoder blocks"].detail
    assert checks["aux layer ids"].detail.startswith("[2, 30, 58]")
    # ~1T int4 weights over 8 GPUs: ~60 GiB each, where bf16 would need ~240 GiB
    assert checks["GPU memory: extraction"].status == "pass", checks["GPU memory: extraction"].detail
