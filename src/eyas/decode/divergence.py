"""Where greedy speculative output leaves the AR baseline, and why: the tie rule, then the recheck.

The tie rule (`logit_gap`) explains a divergence when, at the first differing token, the target's logits of the two
tokens are within TIE_ULPS ulps of the model dtype at their magnitude. A divergence it does not explain is either
numerics it cannot see (a flat position: the hidden state's rounding noise does not shrink with the logit, and 2 bf16
ulps of a logit near 2 are only 0.016) or a decoder bug; the run's JSON cannot tell which. `recheck` tells, inside the
run that found it (the same target, draft, prompt and setting): it decodes that turn again alone, with the AR baseline
and the speculative decoder, in fp32 (copies of target and draft) and in the run's own dtype:
  fp32 speculative == fp32 AR  ->  verdict "numerics": the decoder is exact; the run's precision made the difference
  fp32 speculative != fp32 AR  ->  verdict "decoder": a real bug (printed loudly, counted in unexplained_decoder)
It only attributes: `unexplained_divergences` stays the tie rule's count.
"""

from __future__ import annotations

import copy
import gc
import math
import sys
from contextlib import contextmanager

import torch

from eyas.decode.speculative import SpecDecoder, ar_generate
from eyas.decode.target_step import TargetRunner
from eyas.draft.kinds import get_kind
from eyas.target import drop_capture_hooks, find_layout

TIE_ULPS = 2                                          # a logit tie: |gap| <= 2 ulp of the model dtype
VERDICTS = ("numerics", "decoder")
COUNTS = tuple(f"unexplained_{v}" for v in VERDICTS + ("unchecked",))  # a result's recheck keys


def ulp(x: float, dtype: torch.dtype) -> float:
    """Spacing of `dtype`'s representable numbers at magnitude |x| (eps = 2^-stored mantissa bits)."""
    return 2.0 ** math.floor(math.log2(max(abs(x), 1e-30))) * torch.finfo(dtype).eps


def logit_gap(runner: TargetRunner, prompt: list[int], ref: list[int], other: list[int]) -> dict:
    """At the first differing token: the target's logit(ref token) - logit(other token) given the common prefix."""
    i = next(i for i, (a, b) in enumerate(zip(ref + [-1], other + [-2])) if a != b)
    if i >= min(len(ref), len(other)):
        return {"index": i, "gap": None, "note": "one output is a prefix of the other (eos/length)"}
    ids = torch.tensor([prompt + ref[:i]], device=runner.device)
    logits = runner.model(input_ids=ids, use_cache=False).logits[0, -1].float()
    gap = float(logits[ref[i]] - logits[other[i]])
    # "Lossless" in low precision: a divergence is explained iff the two tokens' logits tie within
    # TIE_ULPS units in the last place of the model dtype at their magnitude (bf16: 8 mantissa bits).
    m = max(abs(float(logits[ref[i]])), abs(float(logits[other[i]])))
    u = ulp(m, runner.dtype)
    return {"index": i, "gap": gap, "magnitude": m, "ulp": u, "tie": abs(gap) <= TIE_ULPS * u}


@torch.no_grad()
def recheck(session, spec, divergences: list[dict], turns: dict, limit: int) -> dict:
    """Recheck the first `limit` divergences that are not ties; each gets `recheck` (in place). `session`: the
    evaluate.Session that decoded them (target, draft, runner, decoders, baseline); `turns`: (question_id, turn) ->
    (prompt, speculative output), exactly as the run had them (a later turn's prompt holds the baseline's answers).
    Returns the result's counts: unexplained_numerics, unexplained_decoder, unexplained_unchecked (over the
    limit, or the recheck failed)."""
    todo = [d for d in divergences if not d.get("tie")]
    fp32 = None
    try:
        for d in todo[:limit]:
            key = (d["question_id"], d["turn"])
            prompt, out = turns[key]
            try:
                fp32 = fp32 or _Fp32(session, spec)   # built once per setting, only when something needs it
                d["recheck"] = _one(session, spec, fp32, prompt, session.baseline[key][0], out)
            except (RuntimeError, ValueError) as e:  # e.g. no memory for the fp32 copy: keep the run's results
                d["recheck"] = {"verdict": "error", "error": f"{type(e).__name__}: {e}"[:500]}
            print(f"eval recheck: {describe(d)}", file=sys.stderr, flush=True)
    finally:
        if fp32 is not None:  # free the copies now: the runner refers to itself (inner_step), so only gc frees it
            fp32.runner.close()
            del fp32
            gc.collect()
            if session.runner.device.type == "cuda":
                torch.cuda.empty_cache()
    counts = {f"unexplained_{v}": sum(d.get("recheck", {}).get("verdict") == v for d in todo) for v in VERDICTS}
    counts["unexplained_unchecked"] = len(todo) - sum(counts.values())
    return counts


