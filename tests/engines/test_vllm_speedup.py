"""The speedup sweep's vLLM payloads: engines sharing a GPU get an explicit KV cache each, sized from configs."""

from __future__ import annotations

import json
import math
import sys

import pytest

import eyas.engines.speedup as sweep
import eyas.engines.vllm as vs

# Llama-shaped: 4 layers x 2 KV heads x head_dim 8 (no head_dim key: hidden 32 / 4 heads) -> 256 bytes/token in bf16
TARGET_CFG = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "hidden_size": 32}
# the export's transformer_layer_config: one layer, here with its own head_dim 16 -> 1 x 2 x 2 x 16 x 2 = 128 bytes
DRAFT_CFG = {"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
             "hidden_size": 32, "head_dim": 16}


def test_kv_bytes_per_token_reads_the_text_config_and_head_dim():
    assert vs.kv_bytes_per_token(TARGET_CFG, "bfloat16") == 4 * 2 * 2 * 8 * 2
    assert vs.kv_bytes_per_token(DRAFT_CFG, "float32") == 1 * 2 * 2 * 16 * 4
    # a multimodal config keeps its language model under text_config; MHA when num_key_value_heads is absent
    mm = {"model_type": "llava", "text_config": {**TARGET_CFG, "num_key_value_heads": None}}
    assert vs.kv_bytes_per_token(mm, "bfloat16") == 4 * 2 * 4 * 8 * 2


def test_kv_bytes_per_token_of_mla_is_the_latent_plus_the_rope_key():
    # MLA caches one kv_lora_rank latent and one qk_rope_head_dim key per token and layer, whatever the head count
    # (a Kimi-K2.5 wrapper: its DeepSeek-V3 text model under text_config)
    mla = {"model_type": "kimi_k25", "text_config": {
        "model_type": "deepseek_v3", "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 8,
        "hidden_size": 64, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16}}
    assert vs.kv_bytes_per_token(mla, "bfloat16") == 6 * (32 + 16) * 2
    assert vs.engine_memory(2, mla, None, 1, 100, "bfloat16")["kv_cache_memory_bytes"] == \
        math.ceil(6 * 48 * 2 * (100 + vs.SLACK_TOKENS) * vs.KV_MARGIN)


def test_draft_layer_comes_from_the_export_else_one_target_layer():
    assert vs.draft_layers({"transformer_layer_config": DRAFT_CFG}, TARGET_CFG) == DRAFT_CFG
    assert vs.kv_bytes_per_token(vs.draft_layers(None, TARGET_CFG), "bfloat16") == 2 * 2 * 8 * 2


def write_models(root, chains, target="t", export="x"):
    """A target dir and one export dir per K, each with just the config.json the driver sizes KV caches from."""
    (root / target).mkdir()
    (root / target / "config.json").write_text(json.dumps(TARGET_CFG))
    for k in chains:
        (root / f"{export}{k}").mkdir()
        (root / f"{export}{k}" / "config.json").write_text(json.dumps({"transformer_layer_config": DRAFT_CFG}))
    return str(root / target), str(root / (export + "{k}"))


def payloads(tmp_path, monkeypatch, engines_per_gpu, **kw) -> dict:
    """What `measure` hands each engine's worker (no engine runs)."""
    sent = {}

    def fake_worker(python, worker, payload, **_):
        sent[payload["barrier"]["name"]] = payload
        raise RuntimeError("no engine here")

    monkeypatch.setattr(sweep, "run_in_env", fake_worker)
    target, export = write_models(tmp_path, [2, 5])
    res = sweep.measure(vs.VllmAdapter(sys.executable), target, export, [[1, 2]], [2, 5], [1, 8, 32], 4, ["0"],
                        tmp_path / "logs", max_model_len=128, engines_per_gpu=engines_per_gpu, **kw)
    assert set(res["failed"]) == {"base", "k2", "k5"}
    return {name: {**p["engine"]["kwargs"], "draft": p["engine"]["draft"]} for name, p in sent.items()}


def test_side_by_side_engines_get_their_own_kv_size(tmp_path, monkeypatch):
    sent = payloads(tmp_path, monkeypatch, 3)
    tokens = 32 * (128 + vs.SLACK_TOKENS)  # the largest batch, each sequence at full length plus slack
    base, k2, k5 = (sent[n] for n in ("base", "k2", "k5"))
    assert base["kv_cache_memory_bytes"] == pytest.approx(256 * tokens * 1.1, abs=1)
    assert k2["kv_cache_memory_bytes"] == k5["kv_cache_memory_bytes"] == pytest.approx((256 + 128) * tokens * 1.1,
                                                                                         abs=1)
    assert all(isinstance(p["kv_cache_memory_bytes"], int) for p in sent.values())
    # vLLM still wants this share free at start-up: three of them must fit on the GPU together
    assert all(p["gpu_memory_utilization"] == pytest.approx(0.85 / 3) for p in sent.values())
    assert base["dtype"] == "bfloat16" and base["max_model_len"] == 128
    # the plain target is the model of the base engine; each K's engine serves its own export (its K inside)
    assert base["model"].endswith("/t") and base["draft"] is None
    assert k5["model"] == k5["draft"] and k5["draft"].endswith("/x5")
    assert "speculative_config" not in k5


def test_an_engine_alone_on_its_gpu_keeps_vllms_own_sizing(tmp_path, monkeypatch):
    sent = payloads(tmp_path, monkeypatch, 1)
    assert not any("kv_cache_memory_bytes" in p for p in sent.values())
    assert all(p["gpu_memory_utilization"] == 0.9 for p in sent.values())  # vLLM's own default


def test_side_by_side_without_a_target_config_fails_before_any_engine(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "run_in_env", lambda *a, **k: pytest.fail("an engine was started"))
    (tmp_path / "t").mkdir()  # a target dir without config.json
    with pytest.raises(FileNotFoundError, match="config.json"):
        sweep.measure(vs.VllmAdapter(sys.executable), str(tmp_path / "t"), str(tmp_path / "x{k}"), [[1]], [2], [1],
                      4, ["0"], tmp_path / "logs", engines_per_gpu=2)


def test_a_built_in_target_reaches_the_engine_as_its_local_dir(tmp_path, monkeypatch):
    # vLLM knows nothing of eyas's built-ins: given "smollm2-135m" it went to the hub (found by the drafters recipe)
    import eyas.target.load as load

    target, export = write_models(tmp_path, [2])
    monkeypatch.setattr(load, "builtin_target_dir", lambda name, cache=None: target)
    sent = {}

    def fake_worker(python, worker, payload, **_):
        sent[payload["barrier"]["name"]] = payload["engine"]
        raise RuntimeError("no engine here")
    monkeypatch.setattr(sweep, "run_in_env", fake_worker)
    sweep.measure(vs.VllmAdapter(sys.executable), "smollm2-135m", export, [[1]], [2], [1], 4, ["0"], tmp_path / "logs")
    assert sent["base"]["kwargs"]["model"] == target   # (the speculative engines load the export, naming its verifier)


def test_engine_path_keeps_what_it_does_not_know(tmp_path):
    from eyas.target.load import engine_path

    (tmp_path / "m").mkdir()
    assert engine_path(tmp_path / "m" / ".." / "m") == str((tmp_path / "m").resolve())
    assert engine_path("Qwen/Qwen2.5-1.5B") == "Qwen/Qwen2.5-1.5B"          # a hub id: the engine's to fetch
