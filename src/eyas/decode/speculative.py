"""Speculative generation (draft a tree, verify it in one target forward, accept, compact) and the
autoregressive baseline through the very same target step function.

KV invariant, both target and draft: with `seq` committed (prompt + generated), the caches hold
positions [0, len(seq) - 1); the last committed token is the next verification root. Every target
step attends over `runner.bucket(highest slot it uses + 1)` KV slots, the baseline's and the
decoders' alike (a fair comparison); the host knows that number before each step (no device read).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial

import torch

from eyas.decode.autoregressive import GraphedAR, graphed_generate
from eyas.decode.prefill import GraphedPrefill, prefill
from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import Tree, accept_path, greedy_accept, sample_accept, sample_rows, tree_masks


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class GenStats:
    turns: int = 0                       # generations (prompts) these stats cover
    steps: int = 0                       # verification rounds
    emitted: int = 0                     # tokens emitted by rounds (accepted + bonus, before truncation)
    accepted_at: list[int] = field(default_factory=list)  # accepted_at[i] = rounds accepting >= i+1 drafts
    drafted: int = 0                     # drafted nodes verified
    t_prefill: float = 0.0
    t_prefill_target: float = 0.0        # of t_prefill (SpecDecoder): the target's prefill, the draft's catch-up
    t_prefill_catchup: float = 0.0       # over the prompt, the first tree (GPU time between events: launch-bound
    t_prefill_tree: float = 0.0          # stretches count)
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_total: float = 0.0
    new_tokens: int = 0
    rounds: list[dict] = field(default_factory=list)  # per round: tree + accepted path (cost model)

    def add(self, other: "GenStats") -> None:
        for name in ("turns", "steps", "emitted", "drafted", "t_prefill", "t_prefill_target", "t_prefill_catchup",
                     "t_prefill_tree", "t_draft", "t_verify", "t_total", "new_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        n = max(len(self.accepted_at), len(other.accepted_at))
        a = self.accepted_at + [0] * (n - len(self.accepted_at))
        b = other.accepted_at + [0] * (n - len(other.accepted_at))
        self.accepted_at = [x + y for x, y in zip(a, b)]
        self.rounds.extend(other.rounds)

    @property
    def tau(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    def accept_per_position(self) -> list[float]:
        return [a / self.steps for a in self.accepted_at] if self.steps else []


def _first_token(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> int:
    """A turn's first token from the prefill's last logits [V]. At T > 0 it is drawn where the logits are (an
    exponential race seeded from `gen`), as every later token is: a host copy of a 152 k-entry distribution cost
    ≈ 6 ms a turn on the GPU."""
    if temperature <= 0:
        return int(logits.argmax())
    g = torch.Generator(device=logits.device)
    g.manual_seed(int(torch.randint(0, 2 ** 62, (1,), generator=gen)))
    noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_(generator=g)
    return int(sample_rows(logits.float()[None], temperature, noise[None])[0])


def _device_sampler(temperature: float, generator: torch.Generator | None, dev: torch.device):
    """Token from logits [1, V]: argmax, or at T > 0 a sample drawn on the device the way SpecDecoder
    draws (exponential race, no host copy of the distribution), so a T > 0 speedup compares like with like."""
    if temperature <= 0:
        return lambda logits: int(logits[0].argmax())
    gen = generator if generator is not None and generator.device == dev else torch.Generator(device=dev)
    if gen is not generator:
        gen.manual_seed(0 if generator is None else int(torch.randint(0, 2 ** 62, (1,), generator=generator)))
    return lambda logits: int(sample_rows(logits, temperature, torch.empty_like(logits).exponential_(generator=gen))[0])


def _ar_step(runner: TargetRunner, token: int, L: int, anc: torch.Tensor):
    """The baseline's step: with L tokens committed, the last one at slot (= position) L - 1."""
    dev = runner.device
    pos = torch.tensor([L - 1], device=dev)
    return runner.step(torch.tensor([token], device=dev), pos, pos, torch.tensor(L - 1, device=dev), anc,
                       kv_len=runner.bucket(L))


