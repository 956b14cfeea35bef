"""A prompt's prefill: the target over its tokens, writing their KV slots; back come the last row's logits (the
first new token's distribution) and every row's aux states (the draft's input).

Eager, a prefill is bound by the host, not the GPU: transformers' forward issues tens of small kernels a layer
from Python, ≈ 1.4 ms a layer whatever the model's width (43 ms for 1,024 tokens of SmolLM2 and of a 1.5B on an
H200). So on CUDA the prompt runs as replayed CUDA graphs of the eager step: chunks of WIDTHS[-1] tokens, the
last one padded up to the next width. Pad rows come after the prompt (causal rows never see them) and write
slots past its end, which every later step overwrites before it reads them. A turn's first chunk (slots from
0) attends causally without the mask (`TargetRunner.causal_from_start`: SDPA's flash kernel where the model is
on sdpa). One graph per (width, KV bucket, first or not) a chunk can meet, captured at warm-up (`warm`: about
three eager forwards each) or on first use; a chunk whose pad would pass the capacity runs eagerly at its own
length, as the whole prompt does elsewhere (CPU), unless `runner.graph_prefill` is set there: then the padded
chunks run eagerly (how the CPU tests check the padding).
"""

from __future__ import annotations

import warnings
from bisect import bisect_left
from contextlib import nullcontext

import torch

from eyas import env
from eyas.decode.target_step import TargetRunner, raise_recompile_limit
from eyas.devices import capture_graph, varying_shape_attention

WIDTHS = (64, 128, 256, 512, 1024, 2048)   # chunk widths: a prompt pads by less than 2x (and at least to 64)


def chunks(n: int, capacity: int, widths: tuple[int, ...] = WIDTHS) -> list[tuple[int, int, int | None]]:
    """(start slot, tokens, graph width or None for an eager chunk) covering n prompt tokens."""
    out, s = [], 0
    while s < n:
        m = min(n - s, widths[-1])
        w = widths[bisect_left(widths, m)]
        out.append((s, m, w if s + w <= capacity else None))
        s += m
    return out