class _Fp32:
    """fp32 copies of the session's target and draft (the same weights, upcast exactly) on the same device, with a
    fresh runner and a decoder for `spec`. Both run eagerly (no compile, no CUDA graphs): a few turns, where the
    question is exactness, not speed."""

    def __init__(self, session, spec):
        model = drop_capture_hooks(copy.deepcopy(session.target.model)).float()
        draft = copy.deepcopy(session.draft).float()
        self.runner = TargetRunner(model, find_layout(model), draft.config.aux_layer_ids, session.capacity,
                                   min_bucket=min(session.runner.buckets))
        proposer = get_kind(draft.config).proposer(draft, spec, session.capacity)
        self.decoder = SpecDecoder(self.runner, proposer, eos_ids=session.eos, graphs=False)


@contextmanager
def _no_tf32():
    was = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # TF32 matmuls would make "fp32" a 10-bit mantissa
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(was)


def _one(session, spec, fp32: _Fp32, prompt: list[int], ref: list[int], out: list[int]) -> dict:
    n, eos = session.max_new, session.eos
    with _no_tf32():
        ar32, _ = ar_generate(fp32.runner, prompt, n, eos_ids=eos)
        sp32, _ = fp32.decoder.generate(prompt, n)
        at = logit_gap(fp32.runner, prompt, ref, out)          # how flat the run's divergence point is
        bug = logit_gap(fp32.runner, prompt, ar32, sp32) if sp32 != ar32 else None
    # The run's dtype, alone: the session's own runner and decoder (the same kernels and graphs), nothing before it.
    # Reproduced = the same two outputs as in the run (a prompt or state that differed would show here).
    ar, _ = ar_generate(session.runner, prompt, n, eos_ids=eos)
    sp, _ = session.decoder(spec).generate(prompt, n)
    rec = {"verdict": "decoder" if bug else "numerics", "fp32_identical": bug is None, "fp32_gap": at["gap"],
           "alone_identical": sp == ar, "alone_reproduced": (ar, sp) == (ref, out),
           "dtype": str(session.runner.dtype)}
    if bug:
        rec["fp32_divergence"] = bug   # where fp32 speculative leaves fp32 AR, and the fp32 gap there
    return rec


def describe(d: dict) -> str:
    """One line for a divergence: where, the tie rule's gap, and the recheck's verdict (loud for a decoder bug)."""
    where = f"question {d['question_id']} turn {d['turn']} ({d.get('category', '?')}) token {d['index']}"
    gap = "no gap (one output is a prefix of the other)" if d.get("gap") is None else (
        f"gap {d['gap']:.4g} at logit {d['magnitude']:.3g} ({TIE_ULPS} ulp = {TIE_ULPS * d['ulp']:.2g})")
    r = d.get("recheck")
    if r is None:
        return f"{where}: {gap}: not rechecked"
    if r["verdict"] == "error":
        return f"{where}: {gap}: recheck failed: {r['error']}"
    alone = (f"alone in {r['dtype'].removeprefix('torch.')}: " + ("identical" if r["alone_identical"] else "diverges")
             + ("" if r["alone_reproduced"] else ", NOT the run's outputs"))
    fp32_gap = "-" if r["fp32_gap"] is None else f"{r['fp32_gap']:.4g}"
    if r["verdict"] == "decoder":
        b = r["fp32_divergence"]
        at = "" if b["gap"] is None else f", fp32 gap {b['gap']:.4g}"
        first = f"first at token {b['index']}{at}"
        return f"!!! DECODER BUG: {where}: fp32 speculative != fp32 AR ({first}); {gap}; {alone}"
    return f"{where}: numerics (fp32 speculative == fp32 AR); {gap}, fp32 gap {fp32_gap}; {alone}"


def recheck_lines(result: dict, most: int = 10) -> list[str]:
    """The table's lines for one setting's unexplained divergences (none when there are none; `most` listed)."""
    n = result.get("unexplained_divergences") or 0
    if not n:
        return []
    counts = ", ".join(f"{result[k]} {k.removeprefix('unexplained_')}" for k in COUNTS if k in result)
    head = f"{result['setting']}: {n} unexplained divergence{'s' * (n != 1)} (not a tie)"
    lines = [head + (f": {counts}" if counts else "; rerun with --recheck N to attribute them")]
    if result.get("unexplained_decoder"):
        lines[0] = "!!! " + lines[0] + " !!!"
    listed = [d for d in result["divergences"] if not d.get("tie")]
    more = [f"  (+{len(listed) - most} more in the JSON)"] if len(listed) > most else []
    return lines + ["  " + describe(d) for d in listed[:most]] + more
