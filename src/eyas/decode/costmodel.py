"""Cost model: measured step times + a recorded acceptance profile predict other chain/tree settings.

Acceptance: replay. A greedy run records every round's verified tree (cumulative draft scores,
parents) and, per node, whether its token equals the target's argmax at its parent — known exactly
for every verified node. A candidate setting (total', depth', topk') is replayed on each round by
keeping nodes with depth <= depth' and sibling rank <= topk', then the total' best by score
(ancestor-closed); its accepted length is the deepest all-matching path. This is exact for
settings whose tree is contained in the recorded one and a lower bound otherwise, so record with
the largest tree (`--tree auto` does).

Time per round: catch-up + (depth-1) level steps (draft; per-level cost interpolated in the level
width between measured settings) + verify(T = total+1) (interpolated in T between measured
points, the AR step being T=1) + measured per-round overhead. Speedup per turn of n new tokens (where
measured; else per round, τ · t_AR / t_round): (AR prefill + (n-1) t_AR) / (start + first tree + (n-1)/τ t_round),
start being the speculative decoder's prefill and catch-up over the prompt, and the first tree one round's draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eyas.decode.tree import TreeSpec


@dataclass
class Costs:
    ar_step: float                                           # s per AR token (T=1 target step + host)
    verify: dict[int, float] = field(default_factory=dict)   # T -> s per verify forward (+ acceptance)
    level: dict[int, float] = field(default_factory=dict)    # draft level width -> s per draft forward
    overhead: float = 0.0                                    # s per round outside draft/verify
    ar_prefill: float = 0.0                                  # s per turn: the AR's prefill
    turn_start: float = 0.0                                  # s per turn: prefill + catch-up, before the first tree
    tokens_per_turn: float = 0.0                             # new tokens a turn (0: per-round speedups only)

    def add_run(self, spec: TreeSpec, stats) -> None:
        """Fold in a measured run's per-round times."""
        if not stats.steps:
            return
        self.verify[spec.total + 1] = stats.t_verify / stats.steps
        self.level[spec.topk] = stats.t_draft / stats.steps / spec.depth
        rest = stats.t_total - stats.t_prefill - stats.t_draft - stats.t_verify
        self.overhead = max(0.0, rest / stats.steps)
        if stats.turns:
            self.turn_start = max(0.0, stats.t_prefill - stats.t_prefill_tree) / stats.turns
            self.tokens_per_turn = stats.new_tokens / stats.turns

    def verify_time(self, T: int) -> float:
        pts = sorted({1: self.ar_step, **self.verify}.items())
        return _interp(pts, T)

    def level_time(self, width: int) -> float:
        if not self.level:
            raise ValueError("cost model has no measured draft step yet")
        return _interp(sorted(self.level.items()), width)

    def round_time(self, spec: TreeSpec) -> float:
        return spec.depth * self.level_time(spec.topk) + self.verify_time(spec.total + 1) + self.overhead

    def turn_speedup(self, spec: TreeSpec, tau: float) -> tuple[float, float] | None:
        """(speedup, tokens/s) over whole turns of `tokens_per_turn` new tokens, or None where not measured."""
        n = self.tokens_per_turn
        if n <= 1:
            return None
        first_tree = spec.depth * self.level_time(spec.topk)
        spec_s = self.turn_start + first_tree + (n - 1) / tau * self.round_time(spec)
        return (self.ar_prefill + (n - 1) * self.ar_step) / spec_s, n / spec_s

    def to_dict(self) -> dict:
        return {"ar_step_s": self.ar_step, "verify_s": {str(k): v for k, v in sorted(self.verify.items())},
                "draft_step_s": {str(k): v for k, v in sorted(self.level.items())}, "overhead_s": self.overhead,
                "ar_prefill_s": self.ar_prefill, "turn_start_s": self.turn_start,
                "tokens_per_turn": self.tokens_per_turn}