@torch.no_grad()
def warm_ar(runner: TargetRunner, calls: int = 3, *, graphs: bool = True, temperature: float = 0.0) -> None:
    """Compile (and capture) the baseline step at every KV bucket, outside timed runs.
    Writes only slots that no generation has committed (between generations, none is)."""
    if runner.graph_prefill:
        GraphedPrefill.for_runner(runner).warm()
    if graphs and runner.device.type == "cuda":
        GraphedAR.for_runner(runner).warm(temperature)
        return
    anc = torch.ones(1, 1, dtype=torch.bool, device=runner.device)
    for b in runner.buckets:
        for _ in range(calls):
            _ar_step(runner, 0, b, anc)


def _running(seq: list[int], n_prompt: int, max_new: int, eos: set[int], new: int) -> bool:
    """Another verification round is due: room is left and none of the last round's `new` tokens stops
    generation. An eos accepted mid-chain ends it there (as in vLLM, whose counters then stop too), not only
    one in the round's last place: rounds past it would count acceptances the engine never sees."""
    return len(seq) - n_prompt < max_new and not any(t in eos for t in seq[len(seq) - new:])


def _finish(seq: list[int], n_prompt: int, max_new: int, eos: set[int]) -> list[int]:
    out = seq[n_prompt:n_prompt + max_new]
    for i, t in enumerate(out):
        if t in eos:
            return out[:i + 1]
    return out


@torch.no_grad()
def ar_generate(runner: TargetRunner, prompt: list[int], max_new_tokens: int, *, temperature: float = 0.0,
                eos_ids=(), generator: torch.Generator | None = None, graphs: bool = True) -> tuple[list[int], GenStats]:
    """The baseline: one target step per token, same runner (static cache, same compilation). On the GPU
    (graphs=True) the steps are captured CUDA graphs run one ahead of the host (decode/autoregressive.py)."""
    stats, eos, dev = GenStats(turns=1), set(eos_ids), runner.device
    _sync(dev)
    t0 = time.perf_counter()
    logits, _ = prefill(runner, prompt)
    seq = list(prompt) + [_first_token(logits[-1], temperature, generator)]
    _sync(dev)
    stats.t_prefill = time.perf_counter() - t0
    if graphs and dev.type == "cuda":
        seed = 0 if generator is None else int(torch.randint(0, 2 ** 62, (1,), generator=generator))
        seq = graphed_generate(runner, prompt, seq[-1], max_new_tokens, eos, temperature, seed)
    else:
        anc = torch.ones(1, 1, dtype=torch.bool, device=dev)
        draw = _device_sampler(temperature, generator, dev)
        while len(seq) - len(prompt) < max_new_tokens and seq[-1] not in eos:
            logits, _ = _ar_step(runner, seq[-1], len(seq), anc)
            seq.append(draw(logits[:1]))
    _sync(dev)
    stats.t_total = time.perf_counter() - t0
    out = _finish(seq, len(prompt), max_new_tokens, eos)
    stats.new_tokens = len(out)
    return out, stats


