"""The one owner of stop / pad / bos ids (eyas.target.special): ids from the config and generation_config.json,
never the tokenizer's strings; every stage that stops generating asks it; the GGUF converter (and a tokenizer read
from a GGUF) names the GGUF's own tokenizer.ggml.*_token_id as bos/eos/pad."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from eyas.target import load_target, load_tokenizer
from eyas.target.gguf_convert import gguf_to_hf
from eyas.target.gguf_header import read_header
from eyas.target.gguf_meta import gguf_special_ids
from eyas.target.load import load_special_ids
from eyas.target.special import align_tokenizer, special_ids, target_special_ids, tokenizer_roles
from tests.target.fixtures import CHAT_TEMPLATE, tiny_qwen2, tiny_tokenizer, write_tiny_gguf

UNK, BOS, EOS = 0, 1, 2   # fixtures.SPECIALS: <unk>, <s>, </s>


@pytest.fixture
def qwen_dir(tmp_path):
    """A tiny random Qwen2 whose config says eos </s> (2), whose generation_config.json adds <unk> (0) as a second
    stop id, and whose tokenizer names <s> as eos: the tokenizer is wrong, the config files are right."""
    d = tmp_path / "qwen"
    tiny_qwen2(seed=3, hidden=64).save_pretrained(d)
    gen = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [EOS, UNK]}))
    tok = tiny_tokenizer()
    tok.eos_token = "<s>"
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(d)
    return d


def test_ids_come_from_config_and_generation_config():
    ids = special_ids({"eos_token_id": 7, "bos_token_id": 1}, {"eos_token_id": [7, 9, 3]})
    assert ids.stop == (7, 9, 3) and ids.eos == 7 and ids.bos == 1 and ids.pad == 7   # pad: the primary eos
    ids = special_ids({"eos_token_id": [5, 6], "pad_token_id": 0}, None)
    assert ids.stop == (5, 6) and ids.pad == 0 and ids.bos is None
    assert special_ids({}, {"eos_token_id": 4}).stop == (4,)                       # generation_config alone


def test_a_wrappers_ids_are_read_from_its_text_config():
    from transformers import LlavaConfig

    cfg = LlavaConfig(text_config={"model_type": "llama", "eos_token_id": 11, "bos_token_id": 10})
    for key in ("eos_token_id", "bos_token_id"):
        if hasattr(cfg, key):
            delattr(cfg, key)
    assert special_ids(cfg).stop == (11,) and special_ids(cfg).bos == 10


def test_no_stop_id_is_named_where_answers_must_end():
    ids = special_ids({}, None, where="target 'x'")
    assert ids.stop == () and ids.eos is None   # eval: only the length stops
    with pytest.raises(ValueError, match=r"^target 'x': no eos_token_id in its config or generation_config\.json"):
        ids.required_stop()


def test_every_stage_stops_on_the_config_ids_not_the_tokenizers(qwen_dir):
    """The target loaded (eval, the hf/native regenerate backends), the spec read from config files alone (the vLLM
    regenerate backend, serve-check's engines) and the evaluate session all give one stop set."""
    from eyas.data.backends import HFBackend
    from eyas.decode.session import Session
    from eyas.draft.model import Eagle3Draft, draft_config_from_target

    t = load_target(qwen_dir, dtype=torch.float32)
    assert t.tokenizer.eos_token_id == BOS                       # the wrong tokenizer is not asked
    assert target_special_ids(t).stop == load_special_ids(qwen_dir).stop == (EOS, UNK)
    backend = HFBackend(str(qwen_dir), model=t.model, tokenizer=t.tokenizer, device="cpu")
    assert backend.eos == [UNK, EOS] and backend.pad == 2
    draft = Eagle3Draft(draft_config_from_target(t.model.config, aux_layer_ids=[0, 1]))
    q = [{"question_id": 0, "category": "x", "turns": ["ab cd"]}]
    assert Session(t, draft, q, max_new_tokens=2, compile_graphs=False).eos == {EOS, UNK}


def _load_worker(name: str):
    path = Path(__file__).resolve().parents[2] / "src" / "eyas" / "engines" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"eyas_test_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vllm_serve_worker_stops_only_on_eyas_stop_ids(tmp_path, monkeypatch):
    """Sent stop ids become stop_token_ids with ignore_eos (vLLM's tokenizer-side eos dropped); none sent keeps
    vLLM's own eos."""
    made = []

    class SamplingParams:
        def __init__(self, **kw):
            made.append(kw)

    class LLM:
        def __init__(self, **kw):
            self.llm_engine = types.SimpleNamespace(vllm_config=types.SimpleNamespace(speculative_config=None))

        def generate(self, prompts, params, use_tqdm=False):
            out = types.SimpleNamespace(token_ids=[5], logprobs=None)
            return [types.SimpleNamespace(outputs=[out]) for _ in prompts]

        def get_metrics(self):
            return []

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams,
                                                                    __version__="0"))
    worker = _load_worker("vllm_serve_worker")
    for stop in ([2, 0], None):
        req = {"engine": {"kwargs": {}}, "prompts": [[1, 2]], "max_tokens": 4,
               **({"stop_token_ids": stop} if stop is not None else {})}
        (tmp_path / "in.json").write_text(json.dumps(req))
        worker.main(str(tmp_path / "in.json"), str(tmp_path / "out.json"))
    assert made[0]["stop_token_ids"] == [2, 0] and made[0]["ignore_eos"] is True
    assert "stop_token_ids" not in made[1] and made[1]["ignore_eos"] is False


