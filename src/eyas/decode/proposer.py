"""Proposers: what drafts the tree. `EagleProposer` runs an Eagle3Draft with its own static KV cache;
`OracleProposer` drafts the target's own greedy continuation (a test instrument: every drafted
token must be accepted, which checks verification, masks and KV compaction end to end).

Protocol (both): `observe(seq, aux, start)` after each target forward, where `seq` is every
committed token and `aux` [m, k, Ht] are the target's aux states at positions start..start+m-1;
then `propose() -> Tree`.

Draft semantics (vLLM's Eagle3 proposer): draft position t takes (h_t, x_{t+1}) at RoPE position t
and predicts x_{t+2}; tree level j after the last observed position p runs at position p+j with
its parent's pre-norm output as hidden. `observe` is the catch-up: it (re)computes the draft KV of
the accepted positions from the target's fresh aux states; the speculative levels write to a
scratch region that the next round simply overwrites.
"""

from __future__ import annotations

import warnings

import torch

from eyas import env
from eyas.decode.prefill import WIDTHS, chunks
from eyas.decode.target_step import raise_recompile_limit
from eyas.decode.topk import topk_rows
from eyas.decode.tree import Tree, TreeSpec, keep_best, selection_tensors, selection_tree
from eyas.devices import capture_graph
from eyas.draft.model import Eagle3Draft

# EYAS_DRAFT_CACHE=copy: draft levels concatenate the cache with the new k/v (two copies of the cache per level)
# instead of attending over it in place — the older path, kept as an escape hatch and as the reference to compare with
_CACHE_COPY = env.get("EYAS_DRAFT_CACHE") == "copy"
# EYAS_PROMPT_CATCHUP=eager: the catch-up over a prompt runs eagerly at its own length even where the decoder's
# graphs are on (the comparison for its padded, graphed chunks)
_PROMPT_EAGER = env.get("EYAS_PROMPT_CATCHUP") == "eager"


