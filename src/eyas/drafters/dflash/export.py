"""DFlash in the speculators format vLLM 0.26 serves with zero flags: speculators_model_type `dflash` makes
architectures ["DFlashDraftModel"] (DFlashQwen3ForCausalLM: Qwen3 layers whatever the target), method dflash with
parallel drafting, dflash_config.target_layer_ids = aux ids - 1 and mask_token_id from the config.

`sliding_window_non_causal` is written true: vLLM 0.26 sets dflash_config.causal = not that value (default
true), and a causal draft would attend within the block unlike training. Keys follow DFlashQwen3Model's
loader (layers.N.self_attn.{q,k,v,o}_proj, q_norm, k_norm; fc, hidden_norm, norm, lm_head; d2t/t2d only
for a reduced draft vocab; embed_tokens only when it differs from the target's, which vLLM then shares).
"""

from __future__ import annotations

from typing import Any

from eyas.aux_layers import aux_layer_id_problems
from eyas.draft.model import DraftConfig
from eyas.export.contract import BOOL, FLOAT, INT64
from eyas.export.formats import Reader, llama_fields, llama_to_dc, speculators_header, speculators_problems

MODEL_TYPES = ("qwen3", "llama")   # transformer_layer_config model types whose fields eyas reads


def expected_tensors(dc: DraftConfig, *, embed: bool) -> dict[str, tuple[tuple[int, ...], str, str]]:
    H, I, d, nh, nkv = dc.hidden_size, dc.intermediate_size, dc.head_dim, dc.num_attention_heads, dc.num_key_value_heads
    V, Vd, fc_in = dc.vocab_size, dc.draft_vocab_size, dc.num_aux * dc.target_hidden_size
    t = {"fc.weight": ((H, fc_in), FLOAT, f"hidden_size={H} x (len(aux layer ids)={dc.num_aux} x "
                                          f"target_hidden_size={dc.target_hidden_size})"),
         "hidden_norm.weight": ((H,), FLOAT, f"hidden_size={H}"),
         "norm.weight": ((H,), FLOAT, f"hidden_size={H}"),
         "lm_head.weight": ((Vd, H), FLOAT, f"draft_vocab_size={Vd}, hidden_size={H}")}
    for i in range(dc.num_layers):
        p = f"layers.{i}."
        t.update({
            p + "input_layernorm.weight": ((H,), FLOAT, f"hidden_size={H}"),
            p + "post_attention_layernorm.weight": ((H,), FLOAT, f"hidden_size={H}"),
            p + "self_attn.q_proj.weight": ((nh * d, H), FLOAT, f"heads={nh} x head_dim={d}, hidden_size={H}"),
            p + "self_attn.k_proj.weight": ((nkv * d, H), FLOAT, f"kv_heads={nkv} x head_dim={d}, hidden_size={H}"),
            p + "self_attn.v_proj.weight": ((nkv * d, H), FLOAT, f"kv_heads={nkv} x head_dim={d}, hidden_size={H}"),
            p + "self_attn.o_proj.weight": ((H, nh * d), FLOAT, f"hidden_size, heads={nh} x head_dim={d}"),
            p + "self_attn.q_norm.weight": ((d,), FLOAT, f"head_dim={d}"),
            p + "self_attn.k_norm.weight": ((d,), FLOAT, f"head_dim={d}"),
            p + "mlp.gate_proj.weight": ((I, H), FLOAT, f"intermediate_size={I}, hidden_size={H}"),
            p + "mlp.up_proj.weight": ((I, H), FLOAT, f"intermediate_size={I}, hidden_size={H}"),
            p + "mlp.down_proj.weight": ((H, I), FLOAT, f"hidden_size={H}, intermediate_size={I}")})
        if dc.attention_bias:   # vLLM's DFlash gives o_proj a bias too
            for q, n in (("q", nh * d), ("k", nkv * d), ("v", nkv * d), ("o", H)):
                t[p + f"self_attn.{q}_proj.bias"] = ((n,), FLOAT, "attention_bias=true")
        if dc.mlp_bias:
            for q, n in (("gate", I), ("up", I), ("down", H)):
                t[p + f"mlp.{q}_proj.bias"] = ((n,), FLOAT, "mlp_bias=true")
    if Vd != V:   # vLLM's DFlash has draft_id_to_target_id only for a reduced draft vocab
        t["d2t"] = ((Vd,), INT64, f"draft_vocab_size={Vd}")
        t["t2d"] = ((V,), BOOL, f"vocab_size={V}")
    if embed:
        t["embed_tokens.weight"] = ((V, H), FLOAT, f"vocab_size={V}, hidden_size={H}")
    return t


