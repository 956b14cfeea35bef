"""Tiny target + tiny PREPARED dir builders, built in-process (no network); shared by store and engine tests."""

import numpy as np
import pytest
import torch


def make_tiny_target(path, layers=6, hidden=32, vocab=96):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    # load_target also loads a tokenizer; a word-level one over the id range is enough here.
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(path)
    return path


def make_prepared(path, rows, vocab=96, max_length=40, shard_rows=5):
    """rows: list of rows, each a list of document lengths. Random ids; loss on the second half of each doc."""
    from eyas.data.dataset import PreparedWriter, write_manifest

    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(rows))
    w = PreparedWriter(path, shard_rows=shard_rows)
    for docs in rows:
        w.add([(rng.integers(0, vocab, n), np.arange(n) >= n // 2) for n in docs])
    w.flush()
    write_manifest(path, {"format": "eyas-prepared", "format_version": 1, "target": {"name": "tiny", "vocab_size": vocab},
                          "max_length": max_length, "shards": w.shards, "summary": {"rows": len(rows)}})
    return path


ROWS = [[40], [12, 20, 8], [33], [5, 5, 5], [17, 9], [40], [2], [30, 10], [25], [11, 11, 11, 7], [38], [19]]



@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    return make_prepared(tmp_path_factory.mktemp("prepared"), ROWS)