class HostSpecDecoder:
    """The reference decoder: the tree is built, verified and accepted on the host (a Tree object,
    python walks, several device->host reads per round). `SpecDecoder` must equal it token for token
    (greedy); it also serves proposers without the static-buffer protocol."""

    def __init__(self, runner: TargetRunner, proposer, *, temperature: float = 0.0, eos_ids=(),
                 record_rounds: bool = False, residual: bool = True):
        self.runner, self.proposer = runner, proposer
        self.temperature, self.eos = temperature, set(eos_ids)
        self.record_rounds, self.residual = record_rounds, residual

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new_tokens: int,
                 generator: torch.Generator | None = None) -> tuple[list[int], GenStats]:
        runner, dev, st = self.runner, self.runner.device, GenStats(turns=1)
        depth = self.proposer.spec.depth
        st.accepted_at = [0] * depth
        _sync(dev)
        t0 = time.perf_counter()
        logits, aux = prefill(runner, prompt)
        seq = list(prompt) + [_first_token(logits[-1], self.temperature, generator)]
        self.proposer.observe(seq, aux, 0)
        _sync(dev)
        st.t_prefill = time.perf_counter() - t0
        new = 1
        while _running(seq, len(prompt), max_new_tokens, self.eos, new):
            t1 = time.perf_counter()
            tree: Tree = self.proposer.propose()              # ends with a host read: synchronised
            t2 = time.perf_counter()
            # Verify at a static width (total + 1): a tree cut short by score ties gets pad rows that
            # see only themselves and write to slots the next round overwrites.
            L, T, W = len(seq), len(tree) + 1, self.proposer.spec.total + 1
            if L - 1 + W > runner.capacity:
                raise ValueError(f"KV capacity {runner.capacity} too small for {L} tokens plus a {W}-node tree")
            host_toks = [seq[-1]] + tree.tokens
            anc = torch.eye(W, dtype=torch.bool)
            anc[:T, :T] = tree.ancestors()
            toks = torch.tensor(host_toks + [0] * (W - T), device=dev)
            pos = torch.tensor([L - 1] + [L - 1 + d for d in tree.depths] + [L - 1] * (W - T), device=dev)
            slots = torch.arange(L - 1, L - 1 + W, device=dev)
            logits, aux = runner.step(toks, pos, slots, torch.tensor(L - 1, device=dev), anc.to(dev),
                                      kv_len=runner.bucket(L - 1 + W))
            if self.temperature <= 0:
                path, bonus = greedy_accept(tree, seq[-1], logits.argmax(-1).tolist())
            else:
                rows: dict[int, torch.Tensor] = {}

                def probs(i, logits=logits, rows=rows):
                    if i not in rows:
                        rows[i] = torch.softmax(logits[i].double().cpu() / self.temperature, dim=-1)
                    return rows[i]
                path, bonus = sample_accept(tree, probs, generator, residual=self.residual)
            keep = [0] + path
            aux_keep = aux.index_select(0, torch.tensor(keep, device=dev)).clone()
            t3 = time.perf_counter()
            moved = [(L - 1 + i, L - 1 + j) for j, i in enumerate(keep) if i != j]
            if moved:
                src, dst = zip(*moved)
                runner.cache.compact(torch.tensor(src, device=dev), torch.tensor(dst, device=dev))
            if self.record_rounds:
                st.rounds.append({"scores": tree.scores, "parents": tree.parents, "path": path,
                                  "match": self._matches(tree, seq[-1], logits) if self.temperature <= 0 else None})
            seq += [host_toks[i] for i in path] + [bonus]
            new = len(path) + 1
            t4 = time.perf_counter()
            self.proposer.observe(seq, aux_keep, L - 1)
            t5 = time.perf_counter()
            st.steps += 1
            st.emitted += len(path) + 1
            st.drafted += len(tree)
            for i in range(len(path)):
                st.accepted_at[i] += 1
            st.t_draft += (t2 - t1) + (t5 - t4)
            st.t_verify += t3 - t2
        _sync(dev)
        st.t_total = time.perf_counter() - t0
        out = _finish(seq, len(prompt), max_new_tokens, self.eos)
        st.new_tokens = len(out)
        return out, st

    @staticmethod
    def _matches(tree: Tree, root: int, logits: torch.Tensor) -> list[bool]:
        """Per node: does its token equal the target's argmax at its parent (known for every verified node)."""
        am = logits.argmax(-1).tolist()
        return [tree.tokens[i] == am[p + 1] for i, p in enumerate(tree.parents)]


