"""What `eyas eval` prints: the human summary of an eval's result dict (the JSON has everything)."""

from __future__ import annotations

from eyas.decode import vllm_reference
from eyas.decode.divergence import recheck_lines


def table(out: dict) -> str:
    """The human summary: one row per decode setting, then τ by category (the JSON has everything)."""
    ref, hw = out.get("vllm_reference"), out.get("hardware", {})
    rows = [("setting", "τ", "accept by position", "tok/s", "AR tok/s", "speedup", *(("vs vLLM AR",) if ref else ()),
             "identical")]
    b = out.get("baseline") or {}
    mark = "*" if b.get("from_cache") else ""
    for r in out["results"]:
        ident = r.get("identical_rate")
        vs = (_x(r["speedup_vs_vllm_ar"]),) if ref else ()
        rows.append((r["setting"], f"{r['tau']:.3f}", " ".join(f"{a:.2f}" for a in r["accept_per_position"]),
                     f"{r['tokens_per_s']:.1f}", f"{r['baseline_tokens_per_s']:.1f}{mark}", _x(r["speedup"]), *vs,
                     "-" if ident is None else f"{ident:.2f}"))
    cats = sorted({c for r in out["results"] for c in r["per_category"]})
    lines = [f"{out['questions']} questions from {out['bench']}, target {out['target']}, draft {out['draft']}", ""]
    lines += _columns(rows) + [vllm_reference.reference_line(ref, hw.get("gpu") or hw.get("device"))]
    lines += [line for line in [baseline_line(b)] if line]
    lines += [line for r in out["results"] for line in [time_line(r)] if line] + [""]
    crow = [("category",) + tuple(r["setting"] for r in out["results"])]
    crow += [(c,) + tuple(f"{r['per_category'][c]['tau']:.2f}" if c in r["per_category"] else "-"
                          for r in out["results"]) for c in cats]
    lines += ["τ by category:"] + _columns(crow)
    rechecks = [line for r in out["results"] for line in recheck_lines(r)]
    if rechecks:
        lines += [""] + rechecks
    if out.get("plots"):
        lines += ["", "plots: " + ", ".join(out["plots"])]
    return "\n".join(lines)


def time_line(r: dict) -> str:
    """Where a setting's time went, per turn and per round (ms): a turn's start against the AR's prefill."""
    t, turns, steps = r.get("time_s") or {}, len(r.get("turns") or []), r.get("steps") or 0
    parts = t.get("prefill_parts")
    if not (turns and steps and parts):
        return ""
    ms = lambda x, n: f"{1e3 * x / n:.1f}"   # noqa: E731
    return (f"{r['setting']}: a turn's start {ms(t['prefill'], turns)} ms (target prefill {ms(parts['target'], turns)}, "
            f"draft catch-up {ms(parts['catchup'], turns)}, first tree {ms(parts['first_tree'], turns)}; the AR's "
            f"prefill {ms(t.get('baseline_prefill', 0.0), turns)}), a round {ms(t['draft'] + t['verify'], steps)} ms "
            f"(draft {ms(t['draft'], steps)}, verify {ms(t['verify'], steps)})")


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def baseline_line(b: dict) -> str:
    """Where the AR baseline came from, when it was not simply decoded here."""
    check = b.get("cache_check") or {}
    if check.get("shared"):
        return (f"* AR baseline: {b['from_cache']} of {b['turns']} turns from the cache {b.get('cache')} (tokens only: "
                f"this eval shared the device)" if check.get("used") else
                f"AR baseline: timed here; the cached one was timed while other work shared the device")
    again = ", ".join(f"{t['question_id']}/{t['turn']}" for t in check.get("turns", []))
    if b.get("from_cache"):
        return (f"* AR baseline: {b['from_cache']} of {b['turns']} turns from the cache {b.get('cache')}; their timings "
                f"held when this process timed turns {again} again (at most {check.get('apart', 0):.0%} apart)")
    if check:
        why = "other tokens" if not check.get("same_tokens") else f"up to {check.get('apart', 0):.0%} apart"
        return f"AR baseline: timed here; the cached one was not used (its turns {again} timed again here: {why})"
    return ""


def _columns(rows: list[tuple]) -> list[str]:
    w = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(f"{str(c):<{w[i]}}" for i, c in enumerate(r)).rstrip() for r in rows]
