"""Regional torch.compile of the target's decoder layers for the capture forward.

Each decoder layer's `forward` (not the module call) is compiled, so the capture hooks of
target/capture.py still run eagerly around it and see the same tensors; all layers share the code, so
inductor compiles once per input shape rather than once per layer. The fusion of norms, RoPE and the
MLP's activation cuts the eager forward's elementwise passes; tests/target/test_compiled.py checks the
captured states equal the eager forward's.
"""

from __future__ import annotations

import torch

from eyas.target.layers import Layout


def compile_layers(layout: Layout, *, dynamic: bool | None = None) -> int:
    """Compile every decoder layer's forward in place; returns how many were compiled (idempotent)."""
    import torch._dynamo

    # One entry per layer instance and input shape: keep them all rather than fall back to eager.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8 * len(layout.layers))
    n = 0
    for layer in layout.layers:
        if getattr(layer, "_eyas_eager_forward", None) is None:
            layer._eyas_eager_forward = layer.forward
            layer.forward = torch.compile(layer._eyas_eager_forward, dynamic=dynamic)
            n += 1
    return n


def uncompile_layers(layout: Layout) -> None:
    for layer in layout.layers:
        eager = getattr(layer, "_eyas_eager_forward", None)
        if eager is not None:
            layer.forward = eager
            layer._eyas_eager_forward = None