class SpecDecoder:
    """Chain or tree speculative decoding with all round state on the device.

    A round is two functions of persistent buffers only (so each is one manually captured CUDA
    graph on the GPU, replayed with no per-round host->device copy):
      verify: tree masks from the tree buffers, one target forward at the static width W = total+1,
              acceptance (argmax or one sample per row), KV compaction, L += accepted + 1;
      draft:  the draft's catch-up over the accepted rows, then the next tree into the tree buffers.
    The host then reads one small tensor (accepted count + tokens): the round's only sync.
    verify attends over a KV bucket chosen on the host from len(seq); each bucket is its own pair of
    graphs, captured on first use (`warm` captures them all ahead of timed runs).
    Off the GPU (or graphs=False) the same two functions run eagerly. Proposers provide
    `observe(seq, aux, 0)` (prefill), `catchup(aux, toks, start, m)` and `draft_tree(L, seq) -> tensors`.
    """

    def __init__(self, runner: TargetRunner, proposer, *, temperature: float = 0.0, eos_ids=(),
                 record_rounds: bool = False, residual: bool = True, graphs: bool | None = None):
        self.runner, self.proposer = runner, proposer
        self.temperature, self.eos = temperature, set(eos_ids)
        self.record_rounds, self.residual = record_rounds, residual
        dev = self.device = runner.device
        self.cuda = dev.type == "cuda"
        self.graphs = self.cuda and graphs is not False  # CUDA graphs only exist on the GPU
        self.N, self.D = proposer.spec.total, proposer.spec.depth
        N, D, lg = self.N, self.D, dict(dtype=torch.long, device=dev)
        self.L = torch.zeros((), **lg)                             # committed tokens
        self.seq = torch.zeros(runner.capacity + D + 2, **lg)      # committed tokens (+ scratch after L)
        self.t_tok, self.t_par = torch.zeros(N, **lg), torch.zeros(N, **lg)
        self.t_valid = torch.zeros(N, dtype=torch.bool, device=dev)
        self.t_sc = torch.zeros(N, device=dev)
        self.emitted, self.c_start, self.c_m = torch.zeros(D + 1, **lg), torch.zeros((), **lg), torch.zeros((), **lg)
        self.ar_w, self.ar_d = torch.arange(N + 1, device=dev), torch.arange(D + 1, device=dev)
        self.out = torch.zeros(2 * D + 3, **lg)                    # n_acc, emitted [D+1], kept rows [D+1]
        self.rec = torch.zeros(5, N, dtype=torch.float64, device=dev)  # tokens, parents, valid, match, scores
        # pinned: the round's one device->host copy is asynchronous, waited for by one event
        self.out_host = torch.zeros(self.out.shape, dtype=self.out.dtype, pin_memory=self.cuda)
        self.rec_host = torch.zeros(self.rec.shape, dtype=self.rec.dtype, pin_memory=self.cuda)
        self.aux_keep = self.noise = None                          # shapes known at the first prefill
        self._graphs: dict[int, tuple] = {}                       # KV bucket -> (verify, draft) replays
        self._first_tree = None        # the prefill's tree (draft levels only): one graph, whatever the bucket
        if self.graphs and hasattr(proposer, "graph_prompt"):
            proposer.graph_prompt = True   # its catch-up over a prompt: graphed chunks too
        self._pool = None                                          # one memory pool for all of them
        # With a compiled target step, fuse the tree-mask and acceptance ops too (dozens of tiny kernels)
        fuse = (lambda f: torch.compile(f, dynamic=False)) if getattr(runner, "inner_compiled", False) else (lambda f: f)
        self._masks, self._accept = fuse(tree_masks), fuse(accept_path)
        self._gen_dev = torch.Generator(device=dev) if self.cuda else None

    # ---- the two round functions: persistent tensors in, persistent tensors out ----
    def _verify(self, kv_len: int) -> None:
        # kv_len: a bucket >= L - 1 + W, so every slot written, compacted or attended is below it
        L, D = self.L, self.D
        pv, anc, dep, valid_v = self._masks(self.t_par, self.t_valid, D)
        tok_v = torch.cat([self.seq[(L - 1).reshape(1)], self.t_tok])
        slots = L - 1 + self.ar_w
        logits, aux = self.runner.inner_step(tok_v, L - 1 + dep, slots, L - 1, anc, kv_len)
        if self.temperature <= 0:
            target, second = logits.argmax(-1), None
        else:
            target = sample_rows(logits, self.temperature, self.noise[0])
            second = None if self.residual else sample_rows(logits, self.temperature, self.noise[1])
        n_acc, keep, emitted = self._accept(tok_v, pv, anc, dep, valid_v, target, D, second)
        self.runner.cache.compact(slots[keep], L - 1 + self.ar_d)
        self.aux_keep.copy_(aux[keep])
        self.emitted.copy_(emitted)
        self.c_start.copy_(L - 1)
        self.c_m.copy_(n_acc + 1)
        self.seq.index_copy_(0, L + self.ar_d, emitted)
        self.out.copy_(torch.cat([(n_acc).reshape(1), emitted, keep]))
        if self.temperature <= 0:  # always captured (a few tiny kernels): record_rounds may change later
            match = tok_v[1:] == target[pv[1:]]
            self.rec.copy_(torch.stack([self.t_tok.double(), self.t_par.double(), valid_v[1:].double(),
                                        match.double(), self.t_sc.double()]))
        L.add_(n_acc + 1)

    def _draft(self, catchup: bool = True) -> None:
        if catchup:
            self.proposer.catchup(self.aux_keep, self.emitted, self.c_start, self.c_m)
        tok, par, valid, sc = self.proposer.draft_tree(self.L, self.seq)
        self.t_tok.copy_(tok)
        self.t_par.copy_(par)
        self.t_valid.copy_(valid)
        self.t_sc.copy_(sc)

    def _round(self, kv_len: int):
        """(verify, draft) at this KV bucket: eager, or its CUDA graphs (captured on first use)."""
        if self.graphs and kv_len not in self._graphs:
            try:
                self._graphs[kv_len] = self._capture(kv_len)
            except RuntimeError as e:  # keep the run going (eagerly), loudly: timings are then not graph timings
                print(f"WARNING: CUDA graph capture of the speculative round failed ({e}); running eagerly")
                self.graphs = False
        return self._graphs[kv_len] if self.graphs else (partial(self._verify, kv_len), self._draft)

    def _warm(self, kv_len: int) -> None:
        """Run the round twice at this bucket (compiles it; on the GPU on a side stream, as capture
        needs), restoring the state after each run: it wrote only uncommitted KV slots < kv_len."""
        p = self.proposer
        state = [self.L, self.seq, self.t_tok, self.t_par, self.t_valid, self.t_sc, self.emitted, self.c_start,
                 self.c_m, self.aux_keep] + [getattr(p, n) for n in ("pre0", "lp0", "id0") if hasattr(p, n)]
        saved = [t.clone() for t in state]
        side = torch.cuda.Stream(self.device) if self.cuda else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side) if side is not None else nullcontext():
            for _ in range(2):
                try:
                    self._verify(kv_len)
                    self._draft()
                finally:
                    for t, v in zip(state, saved):
                        t.copy_(v)
        if side is not None:
            torch.cuda.current_stream(self.device).wait_stream(side)

    def _capture(self, kv_len: int) -> tuple:
        """Warm up, then capture each round function once at this bucket. The draft does not read the
        target cache, but a pair per bucket keeps this simple; all share one memory pool (safe: no
        graph output outlives its replay, everything persistent is allocated outside the graphs)."""
        self._warm(kv_len)
        self._pool = self._pool or torch.cuda.graph_pool_handle()
        gv, gd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(gv, pool=self._pool):
            self._verify(kv_len)
        with torch.cuda.graph(gd, pool=self._pool):
            self._draft()
        if self._first_tree is None:
            gt = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gt, pool=self._pool):
                self._draft(catchup=False)
            self._first_tree = gt.replay
        return gv.replay, gd.replay

    @torch.no_grad()
    def warm(self, prompt: list[int]) -> None:
        """Compile / capture the round at every bucket a generation can use, from a short prompt's
        state (any bucket >= its first round's fits), so that none lands in a timed generation."""
        seq = self._prefill(prompt[:1], None)
        if hasattr(self.proposer, "warm_prompt"):
            self.proposer.warm_prompt()
        for b in self.runner.buckets:
            if b >= self.runner.bucket(len(seq) - 1 + self.N + 1):
                if self.graphs:
                    self._round(b)
                else:
                    self._warm(b)

    def _prefill(self, prompt: list[int], generator, marks: list | None = None) -> list[int]:
        """A turn's start: the target's prefill, the draft's catch-up over the prompt, the first tree (`marks`
        gets a mark before each part and one after the last)."""
        mark = (lambda: marks.append(self._mark())) if marks is not None else (lambda: None)
        mark()
        logits, aux = prefill(self.runner, prompt)
        mark()
        seq = list(prompt) + [_first_token(logits[-1], self.temperature, generator)]
        self.seq[:len(seq)] = torch.tensor(seq, device=self.device)
        self.L.fill_(len(seq))
        if self.aux_keep is None:
            self.aux_keep = aux.new_zeros((self.D + 1,) + tuple(aux.shape[1:]))
        if self.temperature > 0 and self.noise is None:
            self.noise = torch.ones(1 if self.residual else 2, self.N + 1, logits.shape[-1], device=self.device)
        if self.temperature > 0 and self.cuda:
            seed = 0 if generator is None else int(torch.randint(0, 2 ** 62, (1,), generator=generator))
            self._gen_dev.manual_seed(seed)
        self.proposer.observe(seq, aux, 0)
        mark()
        if self.graphs and self._first_tree is not None:
            self._first_tree()
        else:
            self._draft(catchup=False)
        mark()
        return seq

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new_tokens: int,
                 generator: torch.Generator | None = None) -> tuple[list[int], GenStats]:
        runner, st, D, W = self.runner, GenStats(turns=1), self.D, self.N + 1
        st.accepted_at = [0] * D
        _sync(self.device)
        t0 = time.perf_counter()
        pre_marks: list = []
        seq = self._prefill(prompt, generator, pre_marks)
        _sync(self.device)
        st.t_prefill = time.perf_counter() - t0
        marks, raw, new = [], [], 1
        while _running(seq, len(prompt), max_new_tokens, self.eos, new):
            if len(seq) - 1 + W + D + 1 > runner.capacity:
                raise ValueError(f"KV capacity {runner.capacity} too small for {len(seq)} tokens plus a {W}-node tree")
            verify, draft = self._round(runner.bucket(len(seq) - 1 + W))  # the verify's slots end at L - 1 + W
            if self.noise is not None:
                self.noise.exponential_(generator=self._gen_dev if self.cuda else generator)
            m0 = self._mark()
            verify()
            m1 = self._mark()
            self.out_host.copy_(self.out, non_blocking=self.cuda)
            if self.record_rounds:
                self.rec_host.copy_(self.rec, non_blocking=self.cuda)
            done = self._mark()
            draft()                      # the next round's tree, on the GPU while the host reads this one
            m2 = self._mark()
            if self.cuda:
                done.synchronize()       # the round's one device->host sync
            out = self.out_host.tolist()
            n = out[0]
            seq += out[1:n + 2]
            new = n + 1
            marks.append((m0, m1, m2))
            if self.record_rounds:
                raw.append((out[D + 3:D + 3 + n], self.rec_host.clone()))
            st.steps += 1
            st.emitted += n + 1
            for i in range(n):
                st.accepted_at[i] += 1
        _sync(self.device)
        st.t_total = time.perf_counter() - t0
        for m0, m1, m2 in marks:
            st.t_verify += self._elapsed(m0, m1)
            st.t_draft += self._elapsed(m1, m2)
        a, b, c, d = pre_marks
        st.t_prefill_target, st.t_prefill_catchup, st.t_prefill_tree = (self._elapsed(a, b), self._elapsed(b, c),
                                                                         self._elapsed(c, d))
        st.drafted = st.steps * self.N
        st.rounds = [self._round_record(keep, rec, self.temperature <= 0) for keep, rec in raw]
        out = _finish(seq, len(prompt), max_new_tokens, self.eos)
        st.new_tokens = len(out)
        return out, st

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def _elapsed(self, a, b) -> float:
        return (b - a) if not self.cuda else a.elapsed_time(b) / 1e3

    @staticmethod
    def _round_record(keep: list[int], rec: torch.Tensor, greedy: bool) -> dict:
        """The host decoder's round record (valid nodes only; path in their verification indices)."""
        tok, par, valid, match, sc = rec.tolist()
        remap, parents, scores, matches = {}, [], [], []
        for i in range(len(tok)):
            if valid[i]:
                remap[i] = len(parents)
                parents.append(-1 if par[i] < 0 else remap[int(par[i])])
                scores.append(sc[i])
                matches.append(bool(match[i]))
        return {"scores": scores, "parents": parents, "path": [remap[r - 1] + 1 for r in keep],
                "match": matches if greedy else None}
