"""P-EAGLE and DFlash drafts against references assembled from transformers' own layers (Llama decoder layers
after EAGLE-3's first; Qwen3 norms, rotary embedding and MLP for DFlash, following vLLM 0.26's
qwen3_dflash.py), their decoding caches against the full forward, and save/load through the registry."""

import math

import pytest
import torch
import transformers as tf
from transformers.models.llama import modeling_llama as L
from transformers.models.qwen3 import modeling_qwen3 as Q

from eyas.draft.io import load_draft, save_draft
from eyas.draft.kinds import build_draft, draft_config
from tests.draft.test_model import llama_config, reference as eagle3_reference

V, HT = 80, 32


def randomise(draft, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in draft.named_parameters():
            p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 1.0) + (1.0 if p.dim() == 1 and "norm" in n else 0))
    return draft.eval()


def make(kind, tcfg=None, layers=3, K=4, vd=V, **kw):
    tcfg = tcfg or llama_config()
    dc = draft_config(tcfg, kind, aux_layer_ids=[1, 3, 4], draft_vocab_size=vd, num_layers=layers,
                      parallel_tokens=K, mask_token_id=V - 1, **kw)
    return randomise(build_draft(dc)), tcfg


def test_p_eagle_is_eagle3_then_llama_layers():
    draft, tcfg = make("p-eagle")
    B, T = 2, 9
    ids, aux = torch.randint(0, V, (B, T)), torch.randn(B, T, 3, HT)
    pos = torch.arange(T)[None].expand(B, T) + torch.tensor([[0], [40]])
    pre, kvs = draft(ids, draft.combine(aux), pos)
    assert len(kvs) == 3
    x, _ = eagle3_reference(draft, tcfg, ids, aux, pos)               # layer 0: EAGLE-3's
    rope = L.LlamaRotaryEmbedding(tcfg)
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
    for i in (1, 2):
        ref = L.LlamaDecoderLayer(tcfg, layer_idx=i).eval()
        ref.load_state_dict(draft.layers[i].state_dict())
        x = ref(x, attention_mask=causal, position_ids=pos, position_embeddings=rope(x, pos))
        x = x[0] if isinstance(x, tuple) else x
    torch.testing.assert_close(pre, x, rtol=1e-4, atol=1e-4)
    mask_h = draft.mask_state()
    torch.testing.assert_close(mask_h, draft.fc(draft.mask_hidden))
    assert draft.embed_tokens.weight.requires_grad        # the recipe trains the embedding


