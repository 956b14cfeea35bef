"""`eyas inspect`: what a user needs before a long job, from the config alone (meta device)."""

from __future__ import annotations

import torch

from eyas.aux_layers import default_aux_layer_ids
from eyas.config import StageConfig
from eyas.flags import CacheDir, JsonSwitch, Target, TrustRemoteCode
from eyas.target.layers import find_layout, text_config
from eyas.target.load import build_meta, load_config
from eyas.target.wrapped import WrappedTextLM


class InspectConfig(StageConfig):
    target: Target
    cache_dir: CacheDir = None
    trust_remote_code: TrustRemoteCode = False
    json: JsonSwitch = False


def describe(config) -> dict:
    """Layer paths, sizes and parameter count of the architecture `config` describes; no weights."""
    model = build_meta(config)
    layout = find_layout(model)
    n = layout.num_layers
    params = sum(p.numel() for p in model.parameters())
    # Checkpoint dtype as the config records it (transformers 5 names it `dtype`; reading the old
    # `torch_dtype` alias only warns). Configs without one (GGUF) load as float32 by default.
    dtype = getattr(config, "dtype", None) or torch.float32
    return {
        "architecture": architecture_name(model),
        "model_type": getattr(config, "model_type", None),
        **block_kinds(config),
        "layers_path": layout.paths["layers"],
        "paths": layout.paths,
        "num_layers": n,
        "hidden_size": layout.hidden_size,
        "vocab_size": layout.vocab_size,
        "default_aux_layer_ids": default_aux_layer_ids(n),
        "num_parameters": params,
        "dtype": str(dtype).replace("torch.", ""),
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
    }


def architecture_name(model) -> str:
    """The class eyas built; for a wrapper's text model, the wrapper's architecture and the text model's class."""
    if isinstance(model, WrappedTextLM):
        archs = getattr(model.config, "architectures", None) or [getattr(model.config, "model_type", "wrapper")]
        return f"{archs[0]} (text model {type(model.language_model).__name__})"
    return type(model).__name__


def block_kinds(config) -> dict[str, str]:
    """What the decoder blocks are, from the text config alone: the attention (MLA with its ranks and rope split,
    else multi-head / grouped-query heads) and the feed-forward (MoE with its routing keys, else dense)."""
    t = text_config(config)
    heads = getattr(t, "num_attention_heads", None)
    if getattr(t, "kv_lora_rank", None):
        attention = (f"MLA ({heads} heads, q_lora_rank {getattr(t, 'q_lora_rank', None)}, kv_lora_rank "
                     f"{t.kv_lora_rank}, qk_nope_head_dim {getattr(t, 'qk_nope_head_dim', None)}, qk_rope_head_dim "
                     f"{getattr(t, 'qk_rope_head_dim', None)}, v_head_dim {getattr(t, 'v_head_dim', None)})")
    else:
        kv = getattr(t, "num_key_value_heads", None) or heads
        attention = f"{'MHA' if kv == heads else 'GQA'} ({heads} heads, {kv} KV heads)"
    experts = next((getattr(t, k) for k in ("n_routed_experts", "num_experts", "num_local_experts")
                    if getattr(t, k, None)), None)
    if not experts:
        return {"attention": attention, "mlp": "dense"}
    parts = [f"{experts} routed experts", f"top-{getattr(t, 'num_experts_per_tok', '?')}"]
    if getattr(t, "n_shared_experts", None):
        parts.append(f"{t.n_shared_experts} shared")
    if getattr(t, "first_k_dense_replace", None):
        parts.append(f"first {t.first_k_dense_replace} layer(s) dense")
    for key in ("scoring_func", "topk_method", "routed_scaling_factor", "n_group", "topk_group"):
        if getattr(t, key, None) is not None:
            parts.append(f"{key} {getattr(t, key)}")
    return {"attention": attention, "mlp": f"MoE ({', '.join(parts)})"}


def run(cfg: InspectConfig):
    info = describe(load_config(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code))
    info = {"target": cfg.target, **info}
    if cfg.json:
        return info
    width = max(len(k) for k in info)
    for k, v in info.items():
        print(f"{k:<{width}}  {v}")
    return 0
