"""Eagle3Draft against an independent reference assembled from transformers' Llama pieces (RMSNorm, RoPE incl.
llama3 scaling, repeat_kv), following vLLM's llama_eagle3.py layer order; plus cache, I/O and init checks."""

import math

import pytest
import torch
import transformers as tf
from transformers.models.llama import modeling_llama as L

from eyas.draft.io import load_draft, save_draft
from eyas.draft.model import Eagle3Draft, draft_config_from_target

ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}
YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0}


def llama_config(**kw):
    base = dict(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5)
    base.update(kw)
    return tf.LlamaConfig(**base)


def random_draft(tcfg, norm_before_residual=True, seed=0):
    torch.manual_seed(seed)
    draft = Eagle3Draft(draft_config_from_target(tcfg, aux_layer_ids=[1, 3, 4], draft_vocab_size=40,
                                                 norm_before_residual=norm_before_residual))
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 1.0) + (1.0 if p.dim() == 1 else 0.0))
    ids = torch.sort(torch.randperm(80)[:40]).values
    t2d = torch.zeros(80, dtype=torch.bool)
    t2d[ids] = True
    draft.set_vocab_map(ids - torch.arange(40), t2d)
    return draft


def reference(draft, tcfg, input_ids, aux, position_ids):
    """vLLM Eagle3 LlamaDecoderLayer order with transformers' kernels (eager attention, causal)."""
    lyr = draft.layers[0]

    def norm(mod, x):
        n = L.LlamaRMSNorm(x.shape[-1], eps=tcfg.rms_norm_eps)
        n.weight.data.copy_(mod.weight)
        return n(x)

    g = draft.fc(aux.flatten(-2))
    emb = norm(lyr.input_layernorm, draft.embed_tokens(input_ids))
    if draft.config.norm_before_residual:
        h = norm(lyr.hidden_norm, g)
        res = h
    else:
        h, res = norm(lyr.hidden_norm, g), g
    x = torch.cat([emb, h], -1)
    at = lyr.self_attn
    B, T, _ = x.shape
    nh, nkv, d = at.nh, at.nkv, at.d
    q = at.q_proj(x).view(B, T, nh, d).transpose(1, 2)
    k = at.k_proj(x).view(B, T, nkv, d).transpose(1, 2)
    v = at.v_proj(x).view(B, T, nkv, d).transpose(1, 2)
    cos, sin = L.LlamaRotaryEmbedding(tcfg)(x, position_ids)
    q, k = L.apply_rotary_pos_emb(q, k, cos, sin)
    k, v = L.repeat_kv(k, nh // nkv), L.repeat_kv(v, nh // nkv)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    a = at.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, nh * d))
    res = a + res
    pre = lyr.mlp(norm(lyr.post_attention_layernorm, res)) + res
    return pre, draft.lm_head(norm(draft.norm, pre))


@pytest.mark.parametrize("norm_before_residual", [True, False])
@pytest.mark.parametrize("rope", [None, ROPE, YARN])
def test_matches_transformers_reference(norm_before_residual, rope):
    tcfg = llama_config(rope_scaling=rope, rope_theta=50000.0)
    draft = random_draft(tcfg, norm_before_residual).eval()
    B, T = 2, 11
    ids = torch.randint(0, 80, (B, T))
    aux = torch.randn(B, T, 3, 32)
    pos = torch.arange(T)[None].expand(B, T) + torch.tensor([[0], [100]])   # far positions exercise scaling
    pre, _ = draft(ids, draft.combine(aux), pos)
    ref_pre, ref_logits = reference(draft, tcfg, ids, aux, pos)
    torch.testing.assert_close(pre, ref_pre, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(draft.logits(pre), ref_logits, rtol=1e-4, atol=1e-4)


def test_yarn_with_deepseek_mscale_keys_scales_as_vllm_serves_a_llama_draft():
    """A DeepSeek / Kimi target's yarn carries mscale = mscale_all_dim (ratio 1 in DeepSeek's own rope); vLLM's Llama
    draft reads plain yarn, whose cos/sin carry 0.1 ln(factor) + 1: the draft trains with what it is served with."""
    from eyas.draft.model import rope_inv_freq, rope_mscale

    kimi = dict(YARN, factor=64.0, mscale=1.0, mscale_all_dim=1.0)
    dc = draft_config_from_target(llama_config(rope_scaling=kimi, rope_theta=50000.0), aux_layer_ids=[1, 3, 4])
    assert rope_mscale(dc) == pytest.approx(0.1 * math.log(64.0) + 1.0)
    plain = draft_config_from_target(llama_config(rope_scaling=dict(YARN, factor=64.0), rope_theta=50000.0),
                                     aux_layer_ids=[1, 3, 4])
    assert torch.equal(rope_inv_freq(dc), rope_inv_freq(plain))


def test_incremental_with_cache_equals_full_forward():
    draft = random_draft(llama_config()).eval()
    ids, aux = torch.randint(0, 80, (1, 9)), torch.randn(1, 9, 3, 32)
    pos = torch.arange(9)[None]
    full, _ = draft(ids, draft.combine(aux), pos)
    head, cache = draft(ids[:, :5], draft.combine(aux[:, :5]), pos[:, :5])
    outs = [head]
    for t in range(5, 9):
        m = torch.ones(1, 1, 1, cache[0].shape[2] + 1, dtype=torch.bool)
        o, kv = draft(ids[:, t:t + 1], draft.combine(aux[:, t:t + 1]), pos[:, t:t + 1], mask=m, past=cache)
        cache = (torch.cat([cache[0], kv[0]], 2), torch.cat([cache[1], kv[1]], 2))
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [2, 1, 4])
def test_static_cache_in_place_equals_full_forward(kv_heads):
    """Decoding's path: k/v written into a static cache at explicit slots (out of order, stale junk in the
    others), attention over the cache in place with GQA by grouped query heads."""
    draft = random_draft(llama_config(num_key_value_heads=kv_heads)).eval()
    ids, aux, pos = torch.randint(0, 80, (1, 9)), torch.randn(1, 9, 3, 32), torch.arange(9)[None]
    full, _ = draft(ids, draft.combine(aux), pos)
    S, slot = 16, torch.tensor([5, 0, 9, 2, 14, 7, 11, 3, 8])           # position t lives at slot[t]
    cache = tuple(torch.randn(1, kv_heads, S, 8) for _ in range(2))
    outs = []
    for t0, t1 in ((0, 4), (4, 5), (5, 9)):                               # a prefill, one step, three at once
        mask = torch.zeros(t1 - t0, S, dtype=torch.bool)
        for i in range(t0, t1):
            mask[i - t0, slot[:i + 1]] = True
        o, _ = draft(ids[:, t0:t1], draft.combine(aux[:, t0:t1]), pos[:, t0:t1], mask=mask[None, None],
                     past=cache, cache_slots=slot[t0:t1])
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)


