"""bench/random_draft.py: a random draft of the target's real shapes that eyas's own loader reads back."""

import importlib.util
from pathlib import Path

from eyas.aux_layers import default_aux_layer_ids
from eyas.draft.io import load_draft
from tests.decode.conftest import tiny_llama

BENCH = Path(__file__).resolve().parents[2] / "bench" / "random_draft.py"


def test_random_draft_has_the_target_s_shapes_and_loads(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_random_draft", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    target = tiny_llama(seed=0, vocab=128)
    target.save_pretrained(tmp_path / "t")
    assert mod.main(["--target", str(tmp_path / "t"), "--out", str(tmp_path / "d"), "--draft-vocab-size", "64"]) == 0
    draft, _ = load_draft(tmp_path / "d")
    cfg = draft.config
    assert cfg.hidden_size == target.config.hidden_size and cfg.draft_vocab_size == 64
    assert list(cfg.aux_layer_ids) == default_aux_layer_ids(target.config.num_hidden_layers)
