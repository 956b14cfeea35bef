"""Two hidden-state stores of the same rows, compared state by state (e.g. the vllm backend's against the hf one).

Accounting first: both stores hold the same samples with the same token ids, positions and loss masks. Then per
token, per state (each aux layer and the last state), the relative error ‖a − b‖ / ‖b‖ over the hidden dimension.
With a float32 `reference` target the same error is taken against its states: the yardstick for "bf16 rounding" is
how far transformers' own bf16 states are from float32.
"""

from __future__ import annotations

import torch

from eyas.store.reader import HiddenStateStore
from eyas.target import target_states


def _rel(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    y, x = y.float(), x.float()
    return ((y - x).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-12)).flatten()


def compare_stores(a: HiddenStateStore, b: HiddenStateStore, reference=None) -> dict:
    """`a` is the yardstick (hf), `b` the candidate (vllm). `reference`: a loaded float32 Target, optional."""
    if len(a) != len(b):
        raise ValueError(f"{a.root} holds {len(a)} samples, {b.root} holds {len(b)}: not the same rows")
    aux_ids = a.manifest["target"]["aux_layer_ids"]
    pairs = {"b-vs-a": [], "b-vs-fp32": [], "a-vs-fp32": []}
    per_state = {f"aux{k}": [] for k in aux_ids} | {"last": []}
    tokens = 0
    for i in range(len(a)):
        x, y = a[i], b[i]
        for key in ("input_ids", "position_ids", "loss_mask"):
            if not torch.equal(x[key], y[key]):
                raise ValueError(f"sample {i}: {key} differ between {a.root} and {b.root}")
        tokens += x["input_ids"].numel()
        for j, k in enumerate(aux_ids):
            per_state[f"aux{k}"].append(_rel(y["aux"][:, j], x["aux"][:, j]))
        per_state["last"].append(_rel(y["last"], x["last"]))
        pairs["b-vs-a"] += [_rel(y["aux"], x["aux"]), _rel(y["last"], x["last"])]
        if reference is not None:
            dev = next(reference.model.parameters()).device
            with torch.no_grad():
                aux, last, _ = target_states(reference.model, reference.layout, x["input_ids"][None].to(dev),
                                             aux_ids, position_ids=x["position_ids"][None].to(dev))
            for name, s in (("b-vs-fp32", y), ("a-vs-fp32", x)):
                pairs[name] += [_rel(s["aux"], aux[0].cpu()), _rel(s["last"], last[0].cpu())]
    stat = lambda v: {"mean": float(v.mean()), "p99": float(v.quantile(0.99)) if v.numel() < 2**24 else None,  # noqa: E731
                      "max": float(v.max())}
    return {"samples": len(a), "tokens": tokens, "aux_layer_ids": aux_ids,
            "relative_error": {k: stat(torch.cat(v)) for k, v in pairs.items() if v},
            "relative_error_by_state": {k: stat(torch.cat(v)) for k, v in per_state.items()}}
