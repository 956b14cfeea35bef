"""The key contract between an eyas draft and the engines' loaders, as mapping tables.

Each drafter kind has one table (its Drafter.expected_tensors; EAGLE-3's is `expected_tensors` here) describing
every tensor of the draft in eyas's own names (which are also the speculators / vLLM names): its shape as a
function of the config and its dtype kind. Each on-disk format is that table under a key rename (`layers.0.`
for speculators/vLLM, `midlayer.` for SGLang and the research / SpecForge checkpoints). `check_contract`
compares a (config, tensors) pair with the table and returns one message per problem, each naming the key —
nothing is written until it is empty.

Why so strict: an engine that meets a wrong layer id, a dropped norm or a renamed key usually still
serves, just with ~0 acceptance. vLLM only refuses *missing* parameters; a shape that happens to fit
or an aux-id list it silently replaces with its defaults goes through.
"""

from __future__ import annotations

import torch

from eyas.draft.kinds import get_kind
from eyas.draft.model import DraftConfig
from eyas.vocab import check_draft_vocab

SPECULATORS = "speculators"   # vLLM's zero-flag format (config has speculators_config)
MIDLAYER = "midlayer"         # research EAGLE-3 / SpecForge / SGLang LlamaForCausalLMEagle3

# eyas key prefix -> per-format prefix (the only renames any of the formats need).
PREFIX = {SPECULATORS: {"layers.0.": "layers.0."}, MIDLAYER: {"layers.0.": "midlayer."}}

# Buffers some trainers save that carry no learned state; dropped on import, never written.
IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")

FLOAT, INT64, BOOL = "float", "int64", "bool"


def expected_tensors(dc: DraftConfig, *, embed: bool) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """The EAGLE-3 table: eyas key -> (shape, dtype kind, why that shape). `embed` = whether embed_tokens is in
    the file."""
    H, I, d = dc.hidden_size, dc.intermediate_size, dc.head_dim
    nh, nkv, V, Vd = dc.num_attention_heads, dc.num_key_value_heads, dc.vocab_size, dc.draft_vocab_size
    fc_in = dc.num_aux * dc.target_hidden_size
    why_fc = (f"hidden_size={H} x (len(aux layer ids)={dc.num_aux} x target_hidden_size="
              f"{dc.target_hidden_size})")
    t: dict[str, tuple[tuple[int, ...], str, str]] = {
        "fc.weight": ((H, fc_in), FLOAT, why_fc),
        "layers.0.input_layernorm.weight": ((H,), FLOAT, f"hidden_size={H}"),
        "layers.0.hidden_norm.weight": ((H,), FLOAT, f"hidden_size={H}"),
        "layers.0.post_attention_layernorm.weight": ((H,), FLOAT, f"hidden_size={H}"),
        "layers.0.self_attn.q_proj.weight": ((nh * d, 2 * H), FLOAT, f"heads={nh} x head_dim={d}, 2 x hidden_size"),
        "layers.0.self_attn.k_proj.weight": ((nkv * d, 2 * H), FLOAT, f"kv_heads={nkv} x head_dim={d}, 2 x hidden_size"),
        "layers.0.self_attn.v_proj.weight": ((nkv * d, 2 * H), FLOAT, f"kv_heads={nkv} x head_dim={d}, 2 x hidden_size"),
        "layers.0.self_attn.o_proj.weight": ((H, nh * d), FLOAT, f"hidden_size, heads={nh} x head_dim={d}"),
        "layers.0.mlp.gate_proj.weight": ((I, H), FLOAT, f"intermediate_size={I}, hidden_size={H}"),
        "layers.0.mlp.up_proj.weight": ((I, H), FLOAT, f"intermediate_size={I}, hidden_size={H}"),
        "layers.0.mlp.down_proj.weight": ((H, I), FLOAT, f"hidden_size={H}, intermediate_size={I}"),
        "norm.weight": ((H,), FLOAT, f"hidden_size={H}"),
        "lm_head.weight": ((Vd, H), FLOAT, f"draft_vocab_size={Vd}, hidden_size={H}"),
    }
    if Vd != V:  # a full-vocab draft has no map: vLLM then has no draft_id_to_target_id and refuses a d2t
        t["d2t"] = ((Vd,), INT64, f"draft_vocab_size={Vd}")
        t["t2d"] = ((V,), BOOL, f"vocab_size={V}")
    if dc.attention_bias:
        for p, n in (("q", nh), ("k", nkv), ("v", nkv)):
            t[f"layers.0.self_attn.{p}_proj.bias"] = ((n * d,), FLOAT, "attention_bias=true")
    if dc.mlp_bias:
        for p, n in (("gate", I), ("up", I), ("down", H)):
            t[f"layers.0.mlp.{p}_proj.bias"] = ((n,), FLOAT, "mlp_bias=true")
    if dc.norm_before_fc:
        t["input_norm.weight"] = ((fc_in,), FLOAT, f"norm_before_fc=true: len(aux ids) x target_hidden_size={fc_in}")
    if embed:
        t["embed_tokens.weight"] = ((V, H), FLOAT, f"vocab_size={V}, hidden_size={H}")
    return t


