"""`eyas inspect`: what a user needs before a long job, from the config alone (meta device)."""

from __future__ import annotations

import torch

from eyas.aux_layers import default_aux_layer_ids
from eyas.config import StageConfig
from eyas.flags import CacheDir, JsonSwitch, Target, TrustRemoteCode
from eyas.target.layers import find_layout
from eyas.target.load import build_meta, load_config


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
        "architecture": type(model).__name__,
        "model_type": getattr(config, "model_type", None),
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


def run(cfg: InspectConfig):
    info = describe(load_config(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code))
    info = {"target": cfg.target, **info}
    if cfg.json:
        return info
    width = max(len(k) for k in info)
    for k, v in info.items():
        print(f"{k:<{width}}  {v}")
    return 0
