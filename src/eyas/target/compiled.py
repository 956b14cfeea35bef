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
    return compile_forwards(layout.layers, dynamic=dynamic)


def uncompile_layers(layout: Layout) -> None:
    uncompile_forwards(layout.layers)


def compile_forwards(modules, *, dynamic: bool | None = None) -> int:
    """Compile each module's `forward` in place (the module object, its hooks and its state_dict names stay as
    they are: a checkpoint or export never sees torch.compile's `_orig_mod.` prefix). Also the trainer's draft
    layers. Returns how many were compiled (idempotent)."""
    import torch._dynamo

    modules = list(modules)
    # One entry per module instance and input shape (the draft's TTT steps: one per KV length and grad mode):
    # keep them all rather than fall back to eager.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8 * len(modules), 64)
    n = 0
    for m in modules:
        if getattr(m, "_eyas_eager_forward", None) is None:
            m._eyas_eager_forward = m.forward
            m.forward = torch.compile(m._eyas_eager_forward, dynamic=dynamic)
            n += 1
    return n


def uncompile_forwards(modules) -> None:
    for m in modules:
        eager = getattr(m, "_eyas_eager_forward", None)
        if eager is not None:
            m.forward = eager
            m._eyas_eager_forward = None