def dflash_reference(draft, tcfg, ids, pos, c, cpos, mask):
    """vLLM's DFlash layer order with transformers' Qwen3 kernels (eager attention over context ++ block)."""
    qcfg = tf.Qwen3Config(hidden_size=tcfg.hidden_size, intermediate_size=tcfg.intermediate_size,
                          num_attention_heads=tcfg.num_attention_heads, num_key_value_heads=tcfg.num_key_value_heads,
                          head_dim=draft.config.head_dim, rms_norm_eps=tcfg.rms_norm_eps,
                          rope_theta=draft.config.rope_theta, max_position_embeddings=512)
    rope = Q.Qwen3RotaryEmbedding(qcfg)

    def norm(mod, x):
        n = Q.Qwen3RMSNorm(x.shape[-1], eps=qcfg.rms_norm_eps)
        n.weight.data.copy_(mod.weight)
        return n(x)

    x = draft.embed_tokens(ids)
    ctx = norm(draft.hidden_norm, draft.fc(c.flatten(-2)))
    B, T, S = ids.shape[0], ids.shape[1], ctx.shape[1]
    cos_q, sin_q = rope(x, pos)
    cos_c, sin_c = rope(x, cpos)
    for lyr in draft.layers:
        at = lyr.self_attn
        nh, nkv, d = at.nh, at.nkv, at.d
        h = norm(lyr.input_layernorm, x)
        q = norm(at.q_norm, at.q_proj(h).view(B, T, nh, d)).transpose(1, 2)
        kq = norm(at.k_norm, at.k_proj(h).view(B, T, nkv, d)).transpose(1, 2)
        kc = norm(at.k_norm, at.k_proj(ctx).view(B, S, nkv, d)).transpose(1, 2)
        q, kq = Q.apply_rotary_pos_emb(q, kq, cos_q, sin_q)
        _, kc = Q.apply_rotary_pos_emb(kc, kc, cos_c, sin_c)
        v = torch.cat([at.v_proj(ctx).view(B, S, nkv, d), at.v_proj(h).view(B, T, nkv, d)], 1).transpose(1, 2)
        k = Q.repeat_kv(torch.cat([kc, kq], 2), nh // nkv)
        s = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask, float("-inf"))
        a = at.o_proj((s.softmax(-1) @ Q.repeat_kv(v, nh // nkv)).transpose(1, 2).reshape(B, T, nh * d))
        r = x + a
        mlp = Q.Qwen3MLP(qcfg)
        mlp.load_state_dict(lyr.mlp.state_dict())
        x = r + mlp(norm(lyr.post_attention_layernorm, r))
    return x


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_dflash_matches_qwen3_reference(kv_heads):
    draft, tcfg = make("dflash", llama_config(num_key_value_heads=kv_heads, rope_theta=50000.0))
    B, S, T = 2, 7, 5
    c, cpos = torch.randn(B, S, 3, HT), torch.arange(S)[None].expand(B, S)
    ids, pos = torch.randint(0, V, (B, T)), S + torch.arange(T)[None].expand(B, T)
    mask = torch.rand(B, 1, T, S + T) > 0.3
    mask[..., S:] = True                                          # a block sees all of itself
    pre = draft(ids, pos, context=draft.context(c), context_positions=cpos, mask=mask)
    torch.testing.assert_close(pre, dflash_reference(draft, tcfg, ids, pos, c, cpos, mask), rtol=1e-4, atol=1e-4)


def test_dflash_cache_path_equals_the_training_path():
    draft, _ = make("dflash", layers=2)
    S, T = 6, 5
    c, cpos = torch.randn(1, S, 3, HT), torch.arange(S)[None]
    ids, pos = torch.randint(0, V, (1, T)), S + torch.arange(T)[None]
    mask = torch.ones(1, 1, T, S + T, dtype=torch.bool)
    full = draft(ids, pos, context=draft.context(c), context_positions=cpos, mask=mask)
    size, slot = 16, torch.tensor([3, 9, 0, 12, 5, 7])                   # context position t at slot[t]
    caches = [tuple(torch.randn(1, 2, size, 8) for _ in range(2)) for _ in draft.layers]
    for (kc, vc), (k, v) in zip(caches, draft.context_kv(draft.context(c), cpos)):
        kc.index_copy_(2, slot, k)
        vc.index_copy_(2, slot, v)
    block = torch.tensor([1, 14, 2, 15, 4])
    see = torch.zeros(T, size, dtype=torch.bool)
    see[:, torch.cat([slot, block])] = True
    got = draft(ids, pos, mask=see[None, None], caches=caches, slots=block)
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)


def test_dflash_keeps_the_target_embedding_and_head_frozen():
    draft, _ = make("dflash", vd=40)
    emb, head = torch.randn(V, draft.config.hidden_size), torch.randn(V, draft.config.hidden_size)
    draft.init_from_target(emb, head)
    assert not draft.embed_tokens.weight.requires_grad and not draft.lm_head.weight.requires_grad
    torch.testing.assert_close(draft.lm_head.weight, head[:40])      # identity map: the first 40 ids


@pytest.mark.parametrize("kind", ["p-eagle", "dflash"])
def test_save_load_roundtrip_through_the_registry(kind, tmp_path):
    draft, _ = make(kind)
    save_draft(draft, tmp_path, {"target": "t"})
    back, meta = load_draft(tmp_path)
    assert type(back) is type(draft) and meta["draft"]["kind"] == kind
    assert back.config.parallel_tokens == 4 and back.config.mask_token_id == V - 1 and back.config.num_layers == 3
    for (n, a), b in zip(draft.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("field,value,says", [("mask_token_id", V, "mask_token_id"),
                                               ("parallel_tokens", None, "parallel_tokens")])
def test_parallel_fields_are_checked_with_their_name(field, value, says):
    dc = draft_config(llama_config(), "dflash", aux_layer_ids=[1, 3, 4], parallel_tokens=4, mask_token_id=1)
    setattr(dc, field, value)
    with pytest.raises(ValueError, match=says):
        build_draft(dc)
