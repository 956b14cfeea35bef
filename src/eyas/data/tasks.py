"""Long-input task prompts made from the target's own answers (`tasks:PATH`), for users with no dataset.

Self-written prompts (selfgen.py) are one-line questions, so a draft trained on them alone never sees the target
read a long input back: on Spec-Bench its summarization, translation and QA-over-a-passage tau fall well below a
draft that also saw re-answered ShareGPT rows (BENCHMARKS.md, draft quality vs data). This source turns
each answered conversation of PATH (e.g. the regenerated `self:N` output) into one task over its first answer: the
answer is the passage, a template (picked round-robin by row, so the mix is even and reproducible) is the
instruction, and for question answering the row's own first question is asked back. `eyas regenerate --data
tasks:PATH` writes these prompts next to its output and answers them like any other source: the target's answers,
not the template's, are what the draft learns.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from eyas.data.selfgen import PLACEHOLDER
from eyas.data.sources import iter_conversations

LANGUAGES = ("French", "Spanish", "German")

# (name, instruction with {passage} / {question} / {language}): one task per Spec-Bench long-input category
TEMPLATES: tuple[tuple[str, str], ...] = (
    ("summarize", "Summarize the following text in a few sentences.\n\n{passage}"),
    ("key_points", "List the key points of the text below as short bullet points.\n\n{passage}"),
    ("translate", "Translate the following text into {language}.\n\n{passage}"),
    ("passage_qa", "Answer the question using only the passage below.\n\nPassage:\n{passage}\n\nQuestion: {question}"),
    ("simplify", "Rewrite the following text so that a ten-year-old can understand it.\n\n{passage}"),
)


def task_source_path(spec: str | os.PathLike) -> Path | None:
    """PATH for the `tasks:PATH` source, else None; a missing file is an error naming it."""
    s = str(spec)
    if not s.startswith("tasks:"):
        return None
    path = Path(s[6:]).expanduser()
    if not s[6:] or not path.is_file():
        raise ValueError(f"data {s!r}: write tasks:PATH with PATH an answered conversations file "
                         f"(e.g. the output of `eyas regenerate --data self:N`); {str(path)!r} is not a file")
    return path


def task_prompt(row: int, question: str, passage: str) -> tuple[str, str]:
    """(task name, user prompt) of source row `row`: the template and language cycle with the row."""
    name, text = TEMPLATES[row % len(TEMPLATES)]
    language = LANGUAGES[(row // len(TEMPLATES)) % len(LANGUAGES)]
    return name, text.format(passage=passage.strip(), question=question.strip(), language=language)


def write_task_prompts(src: Path, out: Path, limit: int | None = None, min_words: int = 40) -> dict:
    """One task prompt per conversation of `src` whose first answer has >= min_words words (shorter ones make no
    long input), at most `limit`, into `out` (messages JSONL: one user turn and a placeholder answer). Deterministic,
    so rewriting it on a resumed run gives the same rows, which is what regenerate's resume keys on."""
    counts = {"read": 0, "written": 0, "short": 0, "no_answer": 0, "by_task": {name: 0 for name, _ in TEMPLATES}}
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in iter_conversations(src):
            if limit is not None and counts["written"] >= limit:
                break
            counts["read"] += 1
            msgs = rec.messages or []
            q = next((m["content"] for m in msgs if m["role"] == "user"), None)
            a = next((m["content"] for m in msgs if m["role"] == "assistant" and m["content"] != PLACEHOLDER), None)
            if not q or not a:
                counts["no_answer"] += 1
                continue
            if len(a.split()) < min_words:
                counts["short"] += 1
                continue
            name, prompt = task_prompt(counts["written"], q, a)
            f.write(json.dumps({"row": counts["written"], "source": "tasks", "task": name, "from_row": rec.row,
                                "messages": [{"role": "user", "content": prompt},
                                             {"role": "assistant", "content": PLACEHOLDER}]},
                               ensure_ascii=False) + "\n")
            counts["written"] += 1
            counts["by_task"][name] += 1
    tmp.replace(out)
    return counts
