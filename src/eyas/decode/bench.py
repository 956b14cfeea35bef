"""Evaluation prompts: Spec-Bench (built in) or any JSONL with question_id, category, turns."""

from __future__ import annotations

import json
import os
from pathlib import Path

SPEC_BENCH = "spec-bench"
_REL = Path("shared") / "data" / "spec_bench" / "question.jsonl"


def spec_bench_path() -> Path:
    """`<repo>/../shared/...` (CI clones next to shared/), then /work/shared/..., then $EYAS_SPEC_BENCH."""
    repo = Path(__file__).resolve().parents[3]
    candidates = [Path(os.environ["EYAS_SPEC_BENCH"])] if os.environ.get("EYAS_SPEC_BENCH") else []
    candidates += [repo.parent / _REL, repo / _REL, Path("/work") / _REL]
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError("Spec-Bench questions not found; looked in " + ", ".join(str(c) for c in candidates)
                            + " (set $EYAS_SPEC_BENCH or pass --bench FILE.jsonl)")


def load_bench(name_or_path: str | os.PathLike = SPEC_BENCH, categories: list[str] | None = None,
               limit: int | None = None) -> list[dict]:
    """Questions as dicts {question_id, category, turns: [str, ...]}, file order kept.
    `limit` caps the questions per category; unknown `categories` are an error naming what exists."""
    path = spec_bench_path() if str(name_or_path) == SPEC_BENCH else Path(name_or_path)
    if not path.is_file():
        raise FileNotFoundError(f"--bench {name_or_path}: no such file (use 'spec-bench' or a JSONL path)")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not JSON ({e})") from None
        for key in ("question_id", "category", "turns"):
            if key not in row:
                raise ValueError(f"{path}:{i}: missing key {key!r} (need question_id, category, turns)")
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"{path}:{i}: 'turns' must be a non-empty list of strings")
        rows.append({"question_id": row["question_id"], "category": str(row["category"]), "turns": turns})
    if categories:
        known = sorted({r["category"] for r in rows})
        unknown = sorted(set(categories) - set(known))
        if unknown:
            raise ValueError(f"{path}: unknown categories {unknown}; the file has {known}")
        rows = [r for r in rows if r["category"] in set(categories)]
    if limit is not None:
        seen: dict[str, int] = {}
        kept = []
        for r in rows:
            seen[r["category"]] = seen.get(r["category"], 0) + 1
            if seen[r["category"]] <= limit:
                kept.append(r)
        rows = kept
    if not rows:
        raise ValueError(f"{path}: no questions selected")
    return rows
