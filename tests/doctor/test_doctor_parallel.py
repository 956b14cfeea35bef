"""`eyas doctor` on P-EAGLE / DFlash drafts and exports: the mask token, the layer count of config vs weights and
the block size vs the drafted tokens per step are checked from config.json and safetensors headers, no weight read."""

import json

import pytest

from eyas import doctor
from eyas.doctor import DoctorConfig, diagnose
from eyas.draft.io import save_draft
from eyas.engines.vllm import entry_points_for
from eyas.draft.kinds import build_draft, draft_config
from eyas.export import export_vllm
from test_doctor import VOCAB, failures, fake_engine, llama_config, target  # noqa: F401 - the shared fixture


def make_parallel(path, kind, layers=2, K=3):
    dc = draft_config(llama_config(), kind, aux_layer_ids=[2, 3, 4], draft_vocab_size=VOCAB, num_layers=layers,
                      parallel_tokens=K, mask_token_id=VOCAB - 1)
    return save_draft(build_draft(dc), path, {"target": "tiny"})


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Loading a weight file fails the test (doctor reads headers and the small d2t/t2d only)."""
    import safetensors.torch as st

    def refuse(*a, **k):
        raise AssertionError("doctor read weights")
    monkeypatch.setattr(st, "load_file", refuse)
    monkeypatch.setattr("eyas.export.files.load_file", refuse)


@pytest.mark.parametrize("kind", ["p-eagle", "dflash"])
def test_parallel_draft_and_export_pass_without_reading_weights(target, tmp_path, kind, no_weight_reads):
    draft = make_parallel(tmp_path / "draft", kind)
    for d in (draft, export_vllm(draft, tmp_path / "export", verifier=target)):
        checks = {c.name: c for c in diagnose(DoctorConfig(target=target, draft=d))}
        hand = checks[f"draft: {kind} hand-over"]
        assert hand.status == "pass" and checks["draft vs target"].status == "pass", (hand.detail, failures(checks.values()))
        assert f"mask token {VOCAB - 1}" in hand.detail and "2 layers (config = weights)" in hand.detail


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        node = cfg
        *up, last = k.split(".")
        for u in up:
            node = node[u]
        node[last] = v
    (path / "config.json").write_text(json.dumps(cfg))


def test_dflash_export_drafting_past_its_block_fails(target, tmp_path):
    out = export_vllm(make_parallel(tmp_path / "draft", "dflash"), tmp_path / "export", verifier=target)
    cfg = json.loads((out / "config.json").read_text())
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 6
    (out / "config.json").write_text(json.dumps(cfg))
    bad = failures(diagnose(DoctorConfig(target=target, draft=out)))
    assert "block size: vLLM would draft 6 tokens per step" in bad["draft: dflash hand-over"]


def test_layer_count_differing_from_the_weights_fails(target, tmp_path):
    draft = make_parallel(tmp_path / "draft", "p-eagle", layers=3)
    edit_config(draft, **{"draft.num_layers": 2})
    bad = failures(diagnose(DoctorConfig(target=target, draft=draft)))
    assert "config declares 2 decoder layers, the weights hold 3" in bad["draft: p-eagle hand-over"]


def test_mask_token_outside_the_target_vocab_fails(target, tmp_path):
    out = export_vllm(make_parallel(tmp_path / "draft", "dflash"), tmp_path / "export", verifier=target)
    edit_config(out, mask_token_id=VOCAB + 3)
    bad = failures(diagnose(DoctorConfig(target=target, draft=out)))
    assert "mask_token_id" in bad["draft"]


def test_planned_parameters_are_the_planned_kind_s(target):
    facts = doctor.check_target(DoctorConfig(target=target), [])
    counts = {k: doctor.draft_parameters(facts, [2, 3, 4], 40, k) for k in ("eagle3", "p-eagle", "dflash")}
    H, I = 32, 64
    layer = 4 * H * H // 2 * 2 + 3 * H * I          # q/o H x H, k/v H x H/2 (2 of 4 heads), the MLP
    # p-eagle: 3 more llama layers, the mask hidden state and a trainable embedding; dflash: 5 layers of its own
    assert counts["p-eagle"][0] > counts["eagle3"][0] + 3 * layer and counts["p-eagle"][1] == 0
    assert counts["dflash"][0] > 4 * layer and counts["dflash"][1] > 0


# --- the engine's side of the hand-over: the speculators updater and draft class of the kind, and its release

@pytest.mark.parametrize("kind", ["p-eagle", "dflash"])
def test_engine_serving_the_kind_passes_with_its_own_entry_points(target, tmp_path, kind):
    draft = make_parallel(tmp_path / "draft", kind)
    py = fake_engine.make_fake_vllm(tmp_path / "env")
    checks = {c.name: c for c in diagnose(DoctorConfig(target=target, draft=draft, engine="vllm", python=str(py)))}
    assert checks["engine: entry points"].status == "pass", failures(checks.values())
    n_eagle3 = len(entry_points_for())
    n_kind = len(entry_points_for(drafters=(kind,)))
    assert n_kind > n_eagle3 and f"{n_kind}/{n_kind} vLLM entry points bind" in checks["engine: entry points"].detail


def test_engine_without_the_kinds_updater_fails_naming_it(target, tmp_path):
    py = fake_engine.make_fake_vllm(tmp_path / "env", replace={
        ("vllm/transformers_utils/configs/speculators/algos.py", "def update_peagle"): "def update_pard"})
    draft = make_parallel(tmp_path / "draft", "p-eagle")
    bad = failures(diagnose(DoctorConfig(target=target, draft=draft, engine="vllm", python=str(py))))
    assert bad["engine: vllm.transformers_utils.configs.speculators.algos.update_peagle"].startswith("absent")
    # an EAGLE-3 user of the same env is not bothered by the P-EAGLE updater
    ok = {c.name: c for c in diagnose(DoctorConfig(target=target, engine="vllm", python=str(py)))}
    assert ok["engine: entry points"].status == "pass"


def test_dflash_on_a_release_whose_updater_means_other_layers_fails(target, tmp_path):
    # 0.20's update_dflash has eyas's signature but passes the aux ids unchanged: only the version can tell.
    py = fake_engine.make_fake_vllm(tmp_path / "env", replace={("vllm/__init__.py", "'0.32.0'"): "'0.20.0'"})
    draft = make_parallel(tmp_path / "draft", "dflash")
    bad = failures(diagnose(DoctorConfig(target=target, draft=draft, engine="vllm", python=str(py))))
    assert "needs 0.26.0 or newer, this is 0.20.0" in bad["engine: drafter dflash"]
    assert "engine: entry points" not in bad