class EagleProposer:
    def __init__(self, draft: Eagle3Draft, spec: TreeSpec, capacity: int):
        self.draft, self.spec, self.capacity = draft, spec, capacity
        cfg = draft.config
        p = draft.fc.weight
        self.device, self.dtype = p.device, p.dtype
        self.pad = spec.depth + 1                     # catch-up rows per round (accepted + bonus), padded
        self.junk = capacity                          # [capacity, capacity+pad): slots for pad rows
        self.scratch = capacity + self.pad            # [scratch, scratch+S): speculative levels
        self.S = max(1, (spec.depth - 1) * spec.topk)
        size = self.scratch + self.S
        self.kbuf = torch.zeros(1, cfg.num_key_value_heads, size, cfg.head_dim, device=self.device, dtype=self.dtype)
        self.vbuf = torch.zeros_like(self.kbuf)
        torch._dynamo.mark_static_address(self.kbuf)
        torch._dynamo.mark_static_address(self.vbuf)
        self.size = size
        self._compiled_tree = self._compiled_catchup = None
        # The latest catch-up's last row (the next tree's root), as static buffers the round graphs
        # read and write in place: pre-norm hidden [H], top-k log-probs and target ids [k].
        self.pre0 = torch.zeros(cfg.hidden_size, device=self.device, dtype=self.dtype)
        self.lp0 = torch.zeros(spec.topk, device=self.device)
        self.id0 = torch.zeros(spec.topk, device=self.device, dtype=torch.long)
        self._tree_fn, self._catchup_fn = self._tree, self._catchup  # what the static-buffer path runs
        self.p = 0        # host path: position of the latest catch-up's last row
        self.ctx = 0      # draft KV slots [0, ctx) are committed
        # A prompt's catch-up in padded chunks of static widths (as the target's prefill): set by a decoder whose
        # rounds are CUDA graphs (each width is then one captured graph), or by tests (padded chunks, eagerly)
        self.graph_prompt = False
        self.widths = WIDTHS                            # its chunk widths (the target prefill's)
        self._prompt_ins: dict[int, tuple[torch.Tensor, ...]] = {}   # width -> static inputs (aux, toks, start, m)
        self._prompt_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._prompt_pool = None
        self._prompt_graph_error: str | None = None
        self._aux_like: torch.Tensor | None = None      # aux[:0] of the latest observe: the chunks' input shape

    def compile(self, mode: str = "reduce-overhead") -> None:
        raise_recompile_limit()
        self._compiled_tree = torch.compile(self._tree, mode=mode, fullgraph=False, dynamic=False)
        self._compiled_catchup = torch.compile(self._catchup, mode=mode, fullgraph=False, dynamic=False)

    def compile_inner(self) -> None:
        """Compile (no CUDA graphs of its own) the two functions the static-buffer path runs, for the
        decoder's manually captured graphs to replay."""
        raise_recompile_limit()
        self._tree_fn = torch.compile(self._tree, dynamic=False)
        self._catchup_fn = torch.compile(self._catchup, dynamic=False)

    def _set_root(self, pre, top, ids) -> None:
        self.pre0.copy_(pre[0])
        self.lp0.copy_(top[0])
        self.id0.copy_(ids[0])

    @torch.no_grad()
    def catchup(self, aux, toks, start, m) -> None:
        """Static-buffer path: `_catchup` (all tensors, rows >= m padding) into the root buffers."""
        self._set_root(*self._catchup_fn(aux, toks, start, m))

    @torch.no_grad()
    def draft_tree(self, L: torch.Tensor, seq: torch.Tensor):
        """Static-buffer path: the next tree with `L` (0-d) tokens committed, as tensors of static shape
        N = spec.total: tokens [N], parents [N] (-1 root), valid [N] (False: orphan on an exact tie),
        scores [N]. Nodes are in global-index order, so parents precede children."""
        return selection_tensors(*self._tree_fn(self.pre0, self.lp0, self.id0, L - 2, L - 1))

    def _step(self, tokens, hidden, positions, write, ctx_len, anc, self_mask, pick):
        # tokens/positions/write [T]; hidden [T, H]; anc bool [T, S] over the scratch region;
        # self_mask bool [T, T] among this call's rows; pick [R] rows whose top-k we need.
        T = tokens.shape[0]
        cols = torch.arange(self.size, device=tokens.device)
        see = cols[None, :] < ctx_len
        extra = torch.zeros(T, self.size, dtype=torch.bool, device=tokens.device)
        extra[:, self.scratch:] = anc
        if _CACHE_COPY:  # the previous path (escape hatch): attend over cache ++ new k/v, then write them
            mask = torch.cat([see | extra, self_mask], dim=1)[None, None]               # [1, 1, T, size+T]
            pre, (k, v) = self.draft(tokens[None], hidden[None].to(self.dtype), positions[None], mask=mask,
                                     past=(self.kbuf, self.vbuf))
            self.kbuf.index_copy_(2, write, k)
            self.vbuf.index_copy_(2, write, v)
        else:
            # The draft writes this call's k/v at `write` and attends over the cache in place (no copy of it);
            # those slots are >= ctx_len and outside anc, so their columns are exactly self_mask's.
            mask = (see | extra).index_copy(1, write, self_mask)[None, None]              # [1, 1, T, size]
            pre, _ = self.draft(tokens[None], hidden[None].to(self.dtype), positions[None], mask=mask,
                                past=(self.kbuf, self.vbuf), cache_slots=write)
        pre = pre[0].index_select(0, pick)
        logp = torch.log_softmax(self.draft.logits(pre).float(), dim=-1)
        top, ids = topk_rows(logp, self.spec.topk)                       # [R, k] over the draft vocab
        return pre, top, self.draft.to_target_ids(ids)

    def _catchup(self, aux, toks, start, m, pads_after: bool = False):
        """Draft KV for committed positions start..start+m-1 (rows >= m are padding): aux [R, k, Ht],
        toks [R], start/m 0-d long. Returns the last real row's (pre [1, H], top-k logp, top-k ids).
        Pad rows write junk slots, or with pads_after (a prompt's chunk, start + R <= capacity) the slots after the
        real rows: uncommitted, so every later catch-up overwrites them before any row reads them."""
        rows, dev = toks.shape[0], toks.device
        hidden = self.draft.combine(aux.to(self.dtype))                    # [R, H]
        ar = torch.arange(rows, device=dev)
        real = ar < m
        write = torch.where(real, start + ar, (start if pads_after else self.junk) + ar)
        self_mask = (ar[:, None] >= ar[None, :]) & real[None, :]
        self_mask = self_mask | torch.eye(rows, dtype=torch.bool, device=dev)  # pad rows see only themselves
        anc = torch.zeros(rows, self.S, dtype=torch.bool, device=dev)
        return self._step(toks, hidden, start + ar, write, start, anc, self_mask, (m - 1).reshape(1))

    @torch.no_grad()
    def observe(self, seq: list[int], aux: torch.Tensor, start: int) -> None:
        m = aux.shape[0]
        if start + m > self.capacity:
            raise ValueError(f"draft KV capacity {self.capacity} exceeded at position {start + m}")
        dev = self.device
        toks = seq[start + 1:start + 1 + m]
        self._aux_like = aux[:0]
        if m > self.pad and self.graph_prompt and not _PROMPT_EAGER:
            self._prompt_chunks(aux, torch.tensor(toks, device=dev), start)
            self.ctx, self.p = start + m, start + m - 1
            return
        eager = m > self.pad or self._compiled_catchup is None  # prefill: variable length, eager
        rows = m if eager else self.pad
        if rows > m:  # rounds: padded to one static shape
            aux = torch.cat([aux, aux.new_zeros((rows - m,) + tuple(aux.shape[1:]))])
            toks = toks + [0] * (rows - m)
        args = (aux, torch.tensor(toks, device=dev), torch.tensor(start, device=dev), torch.tensor(m, device=dev))
        if eager:
            self._set_root(*self._catchup(*args))
        else:
            torch.compiler.cudagraph_mark_step_begin()
            self._set_root(*self._compiled_catchup(*args))
        self.ctx = start + m
        self.p = start + m - 1

    def _prompt_chunks(self, aux, toks, start: int) -> None:
        """The catch-up over a prompt (aux [m, k, Ht], toks [m]) as chunks of static widths, the last one padded;
        each width is one CUDA graph on the GPU (a chunk whose pad would pass the capacity runs eagerly)."""
        dev = self.device
        for s, n, w in chunks(toks.shape[0], self.capacity - start, self.widths):
            if w is None:
                self._set_root(*self._catchup(aux[s:s + n], toks[s:s + n], torch.tensor(start + s, device=dev),
                                              torch.tensor(n, device=dev)))
                continue
            if w not in self._prompt_ins:
                self._prompt_ins[w] = (aux.new_zeros((w,) + tuple(aux.shape[1:])),
                                       torch.zeros(w, dtype=torch.long, device=dev),
                                       torch.zeros((), dtype=torch.long, device=dev),
                                       torch.ones((), dtype=torch.long, device=dev))
            a, t, st, mm = self._prompt_ins[w]
            a[:n].copy_(aux[s:s + n])
            a[n:].zero_()
            t[:n].copy_(toks[s:s + n])
            t[n:].zero_()
            st.fill_(start + s)
            mm.fill_(n)
            self._prompt_run(w)

    @torch.no_grad()
    def warm_prompt(self) -> None:
        """Capture the prompt chunks' graphs of every width (after a first `observe`, which gives aux's shape), so none
        is captured in a timed turn. Writes draft slots 0..w-1: between generations none is committed."""
        if not self.graph_prompt or _PROMPT_EAGER or self._aux_like is None:
            return
        for w in (w for w in self.widths if w <= self.capacity):
            self._prompt_chunks(self._aux_like.new_zeros((w,) + tuple(self._aux_like.shape[1:])),
                                torch.zeros(w, dtype=torch.long, device=self.device), 0)

    def _prompt_run(self, w: int) -> None:
        """Catch up the loaded chunk of width w and set the root: its CUDA graph's replay (captured on first use, once
        loaded: the warm-up runs write exactly the slots the replay writes), eagerly off the GPU."""
        def run():
            self._set_root(*self._catchup(*self._prompt_ins[w], pads_after=True))
        if self.device.type != "cuda" or self._prompt_graph_error:
            return run()
        if w not in self._prompt_graphs:
            try:
                self._prompt_pool = self._prompt_pool or torch.cuda.graph_pool_handle()
                g, _ = capture_graph(run, self.device, self._prompt_pool)
            except RuntimeError as e:   # keep decoding (padded chunks, eagerly), loudly: timings are then not graphs'
                self._prompt_graph_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                warnings.warn(f"the draft's prompt catch-up runs eagerly from now on: its CUDA graph could not be "
                              f"captured ({self._prompt_graph_error})", RuntimeWarning, stacklevel=2)
                return run()
            self._prompt_graphs[w] = g
        self._prompt_graphs[w].replay()

    def _tree(self, pre0, lp0, id0, p, ctx):
        """All draft levels of one round as pure tensor code (one CUDA graph when compiled).
        pre0 [H], lp0/id0 [k], p/ctx 0-d long. Returns int64 [3, total] (global index, token, parent
        global index) and the kept nodes' cumulative scores [total], ordered by global index."""
        k, D = self.spec.topk, self.spec.depth
        dev = pre0.device
        scores, tokens, parents = [lp0], [id0], [torch.full((k,), -1, device=dev, dtype=torch.long)]
        f_score, f_tok, f_hidden = lp0, id0, pre0.expand(k, -1).contiguous()
        f_gidx = torch.arange(k, device=dev)
        f_anc = torch.zeros(k, self.S, dtype=torch.bool, device=dev)
        eye = torch.eye(k, dtype=torch.bool, device=dev)
        pick = torch.arange(k, device=dev)
        base = k
        for lvl in range(1, D):
            local = torch.arange((lvl - 1) * k, lvl * k, device=dev)
            pos = (p + lvl).expand(k)
            pre, lp, ids = self._step(f_tok, f_hidden, pos, self.scratch + local, ctx, f_anc, eye, pick)
            cum = (f_score[:, None] + lp).flatten()                             # [k*k]
            scores.append(cum)
            tokens.append(ids.flatten())
            parents.append(f_gidx.repeat_interleave(k))
            child_anc = f_anc.clone()
            child_anc[pick, local] = True                                       # parents' own slots
            top = topk_rows(cum, k)[1]                                          # k == 1 (chains): a max
            r = top // k
            f_score, f_tok, f_hidden, f_anc = cum[top], ids.flatten()[top], pre[r], child_anc[r]
            f_gidx = base + top
            base += k * k
        return keep_best(scores, tokens, parents, self.spec.total)

    @torch.no_grad()
    def propose(self) -> Tree:
        """EAGLE-2: expand the `topk` best nodes per level by cumulative log-prob, keep the `total` best."""
        args = (self.pre0, self.lp0, self.id0, torch.tensor(self.p, device=self.device),
                torch.tensor(self.ctx, device=self.device))
        if self._compiled_tree is None:
            ints, sc = self._tree(*args)
        else:
            torch.compiler.cudagraph_mark_step_begin()
            ints, sc = self._compiled_tree(*args)
        return selection_tree(ints, sc)


