"""The config and tokenizer built from the parsed GGUF header equal what transformers builds from the GGUF file:
config dicts, the saved tokenizer files byte for byte, encode/decode and chat template output over a few hundred
strings; a key the config table does not know, or one that would change the model, is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from eyas.target.gguf_convert import gguf_to_hf
from eyas.target.gguf_header import GGUFHeader, read_header
from eyas.target.gguf_meta import config_dict, hf_config, legacy_fields
from eyas.target.gguf_verify import sample_texts, tokenizer_differences, verify
from tests.target.fixtures import CHAT_TEMPLATE, tiny_llama, tiny_qwen2, write_tiny_gguf


@pytest.fixture(params=["llama", "qwen2"])
def gguf_file(request, tmp_path):
    arch = request.param
    model = tiny_llama(seed=5) if arch == "llama" else tiny_qwen2(seed=6)   # the llama one tied
    (tmp_path / "src").mkdir()   # the GGUF's own directory: transformers looks beside it for tokenizer files
    return write_tiny_gguf(tmp_path / "src" / f"{arch}.gguf", model, arch=arch, chat_template=CHAT_TEMPLATE)


def test_config_equals_transformers_gguf_config(gguf_file):
    ref = AutoConfig.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    ours = hf_config(read_header(gguf_file))
    assert type(ours) is type(ref)
    assert ours.to_dict() == ref.to_dict()    # _name_or_path included: set to the GGUF's directory, as there


def test_converted_dir_holds_transformers_config_and_tokenizer(gguf_file, tmp_path):
    report = gguf_to_hf(gguf_file, tmp_path / "hf", dtype=torch.float32, device="cpu")
    assert report["metadata"] == "header"
    result = verify(gguf_file, tmp_path / "hf")
    assert result["config_differences"] == {}
    tok = result["tokenizer"]
    assert tok["files_differ"] == [] and tok["mismatched"] == 0 and tok["chats"] == 4, tok["first_mismatch"]
    assert tok["texts"] >= 200 and result["equal"]


def test_a_tokenizer_difference_is_found(gguf_file, tmp_path):
    """The check can fail: a saved tokenizer with a merge removed encodes differently."""
    import json

    gguf_to_hf(gguf_file, tmp_path / "hf", dtype=torch.float32, device="cpu")
    path = tmp_path / "hf" / "tokenizer.json"
    data = json.loads(path.read_text())
    data["model"]["merges"] = data["model"]["merges"][1:]
    path.write_text(json.dumps(data))
    found = tokenizer_differences(gguf_file, tmp_path / "hf", texts=sample_texts())
    assert found["files_differ"] == ["tokenizer.json"] and found["mismatched"] > 0 and not found["equal"]


def test_a_tokenizer_config_beside_the_gguf_takes_transformers_own_path(gguf_file, tmp_path):
    (gguf_file.parent / "tokenizer_config.json").write_text('{"tokenizer_class": "TokenizersBackend"}')
    report = gguf_to_hf(gguf_file, tmp_path / "hf", dtype=torch.float32, device="cpu")
    assert report["metadata"] == "a tokenizer_config.json lies beside the GGUF"
    assert verify(gguf_file, tmp_path / "hf")["equal"]


def test_legacy_fields_are_load_gguf_checkpoints(gguf_file):
    """transformers 5.17 reads the tokenizer through load_gguf_checkpoint: the same rename loop over the header
    gives its dicts (checked with this transformers' table; on 5.17 the table is integrations.ggml's)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING, load_gguf_checkpoint

    parsed = load_gguf_checkpoint(str(gguf_file))
    mapping = {"tokenizer": GGUF_TO_TRANSFORMERS_MAPPING["tokenizer"]["tokenizer"],
               "tokenizer_config": GGUF_TO_TRANSFORMERS_MAPPING["tokenizer_config"]["tokenizer"]}
    tokenizer, tokenizer_config = legacy_fields(read_header(gguf_file), mapping)
    assert tokenizer == parsed["tokenizer"] and tokenizer_config == parsed["tokenizer_config"]
    assert len(tokenizer["tokens"]) == 56 and tokenizer_config["chat_template"] == CHAT_TEMPLATE


def _header(arch: str, **meta) -> GGUFHeader:
    base = {"general.architecture": arch, f"{arch}.block_count": 2, f"{arch}.embedding_length": 64,
            f"{arch}.feed_forward_length": 128, f"{arch}.attention.head_count": 4}
    return GGUFHeader(Path("m.gguf"), 3, {**base, **meta}, {}, [], 32, 0, 0)


def test_config_table_names_a_missing_unknown_or_contradicting_key():
    c = config_dict(_header("qwen2", **{"qwen2.attention.key_length": 16, "qwen2.rope.dimension_count": 16,
                                        "tokenizer.ggml.eos_token_id": 7}))
    assert c["num_hidden_layers"] == 2 and c["hidden_size"] == 64 and c["eos_token_id"] == 7
    assert c["tie_word_embeddings"] is True
    h = _header("qwen2")
    del h.metadata["qwen2.block_count"]
    with pytest.raises(ValueError, match=r"m.gguf: GGUF key qwen2.block_count is missing; the HF config needs it as "
                                         r"num_hidden_layers"):
        config_dict(h)
    with pytest.raises(ValueError, match=r"m.gguf: GGUF key 'llama.attention.sliding_window' \(= 4096\) has no HF "
                                         r"config key for a llama model"):
        config_dict(_header("llama", **{"llama.attention.sliding_window": 4096}))
    with pytest.raises(ValueError, match=r"GGUF key 'llama.rope.scaling.type' is 'yarn'; the HF llama config eyas "
                                         r"writes can only mean 'none', so the converted model would differ"):
        config_dict(_header("llama", **{"llama.rope.scaling.type": "yarn"}))
    with pytest.raises(ValueError, match=r"GGUF key 'qwen2.attention.key_length' is 32; .* can only mean 16"):
        config_dict(_header("qwen2", **{"qwen2.attention.key_length": 32}))
    with pytest.raises(ValueError, match=r"GGUF key 'llama.expert_count' is 8"):
        config_dict(_header("llama", **{"llama.expert_count": 8}))
    with pytest.raises(ValueError, match=r"GGUF key 'llama.block_count' holds list"):
        config_dict(_header("llama", **{"llama.block_count": [2, 2]}))
    with pytest.raises(ValueError, match=r"GGUF architecture 'gemma' has no config table"):
        config_dict(_header("gemma"))
