"""The autoregressive baseline as one captured CUDA graph per KV bucket, one step ahead of the host.

A speedup is only as honest as its baseline: the AR loop here does what a serving engine's decode step does
at batch 1 — all state on the device, one replay per token, the next step queued before the host reads the
previous token (EOS is seen one step late; the extra step writes only uncommitted slots and is discarded).

step (captured per bucket):  token = seq[L - 1] at slot/position L - 1 -> logits -> next = argmax or sample
                             -> seq[L] = next, L += 1.
The target step is the runner's `inner_step` (the same compiled function the speculative decoder captures),
so baseline and speculative rounds run the same kernels. Off the GPU `ar_generate`'s eager loop is used.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import sample_rows
from eyas.devices import capture_graph


class GraphedAR:
    """Device-resident AR decoding over `runner` (CUDA only); one instance per runner (`for_runner`)."""

    def __init__(self, runner: TargetRunner):
        if runner.device.type != "cuda":
            raise ValueError("GraphedAR needs a CUDA runner; use ar_generate's eager loop elsewhere")
        self.runner, dev = runner, runner.device
        self.L = torch.zeros((), dtype=torch.long, device=dev)
        self.seq = torch.zeros(runner.capacity + 2, dtype=torch.long, device=dev)
        self.anc = torch.ones(1, 1, dtype=torch.bool, device=dev)
        self.temp = torch.zeros((), device=dev)       # 0: argmax; else the sampling temperature
        self.noise: torch.Tensor | None = None         # [1, V] ~ Exp(1), refreshed before each sampled step
        self.gen = torch.Generator(device=dev)
        self.pinned = torch.zeros(2, 1, dtype=torch.long, pin_memory=True)  # ring: two steps in flight
        self._graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._pool = None

    @staticmethod
    def for_runner(runner: TargetRunner) -> "GraphedAR":
        return runner.attached(GraphedAR)

    def _step(self, kv_len: int, sampled: bool) -> None:
        L = self.L
        pos = (L - 1).reshape(1)
        logits, _ = self.runner.inner_step(self.seq[pos], pos, pos, L - 1, self.anc, kv_len)
        nxt = sample_rows(logits[:1], self.temp, self.noise)[0] if sampled else logits[0].argmax()
        self.seq.index_copy_(0, L.reshape(1), nxt.reshape(1))
        L.add_(1)

    def _graph(self, kv_len: int, sampled: bool) -> torch.cuda.CUDAGraph:
        key = (kv_len, sampled)
        if key not in self._graphs:
            # warm on a side stream (compiles; writes only slots >= L, uncommitted), then capture
            saved = (self.L.clone(), self.seq.clone())

            def restore():
                self.L.copy_(saved[0])
                self.seq.copy_(saved[1])
            self._pool = self._pool or torch.cuda.graph_pool_handle()
            g, _ = capture_graph(lambda: self._step(kv_len, sampled), self.runner.device, self._pool, after=restore)
            restore()
            self._graphs[key] = g
        return self._graphs[key]

    def _ensure_noise(self, vocab: int) -> None:
        if self.noise is None or self.noise.shape[-1] != vocab:
            self.noise = torch.ones(1, vocab, device=self.runner.device)
            self._graphs = {k: g for k, g in self._graphs.items() if not k[1]}  # sampled graphs read the old buffer

    @torch.no_grad()
    def warm(self, temperature: float = 0.0) -> None:
        """Capture the step at every bucket outside timed runs (L = 1: any bucket fits; writes KV slot 0 only,
        which every prefill rewrites)."""
        if temperature > 0:
            self._ensure_noise(self.runner.layout.lm_head.weight.shape[0])
        self.L.fill_(1)
        for b in self.runner.buckets:
            self._graph(b, temperature > 0)

    @torch.no_grad()
    def decode(self, seq: list[int], n_prompt: int, max_new_tokens: int, eos: set[int], temperature: float,
               seed: int) -> list[int]:
        """Continue `seq` (prompt + first token, KV holding all but its last token) to max_new_tokens or EOS."""
        runner, out = self.runner, list(seq)
        want = min(max_new_tokens - (len(seq) - n_prompt), runner.capacity - len(seq))
        if want <= 0 or out[-1] in eos:
            return out
        self.seq[:len(seq)] = torch.tensor(seq, device=runner.device)
        self.L.fill_(len(seq))
        sampled = temperature > 0
        if sampled:
            self._ensure_noise(runner.layout.lm_head.weight.shape[0])
            self.temp.fill_(temperature)
            self.gen.manual_seed(seed)
        L, launched, pending = len(seq), 0, deque()

        def launch() -> None:  # step at host L: writes seq[L]; its copy to pinned memory queued right behind it
            nonlocal L, launched
            g = self._graph(runner.bucket(L), sampled)
            if sampled:
                self.noise.exponential_(generator=self.gen)
            g.replay()
            buf = self.pinned[launched % 2]
            buf.copy_(self.seq[L:L + 1], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            pending.append((buf, ev))
            L, launched = L + 1, launched + 1

        launch()
        while pending:
            if launched < want:
                launch()                     # the next step is queued before this one's token is read
            buf, ev = pending.popleft()
            ev.synchronize()
            out.append(int(buf[0]))
            if out[-1] in eos:
                break
        torch.cuda.current_stream(runner.device).synchronize()
        return out


def graphed_generate(runner: TargetRunner, prompt: list[int], first: int, max_new_tokens: int, eos: set,
                     temperature: float, seed: int) -> list[int]:
    """The graphed loop after a prefill that produced `first`: prompt + first + the generated tokens."""
    return GraphedAR.for_runner(runner).decode(list(prompt) + [first], len(prompt), max_new_tokens, eos,
                                               temperature, seed)