class OracleProposer:
    """Drafts the target's own greedy continuation as a chain of `k` (plain forwards, no cache)."""

    def __init__(self, model, k: int):
        self.model, self.k = model, k
        self.seq: list[int] = []
        self.spec = TreeSpec.chain(k)

    def observe(self, seq: list[int], aux: torch.Tensor, start: int) -> None:
        self.seq = list(seq)

    def catchup(self, aux, toks, start, m) -> None:
        pass  # static-buffer path: the decoder's token buffer is all the oracle reads

    @torch.no_grad()
    def draft_tree(self, L: torch.Tensor, seq: torch.Tensor):
        """Static-buffer path: k greedy forwards over the whole (causal, so junk after L is harmless)
        token buffer, reading the argmax at L-1+j: no host sync, static shapes."""
        ids, dev = seq.clone(), seq.device
        for j in range(self.k):
            logits = self.model(input_ids=ids[None], use_cache=False).logits[0]
            nxt = logits.index_select(0, (L - 1 + j).reshape(1)).argmax(-1)
            ids.index_copy_(0, (L + j).reshape(1), nxt)
        tok = ids.index_select(0, L + torch.arange(self.k, device=dev))
        return (tok, torch.arange(-1, self.k - 1, device=dev), torch.ones(self.k, dtype=torch.bool, device=dev),
                torch.zeros(self.k, device=dev))

    @torch.no_grad()
    def propose(self) -> Tree:
        dev = next(self.model.parameters()).device
        ids = torch.tensor([self.seq], device=dev)
        out = []
        for _ in range(self.k):
            nxt = int(self.model(input_ids=ids, use_cache=False).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]], device=dev)], dim=1)
        return Tree(out, list(range(-1, self.k - 1)))