def to_speculators(dc: DraftConfig, *, chain: int, verifier: str, verifier_arch: list[str],
                   dtype: str) -> dict[str, Any]:
    if chain > dc.parallel_tokens:
        raise ValueError(f"chain {chain}: this DFlash draft fills {dc.parallel_tokens} mask rows per block (block "
                         f"size {dc.parallel_tokens + 1}); vLLM would query untrained rows")
    return {
        **speculators_header("dflash", "DFlashSpeculator", chain=chain, verifier=verifier,
                             verifier_arch=verifier_arch),
        "transformer_layer_config": {**llama_fields(dc), "model_type": "qwen3", "dtype": dtype},
        "draft_vocab_size": dc.draft_vocab_size,
        "target_hidden_size": dc.target_hidden_size,
        "block_size": dc.parallel_tokens + 1,
        "aux_hidden_state_layer_ids": list(dc.aux_layer_ids),
        "mask_token_id": dc.mask_token_id,
        "sliding_window_non_causal": True,
        "sample_from_anchor": False,
        "torch_dtype": dtype,
    }


def from_speculators(cfg: dict[str, Any], *, strict: bool,
                     default_aux: list[int] | None = None) -> tuple[DraftConfig | None, list[str]]:
    errs = speculators_problems(cfg, "dflash", strict=strict)
    top = Reader(cfg, "")
    tlc = cfg.get("transformer_layer_config")
    if not isinstance(tlc, dict):
        return None, errs + ["transformer_layer_config: missing or not a mapping"]
    if cfg.get("sample_from_anchor"):
        errs.append("sample_from_anchor: true drafts from the anchor row too (DSpark); vLLM's DFlash proposer "
                    "samples mask rows only")
    if strict and cfg.get("sliding_window_non_causal") is not True:
        errs.append("sliding_window_non_causal: must be true; vLLM 0.26 otherwise serves every layer causally "
                    "(dflash_config.causal), unlike the draft's non-causal block")
    if any(t != "full_attention" for t in tlc.get("layer_types") or []) or tlc.get("use_sliding_window"):
        errs.append("transformer_layer_config.layer_types: sliding-window layers; the eyas DFlash draft has full "
                    "attention only")
    mask = top.get("mask_token_id", int)
    block = top.get("block_size", int)
    if block is not None and block < 2:
        errs.append(f"block_size: {block}; a block holds the anchor and at least one mask")
    need = (lambda k, t, dflt: top.get(k, t)) if strict else (lambda k, t, dflt: top.get(k, t, default=dflt))
    vd = need("draft_vocab_size", int, tlc.get("vocab_size"))
    th = need("target_hidden_size", int, tlc.get("hidden_size"))
    aux = cfg.get("aux_hidden_state_layer_ids")
    if aux is None and not strict and default_aux is not None:
        aux = list(default_aux)
    errs += aux_layer_id_problems(aux, key="aux_hidden_state_layer_ids")
    sub = Reader(tlc, "transformer_layer_config.")
    dc = llama_to_dc(sub, vd=vd, target_hidden=th, aux=aux if not errs else None, nbr=True, nbfc=False,
                     model_types=MODEL_TYPES)
    errs = errs + top.errors + sub.errors
    if dc is None or errs:
        return None, errs
    dc.kind, dc.mask_token_id, dc.parallel_tokens = "dflash", mask, block - 1
    return dc, []
