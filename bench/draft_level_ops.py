"""Op-by-op accounting of one draft level (EagleProposer._step) at a target shape, without a GPU.

Runs the level on fake tensors (no memory, no time) under a dispatch mode that records every aten
op with its shapes, the bytes it must move and its FLOPs, then prices each op at the GPU's roofline
(default H200: 4.8 TB/s, 989 TFLOP/s dense bf16). The sum is the bandwidth floor of a level; the
op count is what an eager CUDA graph launches (a compiled graph fuses the elementwise ones).

    PYTHONPATH=src python bench/draft_level_ops.py                     # 8B shape, width 10, Vd 32000
    PYTHONPATH=src python bench/draft_level_ops.py --width 1 --draft-vocab 128256 --top 0

Bytes: tensor inputs + outputs, except gathers/scatters (only the rows touched) and views (none).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture import SHAPES  # noqa: E402
from decode_costs import level_inputs  # noqa: E402

from eyas.decode.proposer import EagleProposer  # noqa: E402
from eyas.decode.tree import TreeSpec  # noqa: E402
from eyas.draft.model import Eagle3Draft, draft_config_from_target  # noqa: E402

aten = torch.ops.aten
VIEWS = {aten.view, aten._unsafe_view, aten.t, aten.transpose, aten.expand, aten.slice, aten.select,
         aten.unsqueeze, aten.squeeze, aten.permute, aten.alias, aten.detach, aten.split, aten.split_with_sizes,
         aten.reshape, aten.as_strided, aten.lift_fresh, aten._reshape_alias, aten.unbind, aten.chunk}


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def op_bytes(func, args, out) -> int:
    """Bytes an op must read + write (its inputs once, its outputs once; gathers only their rows)."""
    pkt = func.overloadpacket
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    ins = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
    if pkt in VIEWS:
        return 0
    if pkt in (aten.embedding, aten.index_select, aten.index, aten.gather):
        return 2 * sum(map(_nbytes, outs)) + sum(_nbytes(t) for t in ins[1:])   # rows read + written, indices
    if pkt in (aten.index_copy_, aten.index_put_, aten.copy_, aten.fill_, aten.zero_):
        src = ins[1:] if len(ins) > 1 else []
        return sum(map(_nbytes, src)) * (2 if pkt is not aten.fill_ else 1) or _nbytes(ins[0])
    return sum(map(_nbytes, ins)) + sum(map(_nbytes, outs))


def op_flops(func, args, kwargs, out) -> int:
    f = flop_registry.get(func.overloadpacket)
    if f is None:
        return 0
    return f(*args, **kwargs, out_val=out)  # the registry's wrapper takes tensors and reads their shapes


class Ledger(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket not in VIEWS and func.namespace != "prim":  # prim: metadata queries
            shapes = [tuple(t.shape) for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
            self.rows.append((str(func.overloadpacket).replace("aten.", ""), shapes,
                              op_bytes(func, args, out), op_flops(func, args, kwargs, out)))
        return out


def level_ledger(shape: str, width: int, draft_vocab: int, capacity: int, context: int, depth: int = 7):
    from transformers import LlamaConfig
    tcfg = LlamaConfig(**SHAPES[shape], tie_word_embeddings=False)
    aux = [2, SHAPES[shape]["num_hidden_layers"] // 2, SHAPES[shape]["num_hidden_layers"] - 3]
    fake = FakeTensorMode()  # CPU tensors without storage: SDPA dispatches to one fused op, as on the GPU
    torch.set_default_dtype(torch.bfloat16)  # bf16 weights (fake parameters cannot be converted in place)
    try:
        with fake:
            draft = Eagle3Draft(draft_config_from_target(tcfg, aux_layer_ids=aux, draft_vocab_size=draft_vocab))
            prop = EagleProposer(draft.eval(), TreeSpec(total=min(60, width + (depth - 1) * width * width),
                                                        depth=depth, topk=width), capacity)
    finally:
        torch.set_default_dtype(torch.float32)
    lvl = level_inputs(prop, context, torch.device("cpu"), torch.bfloat16)  # decode_costs' level, as it times it
    with fake:
        lvl = {n: fake.from_tensor(t) for n, t in lvl.items()}
        with torch.no_grad(), Ledger() as led:
            prop._step(**lvl)
    return led.rows, prop


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--width", type=int, default=10, help="rows of the level (topk; 1 for chains)")
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--capacity", type=int, default=1024)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--bw", type=float, default=4.8e12, help="bytes/s")
    ap.add_argument("--flops", type=float, default=989e12, help="FLOP/s")
    ap.add_argument("--top", type=int, default=20, help="ops listed (largest first; 0: all, in order)")
    a = ap.parse_args(argv)
    rows, prop = level_ledger(a.shape, a.width, a.draft_vocab, a.capacity, a.context)
    us = lambda b, f: max(b / a.bw, f / a.flops) * 1e6
    listed = rows if a.top == 0 else sorted(rows, key=lambda r: -us(r[2], r[3]))[:a.top]
    print(f"{a.shape}: one draft level, width {a.width}, draft vocab {a.draft_vocab}, KV slots {prop.size} "
          f"(capacity {a.capacity}), context {a.context}")
    print(f"{'op':28} {'shapes':58} {'MB':>9} {'GFLOP':>7} {'us':>7}")
    for name, shapes, b, f in listed:
        print(f"{name:28} {str(shapes)[:58]:58} {b / 1e6:9.3f} {f / 1e9:7.2f} {us(b, f):7.2f}")
    by = defaultdict(lambda: [0, 0, 0])
    for name, _, b, f in rows:
        by[name][0] += 1
        by[name][1] += b
        by[name][2] += f
    tb, tf = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"total: {len(rows)} ops, {tb / 1e6:.1f} MB, {tf / 1e9:.2f} GFLOP, roofline {sum(us(r[2], r[3]) for r in rows):.1f} us")
    print("by op: " + ", ".join(f"{n} x{c} {b / 1e6:.1f} MB" for n, (c, b, f) in
                                sorted(by.items(), key=lambda kv: -kv[1][1])[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
