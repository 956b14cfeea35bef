"""Mark the committed eval results whose speedups were divided by a baseline read from `--baseline-cache`.

Before the cache re-timed a turn in the evaluating process, an entry's wall-clock timings were reused as they
were: a baseline timed in another process (another load, another thread count) made any speedup possible (the
scaling curve's evals of 2026-12-04 show 6.7-10x over a cached 58-60 tok/s baseline on the H200). Such a result
keeps its τ, acceptance and identity numbers (the cached tokens are the baseline's identity), but every key naming
a speedup (speedup, measured_speedup, predicted_speedup) gets the suffix `_vs_cached_baseline`, and a
`cached_baseline` note says why: nothing reads it as a speedup.

  python bench/mark_cached_speedups.py [--root bench/results] [--check]    (idempotent; --check: list, change nothing)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NOTE = ("the AR baseline of this eval was read from --baseline-cache with the timings of another process; its "
        "speedups are not measurements (renamed *speedup_vs_cached_baseline); τ, acceptance and identity stand")


def rename_speedups(x):
    """Every key naming a speedup, at any depth, renamed (its value kept)."""
    if isinstance(x, dict):
        return {(k + "_vs_cached_baseline" if k.endswith("speedup") else k): rename_speedups(v) for k, v in x.items()}
    if isinstance(x, list):
        return [rename_speedups(v) for v in x]
    return x


def cached(doc) -> bool:
    b = doc.get("baseline") if isinstance(doc, dict) else None
    return isinstance(b, dict) and isinstance(b.get("from_cache"), int) and b["from_cache"] > 0 \
        and "cache_check" not in b


def main(argv=None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--check", action="store_true", help="list what would be marked; write nothing")
    a = ap.parse_args(argv)
    marked = []
    for f in sorted(a.root.rglob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not cached(doc) or doc.get("cached_baseline") == NOTE:
            continue
        marked.append(str(f))
        if not a.check:
            doc = {"cached_baseline": NOTE, **rename_speedups(doc)}
            f.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({"marked": marked, "written": not a.check}, indent=2))
    return marked


if __name__ == "__main__":
    main()
