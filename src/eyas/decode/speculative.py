"""Speculative generation (draft a tree, verify it in one target forward, accept, compact) and the
autoregressive baseline through the very same target step function.

KV invariant, both target and draft: with `seq` committed (prompt + generated), the caches hold
positions [0, len(seq) - 1); the last committed token is the next verification root.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import Tree, greedy_accept, sample_accept


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class GenStats:
    steps: int = 0                       # verification rounds
    emitted: int = 0                     # tokens emitted by rounds (accepted + bonus, before truncation)
    accepted_at: list[int] = field(default_factory=list)  # accepted_at[i] = rounds accepting >= i+1 drafts
    drafted: int = 0                     # drafted nodes verified
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_total: float = 0.0
    new_tokens: int = 0
    rounds: list[dict] = field(default_factory=list)  # per round: tree + accepted path (cost model)

    def add(self, other: "GenStats") -> None:
        for name in ("steps", "emitted", "drafted", "t_prefill", "t_draft", "t_verify", "t_total", "new_tokens"):
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
    if temperature <= 0:
        return int(logits.argmax())
    p = torch.softmax(logits.double().cpu() / temperature, dim=-1)
    return int(torch.multinomial(p.float(), 1, generator=gen).item())


def _prefill(runner: TargetRunner, prompt: list[int]):
    dev = runner.device
    n = len(prompt)
    if n + 1 > runner.capacity:
        raise ValueError(f"prompt of {n} tokens does not fit the KV capacity {runner.capacity}")
    ar = torch.arange(n, device=dev)
    anc = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
    return runner.step(torch.tensor(prompt, device=dev), ar, ar, torch.tensor(0, device=dev), anc, eager=True)


def _finish(seq: list[int], n_prompt: int, max_new: int, eos: set[int]) -> list[int]:
    out = seq[n_prompt:n_prompt + max_new]
    for i, t in enumerate(out):
        if t in eos:
            return out[:i + 1]
    return out


@torch.no_grad()
def ar_generate(runner: TargetRunner, prompt: list[int], max_new_tokens: int, *, temperature: float = 0.0,
                eos_ids=(), generator: torch.Generator | None = None) -> tuple[list[int], GenStats]:
    """The baseline: one target step per token, same runner (static cache, same compilation)."""
    stats, eos, dev = GenStats(), set(eos_ids), runner.device
    _sync(dev)
    t0 = time.perf_counter()
    logits, _ = _prefill(runner, prompt)
    seq = list(prompt) + [_first_token(logits[-1], temperature, generator)]
    _sync(dev)
    stats.t_prefill = time.perf_counter() - t0
    anc = torch.ones(1, 1, dtype=torch.bool, device=dev)
    while len(seq) - len(prompt) < max_new_tokens and seq[-1] not in eos:
        L = len(seq)
        pos = torch.tensor([L - 1], device=dev)
        logits, _ = runner.step(torch.tensor([seq[-1]], device=dev), pos, pos, torch.tensor(L - 1, device=dev), anc)
        seq.append(_first_token(logits[0], temperature, generator))
    _sync(dev)
    stats.t_total = time.perf_counter() - t0
    out = _finish(seq, len(prompt), max_new_tokens, eos)
    stats.new_tokens = len(out)
    return out, stats


class SpecDecoder:
    """Chain or tree speculative decoding around a TargetRunner and a proposer."""

    def __init__(self, runner: TargetRunner, proposer, *, temperature: float = 0.0, eos_ids=(),
                 record_rounds: bool = False, residual: bool = True):
        self.runner, self.proposer = runner, proposer
        self.temperature, self.eos = temperature, set(eos_ids)
        self.record_rounds, self.residual = record_rounds, residual

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new_tokens: int,
                 generator: torch.Generator | None = None) -> tuple[list[int], GenStats]:
        runner, dev, st = self.runner, self.runner.device, GenStats()
        depth = self.proposer.spec.depth
        st.accepted_at = [0] * depth
        _sync(dev)
        t0 = time.perf_counter()
        logits, aux = _prefill(runner, prompt)
        seq = list(prompt) + [_first_token(logits[-1], self.temperature, generator)]
        self.proposer.observe(seq, aux, 0)
        _sync(dev)
        st.t_prefill = time.perf_counter() - t0
        while len(seq) - len(prompt) < max_new_tokens and seq[-1] not in self.eos:
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
            logits, aux = runner.step(toks, pos, slots, torch.tensor(L - 1, device=dev), anc.to(dev))
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