def rename(key: str, fmt: str) -> str:
    """eyas key -> the format's key."""
    for src, dst in PREFIX[fmt].items():
        if key.startswith(src):
            return dst + key[len(src):]
    return key


def to_eyas_key(key: str, fmt: str) -> str:
    for src, dst in PREFIX[fmt].items():
        if key.startswith(dst):
            return src + key[len(dst):]
    return key


def _kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return BOOL
    if t.dtype == torch.int64:
        return INT64
    return FLOAT if t.is_floating_point() else str(t.dtype).replace("torch.", "")


def check_tensors(dc: DraftConfig, tensors: dict[str, torch.Tensor], fmt: str) -> list[str]:
    """Every problem between a tensor dict (format's names) and the table; each message names the key."""
    errors: list[str] = []
    embed = rename("embed_tokens.weight", fmt) in tensors
    drafter = get_kind(dc)
    want = {rename(k, fmt): v for k, v in drafter.expected_tensors(dc, embed=embed).items()}
    for key, (shape, kind, why) in want.items():
        if key not in tensors:
            errors.append(f"{key}: missing (expected shape {list(shape)} from {why})")
            continue
        t = tensors[key]
        if tuple(t.shape) != shape:
            errors.append(f"{key}: shape {list(t.shape)} does not match the config: expected {list(shape)} from {why}")
        if _kind(t) != kind:
            errors.append(f"{key}: dtype {str(t.dtype).replace('torch.', '')} but the contract needs {kind}")
    full_vocab_map = dc.draft_vocab_size == dc.vocab_size and {"d2t", "t2d"} & set(tensors)
    if full_vocab_map and fmt == SPECULATORS:
        errors.append(f"d2t/t2d: present although draft_vocab_size == vocab_size == {dc.vocab_size}; vLLM then has no "
                      f"draft_id_to_target_id parameter and refuses to load the draft")
    for key in sorted(set(tensors) - set(want)):
        if key in ("d2t", "t2d") and full_vocab_map:
            continue
        if not key.endswith(IGNORABLE_SUFFIXES):
            errors.append(f"{key}: unexpected key (no such parameter in a {fmt} {drafter.name} draft with this config)")
    floats = {str(t.dtype) for k, t in tensors.items() if k in want and want[k][1] == FLOAT}
    if len(floats) > 1:
        errors.append(f"weights mix float dtypes {sorted(floats)}; engines load one dtype")
    errors += _check_vocab_map(tensors.get("d2t"), tensors.get("t2d"), dc)
    return errors


def _check_vocab_map(d2t, t2d, dc: DraftConfig) -> list[str]:
    """The vocabulary owner's checks, once the shapes and dtypes above are right (else those errors suffice)."""
    if d2t is None or t2d is None or d2t.dtype != torch.int64 or t2d.dtype != torch.bool:
        return []
    if tuple(d2t.shape) != (dc.draft_vocab_size,) or tuple(t2d.shape) != (dc.vocab_size,):
        return []
    return check_draft_vocab(d2t, t2d)