def test_state_dict_keys_are_the_vllm_names():
    keys = set(random_draft(llama_config()).state_dict())
    assert keys == {"embed_tokens.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                    *(f"layers.0.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm",
                                                       "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                       "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                       "mlp.down_proj"))}


def test_save_load_roundtrip_and_meta(tmp_path):
    draft = random_draft(llama_config(rope_scaling=ROPE)).eval()
    save_draft(draft, tmp_path, {"target": {"name": "t"}, "metrics": {"tau": 2.0}})
    back, meta = load_draft(tmp_path)
    assert meta["metrics"]["tau"] == 2.0 and meta["draft"]["rope_scaling"]["rope_type"] == "llama3"
    ids, aux, pos = torch.randint(0, 80, (1, 7)), torch.randn(1, 7, 3, 32), torch.arange(7)[None]
    a = draft.logits(draft(ids, draft.combine(aux), pos)[0])
    b = back.logits(back(ids, back.combine(aux), pos)[0])
    torch.testing.assert_close(a, b)
    assert not back.embed_tokens.weight.requires_grad


def test_init_from_target_takes_head_rows_of_the_draft_vocab():
    tcfg = llama_config()
    draft = random_draft(tcfg)
    emb, head, norm = torch.randn(80, 32), torch.randn(80, 32), torch.rand(32)
    draft.init_from_target(emb, head, norm)
    ids = torch.arange(40) + draft.d2t
    assert torch.equal(draft.lm_head.weight, head[ids]) and torch.equal(draft.embed_tokens.weight, emb)
    assert torch.equal(draft.norm.weight, norm) and torch.equal(draft.to_target_ids(torch.arange(40)), ids)
    assert int(draft.t2d.sum()) == 40 and bool(draft.t2d[ids].all())