def _interp(points: list[tuple[int, float]], x: float) -> float:
    """Piecewise-linear; linear extrapolation from the two nearest ends (flat with one point)."""
    if len(points) == 1:
        return points[0][1]
    if x <= points[0][0]:
        (x0, y0), (x1, y1) = points[0], points[1]
    elif x >= points[-1][0]:
        (x0, y0), (x1, y1) = points[-2], points[-1]
    else:
        i = next(i for i, (px, _) in enumerate(points) if px >= x)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def replay_accepted(round_: dict, spec: TreeSpec) -> int:
    """Accepted drafted tokens if `spec` had been used in this recorded round."""
    scores, parents, match = round_["scores"], round_["parents"], round_["match"]
    n = len(parents)
    depth, rank = [0] * n, [0] * n
    seen: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        depth[i] = 1 if p < 0 else depth[p] + 1
        seen.setdefault(p, []).append(i)
    for sibs in seen.values():
        for r, i in enumerate(sorted(sibs, key=lambda j: (-scores[j], j))):
            rank[i] = r
    ok = [depth[i] <= spec.depth and rank[i] < spec.topk for i in range(n)]
    for i, p in enumerate(parents):  # ancestor closure: a node is a candidate only if its parent is
        if p >= 0 and not ok[p]:
            ok[i] = False
    cand = sorted((i for i in range(n) if ok[i]), key=lambda j: (-scores[j], j))[:spec.total]
    keep = set(cand)
    best = 0
    good = [False] * n
    for i in sorted(keep):
        p = parents[i]
        good[i] = match[i] and (p < 0 or (p in keep and good[p]))
        if good[i]:
            best = max(best, depth[i])
    return best


def predict(rounds: list[dict], spec: TreeSpec, costs: Costs) -> dict:
    """Predicted τ, s/round and speedup of `spec` from recorded greedy rounds and measured costs."""
    rounds = [r for r in rounds if r.get("match") is not None]
    if not rounds:
        raise ValueError("cost model needs recorded greedy rounds (temperature 0)")
    tau = 1.0 + sum(replay_accepted(r, spec) for r in rounds) / len(rounds)
    t = costs.round_time(spec)
    out = {"setting": spec.label(), "tau": tau, "round_s": t, "tokens_per_s": tau / t,
           "speedup": tau * costs.ar_step / t, "per": "round"}
    turn = costs.turn_speedup(spec, tau)
    if turn is not None:   # whole turns, as a measured speedup is: the prefills and the first tree count
        out.update(speedup=turn[0], tokens_per_s=turn[1], round_speedup=out["speedup"], per="turn")
    return out


def covers(recorded: TreeSpec, spec: TreeSpec) -> bool:
    """Rounds drafted with `recorded` hold every node `spec` would draft, so replaying them is unbiased.
    Rounds from a smaller tree miss the alternatives a larger one would have verified (they undercount)."""
    return recorded.depth >= spec.depth and recorded.topk >= spec.topk and recorded.total >= spec.total


def predict_from(recorded: list[tuple[TreeSpec, list[dict]]], spec: TreeSpec, costs: Costs) -> dict:
    """`predict` from the rounds of the best recorded setting for `spec`: its own if recorded, else the
    covering one with most rounds; with none covering, every round (then `covered` is False: a lower bound)."""
    own = [r for s, r in recorded if s == spec]
    cov = sorted(((s, r) for s, r in recorded if covers(s, spec)), key=lambda sr: -len(sr[1]))
    if own:
        src, rounds, ok = spec, own[0], True
    elif cov:
        (src, rounds), ok = cov[0], True
    else:
        src, rounds, ok = None, [r for _, rs in recorded for r in rs], False
    return {**predict(rounds, spec, costs), "replayed": src.label() if src else "all", "covered": ok}


def candidate_specs(max_total: int = 80, max_depth: int = 8, max_topk: int = 10) -> list[TreeSpec]:
    out = [TreeSpec.chain(k) for k in range(1, max_depth + 1)]
    for depth in range(3, max_depth + 1):
        for topk in (2, 4, 6, 8, 10):
            if topk > max_topk:
                continue
            for total in (8, 16, 24, 32, 48, 64, 80):
                if total <= max_total and total <= topk + (depth - 1) * topk * topk and total >= depth:
                    out.append(TreeSpec(total=total, depth=depth, topk=topk))
    return out


def choose(rounds: list[dict], costs: Costs, specs: list[TreeSpec] | None = None) -> tuple[TreeSpec, list[dict]]:
    """The setting with the best predicted speedup, plus every prediction (best first)."""
    preds = [(predict(rounds, s, costs), s) for s in (specs or candidate_specs())]
    preds.sort(key=lambda ps: -ps[0]["speedup"])
    return preds[0][1], [p for p, _ in preds]
