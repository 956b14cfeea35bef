"""Evaluation prompts: Spec-Bench (built in) or any JSONL with question_id, category, turns."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eyas import env

SPEC_BENCH = "spec-bench"
# Shipped with eyas (Apache-2.0, hemingkx/Spec-Bench; attribution in spec_bench/NOTICE.md).
PACKAGED = Path(__file__).resolve().parent / "spec_bench" / "question.jsonl"


def spec_bench_path() -> Path:
    """$EYAS_SPEC_BENCH when set (another copy or a subset), else the 480 questions packaged with eyas."""
    given = env.get("EYAS_SPEC_BENCH")
    path = Path(given) if given else PACKAGED
    if not path.is_file():
        raise FileNotFoundError(f"Spec-Bench questions not found at {path}" + (
            " ($EYAS_SPEC_BENCH): unset it to use the packaged copy, or point it at question.jsonl" if given else
            ": the eyas installation is missing its package data; reinstall eyas, or pass --bench FILE.jsonl"))
    return path


def load_bench(name_or_path: str | os.PathLike = SPEC_BENCH, categories: list[str] | None = None,
               limit: int | None = None) -> list[dict]:
    """Questions as dicts {question_id, category, turns: [str, ...]}, file order kept.
    `limit` caps the questions per category; unknown `categories` are an error naming what exists."""
    path = spec_bench_path() if str(name_or_path) == SPEC_BENCH else Path(name_or_path)
    if not path.is_file():
        raise FileNotFoundError(f"--bench {name_or_path}: no such file (use 'spec-bench' or a JSONL path)")
    rows, seen_ids = [], {}
    # split on "\n" only: str.splitlines() also splits inside strings at U+2028/U+0085, which JSON leaves raw
    for i, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
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
        qid = row["question_id"]
        if not isinstance(qid, (str, int)) or isinstance(qid, bool):
            raise ValueError(f"{path}:{i}: question_id must be a string or an integer, got {qid!r}")
        if qid in seen_ids:   # ids key the baseline each speculative turn is compared with: two would mix
            raise ValueError(f"{path}:{i}: question_id {qid!r} repeats line {seen_ids[qid]}; make the ids unique")
        seen_ids[qid] = i
        rows.append({"question_id": qid, "category": str(row["category"]), "turns": turns})
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
