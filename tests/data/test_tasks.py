"""`tasks:PATH`: long-input task prompts over a conversations file's answers, answered by `eyas regenerate`."""

from __future__ import annotations

import json

import pytest

from eyas.data import iter_conversations
from eyas.data.prepare import PrepareConfig, prepare
from eyas.data.regenerate import RegenerateConfig, regenerate
from eyas.data.selfgen import PLACEHOLDER
from eyas.data.tasks import TEMPLATES, task_source_path, write_task_prompts


def answered(tmp_path, n: int = 12):
    """A regenerated-style file: row 3's answer is short, row 5 was never answered, row 7 has no messages."""
    rows = []
    for i in range(n):
        words = 5 if i == 3 else 60
        answer = PLACEHOLDER if i == 5 else " ".join(f"w{i}_{k}" for k in range(words))
        rows.append({"row": i, "messages": [{"role": "user", "content": f"question {i}?"},
                                            {"role": "assistant", "content": answer}]})
    rows[7] = {"row": 7, "text": "plain text, no turns"}
    p = tmp_path / "self.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_prompts_cycle_the_templates_over_long_answers_only(tmp_path):
    src, out = answered(tmp_path), tmp_path / "tasks.jsonl"
    c = write_task_prompts(src, out)
    assert (c["read"], c["written"], c["short"], c["no_answer"]) == (12, 9, 1, 2)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["row"] for r in rows] == list(range(9))   # regenerate's resume keys on these
    assert [r["task"] for r in rows] == [TEMPLATES[i % len(TEMPLATES)][0] for i in range(9)]
    assert sum(c["by_task"].values()) == 9 and 3 not in [r["from_row"] for r in rows]
    first = rows[0]["messages"]
    assert first[0]["content"].startswith("Summarize") and "w0_59" in first[0]["content"]
    assert first[1] == {"role": "assistant", "content": PLACEHOLDER}
    qa = next(r for r in rows if r["task"] == "passage_qa")["messages"][0]["content"]
    src_row = next(r for r in rows if r["task"] == "passage_qa")["from_row"]
    assert f"w{src_row}_0" in qa and qa.endswith(f"Question: question {src_row}?")
    before = out.read_bytes()
    write_task_prompts(src, out)
    assert out.read_bytes() == before                     # deterministic: a resumed run sees the same rows
    assert write_task_prompts(src, out, limit=2)["written"] == 2


def test_bad_specs_name_the_file():
    assert task_source_path("sharegpt") is None
    with pytest.raises(ValueError, match="missing.jsonl"):
        task_source_path("tasks:/nonexistent/missing.jsonl")
    with pytest.raises(ValueError, match="tasks:PATH"):
        task_source_path("tasks:")


def test_prepare_refuses_the_unanswered_spec(tmp_path):
    src = answered(tmp_path)
    with pytest.raises(ValueError, match="eyas regenerate --data tasks:"):
        prepare(PrepareConfig(target="t", data=f"tasks:{src}", out=str(tmp_path / "prep")))


class Echo:
    name = "echo"

    def generate(self, prompts):
        return [(f"answer to {p[-1]['content'][:20]}", "stop") for p in prompts]


def test_regenerate_answers_the_tasks_and_resumes(tmp_path):
    src, out = answered(tmp_path), tmp_path / "out.jsonl"
    cfg = RegenerateConfig(target="t", data=f"tasks:{src}", out=out, max_samples=4)
    s = regenerate(cfg, backend=Echo())
    assert (s["input"], s["written"]) == (4, 4) and s["task_prompts"]["written"] == 4
    s = regenerate(cfg.model_copy(update={"max_samples": None}), backend=Echo())
    assert (s["input"], s["skipped"], s["written"]) == (9, 4, 5)
    recs = list(iter_conversations(out))
    assert len(recs) == 9 and all(r.ok for r in recs)
    assert all(r.messages[1]["content"].startswith("answer to ") for r in recs)   # no placeholder left
    assert (tmp_path / "out.jsonl.task-prompts.jsonl").is_file()
