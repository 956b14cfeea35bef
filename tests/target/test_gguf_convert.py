"""eyas's GGUF -> HF conversion equals transformers' own GGUF load: weights and logits, llama and qwen2 layouts,
every quant type eyas dequantises in torch (the K-quants as random well-formed blocks: gguf cannot quantize them)."""

from __future__ import annotations

import json

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoModelForCausalLM, AutoTokenizer

from eyas.target import load_target
from eyas.target.gguf_convert import check_state, gguf_to_hf, hf_name, unpermute
from tests.target.fixtures import VOCAB, tiny_llama, tiny_qwen2, write_tiny_gguf

LLAMA_TYPES = {"token_embd": Q.Q8_0, "output": Q.Q4_0, "attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.Q5_0,
               "attn_output": Q.Q5_1, "ffn_gate": Q.F16, "ffn_up": Q.BF16, "ffn_down": Q.Q8_0}
QWEN2_TYPES = {"token_embd": Q.Q4_K, "output": Q.Q6_K, "attn_q": Q.Q4_K, "attn_k": Q.Q5_K, "attn_v": Q.Q6_K,
               "attn_output": Q.Q8_0, "ffn_gate": Q.Q5_0, "ffn_up": Q.Q4_K, "ffn_down": Q.Q6_K}


def _qtypes(kinds: dict, layers: int) -> dict:
    out = {f"{k}.weight": q for k, q in kinds.items() if not k.startswith(("attn", "ffn"))}
    out.update({f"blk.{i}.{k}.weight": q for i in range(layers) for k, q in kinds.items()
                if k.startswith(("attn", "ffn"))})
    return out


@pytest.fixture(params=["llama", "qwen2"])
def gguf_file(request, tmp_path):
    arch = request.param
    model = tiny_llama(seed=11, tie=False) if arch == "llama" else tiny_qwen2(seed=12)
    kinds = LLAMA_TYPES if arch == "llama" else QWEN2_TYPES
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", model, arch=arch,
                           qtypes=_qtypes(kinds, model.config.num_hidden_layers))
    return arch, path


def _transformers_load(path):
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def test_weights_and_logits_equal_transformers_gguf_load(gguf_file, tmp_path):
    arch, path = gguf_file
    report = gguf_to_hf(path, tmp_path / "hf32", dtype=torch.float32, device="cpu", write_threads=1 + (arch == "llama"))
    assert report["reader"] == "eyas" and report["arch"] == arch and report["metadata"] == "header"
    assert set(report["types"]) >= {q.name for q in (LLAMA_TYPES if arch == "llama" else QWEN2_TYPES).values()}
    ref = _transformers_load(path)
    got = load_target(tmp_path / "hf32", dtype=torch.float32)
    a, b = ref.state_dict(), got.model.state_dict()
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = got.model(input_ids=ids).logits
        assert torch.isfinite(logits).all() and logits.std() > 0
        assert torch.equal(ref(input_ids=ids).logits, logits)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert got.tokenizer("ab cd").input_ids == tok("ab cd").input_ids


def test_bf16_dir_is_the_float32_weights_rounded_once(gguf_file, tmp_path):
    arch, path = gguf_file
    gguf_to_hf(path, tmp_path / "hf32", dtype=torch.float32, device="cpu")
    gguf_to_hf(path, tmp_path / "hf16", device="cpu")
    config = json.loads((tmp_path / "hf16" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"]
    assert (tmp_path / "hf16" / "generation_config.json").is_file()
    from safetensors.torch import load_file

    f32, b16 = load_file(tmp_path / "hf32" / "model.safetensors"), load_file(tmp_path / "hf16" / "model.safetensors")
    assert set(f32) == set(b16)
    for k in f32:
        assert b16[k].dtype == torch.bfloat16 and torch.equal(b16[k], f32[k].to(torch.bfloat16)), k


def test_unpermute_inverts_llama_cpp_row_order():
    from tests.target.fixtures import _to_llama_cpp_rows

    w = torch.randn(4 * 8, 16)
    assert torch.equal(unpermute(torch.from_numpy(_to_llama_cpp_rows(w.numpy(), 4)), 4), w)


def test_unknown_tensor_name_is_named():
    assert hf_name("blk.3.ffn_up.weight", "qwen2") == "model.layers.3.mlp.up_proj.weight"
    with pytest.raises(KeyError, match=r"GGUF tensor 'blk.0.ffn_gate_exps.weight' has no HF name for a qwen2 model"):
        hf_name("blk.0.ffn_gate_exps.weight", "qwen2")


def test_missing_or_misshapen_tensor_is_named():
    model = tiny_llama(tie=False)
    state = dict(model.state_dict())
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"x.gguf: the GGUF's tensors are not the model's: missing "
                                         r"\['model.layers.1.mlp.up_proj.weight'\]"):
        check_state(state, model.config, "x.gguf")
    state = dict(model.state_dict(), **{"model.norm.weight": torch.ones(7)})
    with pytest.raises(ValueError, match=r"tensor model.norm.weight has shape \[7\], the model's is \[32\]"):
        check_state(state, model.config, "x.gguf")


def test_not_a_gguf_is_named(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"definitely not gguf" * 4)
    with pytest.raises(ValueError, match="bad.gguf: not a readable GGUF file"):
        gguf_to_hf(bad, tmp_path / "out", device="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_conversion_on_cuda_equals_the_cpu_one(gguf_file, tmp_path):
    from safetensors.torch import load_file

    _, path = gguf_file
    cpu = gguf_to_hf(path, tmp_path / "cpu", device="cpu")
    gpu = gguf_to_hf(path, tmp_path / "gpu", device="cuda")
    assert cpu["device"] == "cpu" and gpu["device"].startswith("cuda")
    a, b = load_file(tmp_path / "cpu" / "model.safetensors"), load_file(tmp_path / "gpu" / "model.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
