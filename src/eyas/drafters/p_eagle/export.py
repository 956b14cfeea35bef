"""P-EAGLE in the speculators format vLLM 0.26 serves with zero flags: speculators_model_type `peagle` becomes
method eagle3 + parallel_drafting (vllm/transformers_utils/configs/speculators), the llama layers load into
Eagle3LlamaForCausalLM (layer 0 takes 2H, later layers H), `mask_token_id` becomes its pard_token, and
`mask_hidden` [1, 1, k*Ht] (speculators' shape) fills the proposer's mask hidden state."""

from __future__ import annotations

from typing import Any

from eyas.draft.model import DraftConfig
from eyas.export.contract import FLOAT, expected_tensors as eagle3_tensors
from eyas.export.formats import from_speculators as eagle3_from, speculators_header, to_speculators as eagle3_to


def plain_layer_tensors(dc: DraftConfig, i: int) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """A Llama decoder layer over H (P-EAGLE's layers after the first)."""
    H, I, d, nh, nkv = dc.hidden_size, dc.intermediate_size, dc.head_dim, dc.num_attention_heads, dc.num_key_value_heads
    p = f"layers.{i}."
    t = {p + "input_layernorm.weight": ((H,), FLOAT, f"hidden_size={H}"),
         p + "post_attention_layernorm.weight": ((H,), FLOAT, f"hidden_size={H}"),
         p + "self_attn.q_proj.weight": ((nh * d, H), FLOAT, f"heads={nh} x head_dim={d}, hidden_size={H}"),
         p + "self_attn.k_proj.weight": ((nkv * d, H), FLOAT, f"kv_heads={nkv} x head_dim={d}, hidden_size={H}"),
         p + "self_attn.v_proj.weight": ((nkv * d, H), FLOAT, f"kv_heads={nkv} x head_dim={d}, hidden_size={H}"),
         p + "self_attn.o_proj.weight": ((H, nh * d), FLOAT, f"hidden_size, heads={nh} x head_dim={d}"),
         p + "mlp.gate_proj.weight": ((I, H), FLOAT, f"intermediate_size={I}, hidden_size={H}"),
         p + "mlp.up_proj.weight": ((I, H), FLOAT, f"intermediate_size={I}, hidden_size={H}"),
         p + "mlp.down_proj.weight": ((H, I), FLOAT, f"hidden_size={H}, intermediate_size={I}")}
    if dc.attention_bias:
        for q, n in (("q", nh), ("k", nkv), ("v", nkv)):
            t[p + f"self_attn.{q}_proj.bias"] = ((n * d,), FLOAT, "attention_bias=true")
    if dc.mlp_bias:
        for q, n in (("gate", I), ("up", I), ("down", H)):
            t[p + f"mlp.{q}_proj.bias"] = ((n,), FLOAT, "mlp_bias=true")
    return t


def expected_tensors(dc: DraftConfig, *, embed: bool) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """EAGLE-3's table, the later layers and mask_hidden. The recipe trains the embedding, so an export holds it
    unless it still equals the target's (the engine then shares the target's, the same numbers)."""
    t = eagle3_tensors(dc, embed=embed)
    for i in range(1, dc.num_layers):
        t.update(plain_layer_tensors(dc, i))
    k = dc.num_aux * dc.target_hidden_size
    t["mask_hidden"] = ((1, 1, k), FLOAT, f"len(aux layer ids)={dc.num_aux} x target_hidden_size="
                                          f"{dc.target_hidden_size} (the aux-space mask hidden state)")
    return t


def to_speculators(dc: DraftConfig, *, chain: int, verifier: str, verifier_arch: list[str],
                   dtype: str) -> dict[str, Any]:
    cfg = eagle3_to(dc, chain=chain, verifier=verifier, verifier_arch=verifier_arch, dtype=dtype)
    cfg.update(speculators_header("peagle", "PEagleSpeculator", chain=chain, verifier=verifier,
                                  verifier_arch=verifier_arch))
    cfg["mask_token_id"] = dc.mask_token_id            # required: vLLM's pard_token
    return cfg


def from_speculators(cfg: dict[str, Any], *, strict: bool,
                     default_aux: list[int] | None = None) -> tuple[DraftConfig | None, list[str]]:
    # vLLM reads an absent norm_before_residual of a peagle config as false
    dc, errors = eagle3_from(cfg, strict=strict, default_aux=default_aux, model_type="peagle",
                             norm_before_residual=False)
    mask = cfg.get("mask_token_id")
    if not isinstance(mask, int) or isinstance(mask, bool) or mask < 0:
        errors = errors + [f"mask_token_id: {mask!r}; vLLM needs the mask slots' token id (its pard_token)"]
    if dc is None or errors:
        return None, errors
    methods = cfg["speculators_config"]["proposal_methods"]
    dc.kind, dc.mask_token_id, dc.parallel_tokens = "p-eagle", mask, int(methods[0]["speculative_tokens"])
    return dc, []


def to_export(dc: DraftConfig, sd: dict) -> dict:
    return {**sd, "mask_hidden": sd["mask_hidden"].reshape(1, 1, -1)}


def from_export(dc: DraftConfig, sd: dict) -> dict:
    return {**sd, "mask_hidden": sd["mask_hidden"].reshape(-1)}
