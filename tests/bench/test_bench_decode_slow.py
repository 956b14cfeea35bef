"""bench/decode.py --tiny on CPU with the real SmolLM2-135M and a draft initialised from it: the same
path the GPU must-show runs (Spec-Bench prompts through the chat template, chain-3 + tree, JSON)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow


def test_bench_decode_tiny(tmp_path):
    from eyas.draft.io import save_draft
    from eyas.draft.model import Eagle3Draft, draft_config_from_target
    from eyas.target import default_aux_layer_ids, load_target

    t = load_target("smollm2-135m", dtype=torch.float32)
    d = Eagle3Draft(draft_config_from_target(t.config, aux_layer_ids=default_aux_layer_ids(t.layout.num_layers)))
    d.init_from_target(t.layout.embed.weight, t.layout.lm_head.weight, t.layout.norm.weight)
    save_draft(d, tmp_path / "draft", {"target": "smollm2-135m"})
    spec = importlib.util.spec_from_file_location("bench_decode", Path(__file__).parents[2] / "bench" / "decode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "decode-tiny.json"
    assert mod.main(["--draft", str(tmp_path / "draft"), "--tiny", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    greedy, sampled = doc["runs"]  # default --temperatures 0 1
    for run in (greedy, sampled):
        assert [r["setting"] for r in run["results"]] == ["chain-3", "tree(total=8,depth=4,topk=2)"]
    for r in greedy["results"]:
        assert r["identical_rate"] == 1.0 and set(r["per_category"]) == {"writing", "math_reasoning"}
        assert r["tie_aware_identical_rate"] == 1.0 and r["unexplained_divergences"] == 0
    for r in sampled["results"]:
        assert r["decode"]["temperature"] == 1.0 and r["tau"] >= 1.0
    assert [s["round_ms"]["verify"] > 0 for s in doc["summary"]] == [True] * 4
