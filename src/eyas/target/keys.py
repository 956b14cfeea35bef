"""Checkpoint tensors under a model's own state-dict keys, for the fast loader (target/fastload.py).

Most checkpoints store a model's own keys. MoE checkpoints in the DeepSeek / Kimi / vLLM layout store one
tensor per expert (`...mlp.experts.E.gate_proj.weight`), where transformers 5 keeps each layer's experts fused
(`...mlp.experts.gate_up_proj` [E, 2I, H], `...mlp.experts.down_proj` [E, H, I]). `FUSED_EXPERTS` says which
per-expert tensors make which fused one and in which order; a fused parameter of another shape, a missing
expert or a tensor that does not fit raises `KeyError` naming the key.
"""

from __future__ import annotations

import re

import torch

# fused model key suffix -> the per-expert checkpoint projections concatenated (along the output dim) into it
FUSED_EXPERTS: dict[str, tuple[str, ...]] = {
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
_PER_EXPERT = re.compile(r"^(?P<base>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight$")


def fuse_experts(state: dict[str, torch.Tensor], own: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """`state` with per-expert tensors stacked into the fused parameters `own` (model key -> shape) has; keys the
    model holds itself, and per-expert keys of a model that keeps experts apart, pass through unchanged."""
    groups: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for key, t in state.items():
        m = _PER_EXPERT.match(key)
        if key in own or m is None or not any(f"{m['base']}.{f}" in own for f in FUSED_EXPERTS):
            out[key] = t
            continue
        groups.setdefault(m["base"], {}).setdefault(int(m["expert"]), {})[m["proj"]] = t
    for base, experts in groups.items():
        n = max(experts) + 1
        for fused, projs in FUSED_EXPERTS.items():
            key = f"{base}.{fused}"
            if key not in own:
                raise KeyError(f"{key}: the model keeps no such fused parameter for the checkpoint's experts")
            rows = []
            for e in range(n):
                missing = [p for p in projs if p not in experts.get(e, {})]
                if missing:
                    raise KeyError(f"{base}.{e}.{missing[0]}.weight: missing from the checkpoint "
                                   f"(needed for {key})")
                rows.append(torch.cat([experts[e][p] for p in projs], dim=0))   # [out, in] per expert
            stacked = torch.stack(rows)                                         # [E, out, in]
            want = tuple(own[key])
            if tuple(stacked.shape) != want and tuple(stacked.transpose(1, 2).shape) == want:
                stacked = stacked.transpose(1, 2)                               # stored as [E, in, out]
            if tuple(stacked.shape) != want:
                raise KeyError(f"{base}.*.{'/'.join(projs)}.weight: {n} experts of {tuple(rows[0].shape)} do not "
                               f"make {key} {list(want)}")
            out[key] = stacked.contiguous()
    return out
