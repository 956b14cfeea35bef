"""bench/decode_costs.py and bench/draft_level_ops.py on CPU: each setting timed at its width, and the draft
level's byte ledger (each weight read once, no per-head copy of the KV cache; the copy path moves one)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import eyas.decode.proposer as proposer_module

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_decode_costs_times_each_setting_at_its_width(tmp_path):
    """bench/decode_costs.py (CPU, tiny): a chain's level at width 1, a tree's at its topk, each setting's
    whole draft round, and predictions from both."""
    mod = load("decode_costs")
    out = tmp_path / "costs.json"
    assert mod.main(["--shape", "tiny", "--device", "cpu", "--iters", "1", "--context", "24", "--capacity", "160",
                     "--widths", "4", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["draft_level_s"]) == {"1", "10"} and doc["draft_vocab"] == 512
    assert set(doc["draft_round_s"]) == set(mod.DEFAULT_PROFILES) == {p["setting"] for p in doc["predictions"]}
    for p in doc["predictions"]:
        assert p["round_measured_draft_s"] > 0 and p["efficiency_measured_draft"] > 0
    # every recorded tree cut to each shallower depth: the first d acceptance positions, fewer levels priced
    cuts = {(c["from"], c["depth"]): c for c in doc["shallower_trees"]}
    tree = "tree(total=60,depth=7,topk=10)"
    assert sorted(d for f, d in cuts if f == tree) == [2, 3, 4, 5, 6] and sorted(d for f, d in cuts if f == "chain-3") == [2]
    acc = mod.DEFAULT_PROFILES[tree]
    assert cuts[(tree, 3)]["tau_lower_bound"] == pytest.approx(1 + sum(acc[:3]))
    assert cuts[(tree, 2)]["round_s"] < cuts[(tree, 6)]["round_s"] < next(
        p["round_s"] for p in doc["predictions"] if p["setting"] == tree)


@pytest.mark.parametrize("width", [1, 10])
def test_level_ledger_reads_each_weight_once_and_no_cache_copy(width):
    """bench/draft_level_ops.py: the level's matmuls read the layer and lm_head weights (bf16) once, and
    nothing else moves more than the KV cache itself (no per-head copy of it)."""
    mod = load("draft_level_ops")
    rows, prop = mod.level_ledger("llama-3.1-8b", width, 32000, 1024, 512)   # fake tensors: no memory
    c = prop.draft.config
    H, I, Vd = c.hidden_size, c.intermediate_size, c.draft_vocab_size
    weights = 2 * (2 * H * (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
                   + c.num_attention_heads * c.head_dim * H + 3 * H * I + Vd * H)
    mm = sum(b for name, _, b, _ in rows if name == "mm")
    assert weights <= mm <= 1.05 * weights                      # + the (small) activations
    cache = prop.kbuf.numel() * prop.kbuf.element_size() * 2
    assert max(b for name, _, b, _ in rows if name != "mm") <= 1.1 * cache



def test_cache_copy_escape_hatch_is_the_old_path(monkeypatch):
    """EYAS_DRAFT_CACHE=copy really takes the old path: its ledger moves a repeated (x nh/nkv) cache."""
    mod = load("draft_level_ops")
    monkeypatch.setattr(proposer_module, "_CACHE_COPY", True)
    rows, prop = mod.level_ledger("llama-3.1-8b", 10, 32000, 1024, 512)
    cache = prop.kbuf.numel() * prop.kbuf.element_size() * 2
    assert max(b for name, _, b, _ in rows if name != "mm") > 1.5 * cache