class GraphedPrefill:
    """The CUDA graphs of one runner's prefill chunks (one instance per runner: `for_runner`)."""

    def __init__(self, runner: TargetRunner, widths: tuple[int, ...] = WIDTHS):
        self.runner, self.widths, dev = runner, widths, runner.device
        self._inputs: dict[int, tuple[torch.Tensor, ...]] = {}
        self._graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._pool = None
        self._arange = torch.arange(widths[-1], device=dev)
        self.capture = dev.type == "cuda"   # elsewhere the padded chunks run eagerly (tests)
        # EYAS_PREFILL_INNER=compiled: the chunks' step through inductor (its fused RMSNorm / RoPE / SiLU instead of
        # transformers' tens of small kernels a layer), captured like the eager one; one compile per chunk shape
        self.compiled = env.get("EYAS_PREFILL_INNER") == "compiled"
        self._step = runner._step
        if self.compiled:
            raise_recompile_limit(4 * len(widths) * max(1, len(runner.buckets)))
            self._step = torch.compile(runner._step, dynamic=False)

    @staticmethod
    def for_runner(runner: TargetRunner) -> "GraphedPrefill":
        return runner.attached(GraphedPrefill)

    def _buffers(self, w: int) -> tuple[torch.Tensor, ...]:
        """Static inputs of every graph of width w: tokens, positions (= slots), ctx_len, the kept row, and the
        causal mask among the chunk's rows."""
        if w not in self._inputs:
            dev = self.runner.device
            self._inputs[w] = (torch.zeros(w, dtype=torch.long, device=dev), torch.arange(w, device=dev),
                               torch.zeros((), dtype=torch.long, device=dev),
                               torch.zeros(1, dtype=torch.long, device=dev),
                               torch.ones(w, w, dtype=torch.bool, device=dev).tril())
        return self._inputs[w]

    def _load(self, w: int, tokens: torch.Tensor, s: int) -> None:
        toks, pos, ctx, keep, _ = self._buffers(w)
        m = tokens.shape[0]
        toks[:m].copy_(tokens)
        toks[m:].zero_()
        torch.add(self._arange[:w], s, out=pos)
        ctx.fill_(s)
        keep.fill_(m - 1)

    def _forward(self, w: int, kv_len: int, causal: bool):
        toks, pos, ctx, keep, anc = self._buffers(w)
        # the eager prefill's attention kernels, so both agree; EYAS_PREFILL_SDPA=any: PyTorch's own choice (a graph's
        # shapes are static, so cuDNN's per-shape set-up happens once, at capture)
        with varying_shape_attention() if env.get("EYAS_PREFILL_SDPA") != "any" else nullcontext():
            if self.compiled and any(b is None for b in self.runner.cache.kbuf):
                # the KV buffers are allocated by a first step, which a compiled step cannot trace: an eager one
                # first (it writes the very slots the compiled step then writes again)
                self.runner._step(toks, pos, pos, ctx, anc, kv_len, keep, causal)
            return self._step(toks, pos, pos, ctx, anc, kv_len, keep, causal)

    def _causal(self, s: int, w: int) -> bool:
        return s == 0 and self.runner.causal_from_start(w)

    def _graph(self, w: int, kv_len: int, causal: bool):
        """Capture (w, kv_len) from the loaded inputs: warm-up runs on a side stream write exactly the slots the
        replay will write, so capturing mid-generation is safe."""
        key = (w, kv_len, causal)
        if key not in self._graphs:
            self._pool = self._pool or torch.cuda.graph_pool_handle()
            g, (logits, aux) = capture_graph(lambda: self._forward(w, kv_len, causal), self.runner.device, self._pool)
            self._graphs[key] = (g, logits, aux)
        return self._graphs[key]

    def run(self, tokens: torch.Tensor, s: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [m <= w] at slots s.. : (logits of the last [1, V], aux [m, k, H]), copies of the graph's."""
        self._load(w, tokens, s)
        kv_len, causal = self.runner.bucket(s + w), self._causal(s, w)
        if self.capture:
            g, logits, aux = self._graph(w, kv_len, causal)
            g.replay()
        else:
            logits, aux = self._forward(w, kv_len, causal)
        return logits.clone(), aux[:tokens.shape[0]].clone()

    @torch.no_grad()
    def warm(self) -> None:
        """Capture every (width, bucket) a chunk can meet. Writes slots that no generation has committed (between
        generations, none is)."""
        if not self.capture or self.compiled:
            return   # (compiled chunks: each shape's compile takes a while, so each is captured on its first use)
        cap, top = self.runner.capacity, self.widths[-1]
        try:
            for s in range(0, cap, top):
                for w in (w for w in self.widths if s + w <= cap):
                    key = (w, self.runner.bucket(s + w), self._causal(s, w))
                    if key not in self._graphs:
                        self._load(w, torch.zeros(1, dtype=torch.long, device=self.runner.device), s)
                        self._graph(*key)
        except RuntimeError as e:
            _graphs_off(self.runner, e)


def _eager(runner: TargetRunner, tokens: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    dev, m = runner.device, tokens.shape[0]
    pos = torch.arange(s, s + m, device=dev)
    anc = torch.ones(m, m, dtype=torch.bool, device=dev).tril()
    return runner.step(tokens, pos, pos, torch.tensor(s, device=dev), anc, kv_len=runner.bucket(s + m), eager=True,
                       last_only=True, causal=s == 0 and runner.causal_from_start(m))


@torch.no_grad()
def prefill(runner: TargetRunner, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt at slots 0..n-1: (logits [1, V] fp32 of its last token, aux [n, k, H]). Graphed where
    `runner.graph_prefill` (CUDA by default), eager elsewhere."""
    n = len(prompt)
    if n + 1 > runner.capacity:
        raise ValueError(f"prompt of {n} tokens does not fit the KV capacity {runner.capacity}")
    toks = torch.tensor(prompt, device=runner.device)
    if runner.graph_prefill:
        try:
            gp, auxs = GraphedPrefill.for_runner(runner), []
            for s, m, w in chunks(n, runner.capacity, gp.widths):
                logits, aux = gp.run(toks[s:s + m], s, w) if w else _eager(runner, toks[s:s + m], s)
                auxs.append(aux)
            return logits, torch.cat(auxs) if len(auxs) > 1 else auxs[0]
        except torch.OutOfMemoryError:
            raise                   # not the graphs' fault: eager would not fit either
        except RuntimeError as e:   # a forward that syncs the host (some MoE dispatch) cannot be captured
            _graphs_off(runner, e)
    return _eager(runner, toks, 0)


def _graphs_off(runner: TargetRunner, error: Exception) -> None:
    runner.graph_prefill = False
    runner.prefill_graph_error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    warnings.warn(f"prefills run eagerly from now on: their CUDA graph could not be captured "
                  f"({runner.prefill_graph_error})", RuntimeWarning, stacklevel=3)