def test_serve_check_sends_the_engine_the_ids_the_native_side_stopped_on(qwen_dir, tmp_path, monkeypatch):
    from eyas.draft.io import save_draft
    from eyas.draft.model import Eagle3Draft, draft_config_from_target
    from eyas.engines.serve_check import ServeCheckConfig, check
    from eyas.export import export_vllm

    t = load_target(qwen_dir, dtype=torch.float32)
    draft = Eagle3Draft(draft_config_from_target(t.model.config, aux_layer_ids=[0, 1]))
    export = export_vllm(save_draft(draft, tmp_path / "draft", {"target": str(qwen_dir)}), tmp_path / "export")
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"question_id": 0, "category": "x", "turns": ["ab cd"]}) + "\n")
    sent = []

    def fake_run(python, worker, payload, **kw):
        sent.append(payload)
        raise RuntimeError("stop after the payload")

    monkeypatch.setattr("eyas.engines.base.run_in_env", fake_run)
    with pytest.raises(RuntimeError, match="stop after the payload"):
        check(ServeCheckConfig(draft=export, bench=str(bench), max_new_tokens=2, device="cpu",
                               python=sys.executable))
    assert sent[0]["stop_token_ids"] == [UNK, EOS]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("special", [(2, 1, 0), (1, 2, None)])
def test_converted_tokenizer_names_the_ggufs_ids(tmp_path, arch, special):
    """bos/eos/pad swapped against the usual order, or no pad id: the converted tokenizer (and one read straight
    from the GGUF) names exactly the GGUF's ids, as the converted config does, on any transformers."""
    from tests.target.fixtures import tiny_llama

    model = tiny_llama(seed=2) if arch == "llama" else tiny_qwen2(seed=2)
    (tmp_path / "src").mkdir()
    gguf = write_tiny_gguf(tmp_path / "src" / f"{arch}.gguf", model, arch=arch, chat_template=CHAT_TEMPLATE,
                           special=special)
    want = dict(zip(("bos", "eos", "pad"), special))
    assert gguf_special_ids(read_header(gguf)) == want
    gguf_to_hf(gguf, tmp_path / "hf", dtype=torch.float32, device="cpu")
    assert tokenizer_roles(load_tokenizer(tmp_path / "hf")) == want
    assert tokenizer_roles(load_tokenizer(gguf)) == want
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert [config.get(f"{r}_token_id") for r in ("bos", "eos")] == list(special[:2])


def test_align_tokenizer_names_a_bad_id():
    tok = tiny_tokenizer()
    assert tokenizer_roles(align_tokenizer(tok, {"eos": 1, "pad": None})) == {"bos": 1, "eos": 1, "pad": None}
    with pytest.raises(ValueError, match=r"^eos_token_id 99: not a token of the tokenizer \(56 tokens\)"):
        align_tokenizer(tok, {"eos": 99})
