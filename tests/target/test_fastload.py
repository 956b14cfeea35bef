"""The fast target load (meta build, parallel mmap'd reads, assign) equals from_pretrained: every weight,
every buffer and the logits; single-file, sharded multi-file and GGUF checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, LlamaForCausalLM

from eyas.target import load_target
from eyas.target.fastload import FastLoadUnsupported, fast_load_model, safetensors_files
from tests.target.fixtures import VOCAB, tiny_llama, tiny_tokenizer, write_hf_dir, write_tiny_gguf


def _assert_same(fast, ref):
    sd_f, sd_r = fast.state_dict(), ref.state_dict()
    assert sd_f.keys() == sd_r.keys()
    for k in sd_r:
        assert sd_f[k].dtype == sd_r[k].dtype and torch.equal(sd_f[k], sd_r[k]), k
    for (n, a), (_, b) in zip(fast.named_buffers(), ref.named_buffers()):
        assert torch.equal(a, b), n
    ids = torch.randint(0, VOCAB, (2, 9))
    assert torch.equal(fast(input_ids=ids).logits, ref(input_ids=ids).logits)
    assert not fast.training and not any(p.requires_grad for p in fast.parameters())


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("shard", [None, "20KB"])
def test_fast_load_equals_from_pretrained(tmp_path, tie, shard):
    src = tiny_llama(tie=tie)
    d = tmp_path / "m"
    if shard:
        src.save_pretrained(d, max_shard_size=shard)
    else:
        write_hf_dir(d, src)
    files = safetensors_files(d)
    assert (len(files) > 2) == bool(shard), files
    for dtype in (torch.float32, torch.bfloat16):
        ref = LlamaForCausalLM.from_pretrained(d, dtype=dtype).eval()
        fast = fast_load_model(d, AutoConfig.from_pretrained(d), dtype=dtype, workers=3)
        _assert_same(fast, ref)
        if tie:
            assert fast.lm_head.weight.data_ptr() == fast.model.embed_tokens.weight.data_ptr()


def test_fast_load_gguf_equals_from_pretrained(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_llama())
    ref = LlamaForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    cfg = AutoConfig.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    fast = fast_load_model(tmp_path, cfg, dtype=torch.float32, gguf_file=gguf.name)
    _assert_same(fast, ref)


def test_load_target_uses_the_fast_path_and_falls_back(tmp_path, monkeypatch):
    src = tiny_llama()
    src.save_pretrained(tmp_path / "m", max_shard_size="20KB")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    write_hf_dir(tmp_path / "one", src)
    t = load_target(tmp_path / "m", dtype=torch.float32)
    assert t.load_path == "fast"
    _assert_same(t.model, src)
    # a checkpoint whose keys need from_pretrained's renames: the fast path refuses, load_target falls back
    idx = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    from safetensors.torch import load_file, save_file
    for f in set(idx["weight_map"].values()):
        sd = load_file(tmp_path / "m" / f)
        save_file({("base." + k): v for k, v in sd.items()}, tmp_path / "m" / f, metadata={"format": "pt"})
    idx["weight_map"] = {"base." + k: v for k, v in idx["weight_map"].items()}
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(FastLoadUnsupported, match="missing"):
        fast_load_model(tmp_path / "m", AutoConfig.from_pretrained(tmp_path / "m"), dtype=torch.float32)
    t2 = load_target(tmp_path / "one", dtype=torch.float32, fast=False)
    assert t2.load_path == "from_pretrained"
    _assert_same(t2.model, src)


def test_missing_shard_names_the_file(tmp_path):
    tiny_llama().save_pretrained(tmp_path, max_shard_size="20KB")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[0]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match="missing"):
        safetensors_files(tmp_path)
