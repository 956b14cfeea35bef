"""Grouped decode attention: equal to sdpa over repeated K/V (groups 1 and 3, masked tails, per-head masks);
anything it does not handle goes to transformers' sdpa unchanged; the generator switches a model to it only
for its own forward calls, and only from "sdpa"."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv

import eyas.data.attention as attention
from eyas.data.attention import NAME, grouped_attention, grouped_decode_attention
from eyas.data.generate import Generator


def module(groups: int) -> torch.nn.Module:
    m = torch.nn.Module()
    m.num_key_value_groups, m.is_causal = groups, True
    return m


def inputs(B: int, hkv: int, g: int, S: int = 40, d: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, T, d, generator=gen) for n, T in ((hkv * g, 1), (hkv, S), (hkv, S)))
    seen = torch.randint(1, S, (B,), generator=gen)  # row b sees columns < seen[b]: the tail is masked out
    neg = torch.finfo(torch.float32).min
    mask = torch.zeros(B, S).masked_fill(torch.arange(S)[None] >= seen[:, None], neg)[:, None, None, :]
    return q, k, v, mask


def reference(q, k, v, mask, g, scale):
    out = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, g), repeat_kv(v, g), attn_mask=mask,
                                                           scale=scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("g", [1, 3])
@pytest.mark.parametrize("B", [1, 5])
def test_grouped_equals_sdpa_over_repeated_kv(B, g):
    q, k, v, mask = inputs(B, hkv=2, g=g)
    out, weights = grouped_decode_attention(module(g), q, k, v, mask, scaling=0.3)
    assert weights is None and out.shape == (B, 1, 2 * g, 16) and out.is_contiguous()
    torch.testing.assert_close(out, reference(q, k, v, mask, g, 0.3), rtol=1e-5, atol=1e-5)
    per_head = mask.expand(B, 2 * g, 1, mask.shape[-1]).clone()  # a per-head mask follows its heads
    per_head[:, -1, :, 0] = torch.finfo(torch.float32).min
    out, _ = grouped_decode_attention(module(g), q, k, v, per_head, scaling=0.3)
    torch.testing.assert_close(out, reference(q, k, v, per_head, g, 0.3), rtol=1e-5, atol=1e-5)
    out, _ = grouped_decode_attention(module(g), q, k, v, None)  # no mask, default scale
    torch.testing.assert_close(out, reference(q, k, v, None, g, None), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["prefill", "dropout", "softcap", "sinks", "position_bias", "ungrouped"])
def test_unsupported_cases_go_to_sdpa_unchanged(monkeypatch, case):
    calls = []
    monkeypatch.setattr(attention, "sdpa_attention_forward", lambda *a, **kw: calls.append((a, kw)) or ("sdpa", None))
    q, k, v, mask = inputs(2, hkv=2, g=3)
    kw = {"dropout": {"dropout": 0.1}, "softcap": {"softcap": 30.0}, "sinks": {"s_aux": torch.zeros(6)},
          "position_bias": {"position_bias": torch.zeros(1, 6, 1, 40)}}.get(case, {})
    if case == "prefill":
        q = torch.randn(2, 6, 4, 16)
    if case == "ungrouped":
        q = q[:, :2]
    assert grouped_decode_attention(module(3), q, k, v, mask, **kw)[0] == "sdpa"
    assert len(calls) == 1 and calls[0][0][1] is q and calls[0][0][4] is mask
    calls.clear()
    assert grouped_decode_attention(module(3), *inputs(2, hkv=2, g=3))[0] != "sdpa" and not calls


def test_context_switches_only_sdpa_configs_and_restores_them():
    from transformers import LlavaConfig

    cfg = LlavaConfig()
    cfg._attn_implementation = {"": "sdpa", "text_config": "sdpa", "vision_config": "eager"}
    with grouped_attention(types.SimpleNamespace(config=cfg)):
        assert (cfg._attn_implementation, cfg.text_config._attn_implementation) == (NAME, NAME)
        assert cfg.vision_config._attn_implementation == "eager"
    assert cfg._attn_implementation == cfg.text_config._attn_implementation == "sdpa"
    assert cfg.vision_config._attn_implementation == "eager"


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_generator_uses_it_during_its_forwards_only(impl, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=61, hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=6, num_key_value_heads=2,
                                         attn_implementation=impl)).eval()
    calls = []

    def spy(*a, **kw):
        calls.append(a[1].shape[2])  # query length
        return grouped_decode_attention(*a, **kw)

    monkeypatch.setitem(AttentionInterface._global_mapping, NAME, spy)
    seen = []
    gen = Generator(model, batch_size=2, capacity=32, eos=[-1])
    reqs = [(0, [5, 6, 7], 3), (1, [8, 9], 4)]
    gen.run(lambda: reqs.pop(0) if reqs else None, lambda *a: seen.append(model.config._attn_implementation))
    assert seen == [impl, impl] and model.config._attn_implementation == impl  # callbacks and after: unchanged
    assert ({1, 3} <= set(calls)) if impl == "sdpa" else not calls  # decode steps and the prefill
