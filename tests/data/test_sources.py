"""Sources: ShareGPT JSON arrays (streamed), messages/text JSONL, role normalisation, bad rows as rejects."""

from __future__ import annotations

import gzip
import json

import pytest

from eyas.data import iter_conversations
from eyas.data import sources
from tests.data.templates import write_jsonl

U, A = {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}


def share(*turns, **extra):
    return {"id": "x", "conversations": list(turns), **extra}


def test_sharegpt_array_rows_and_reasons(tmp_path):
    rows = [
        share(U, A),                                                  # 0 ok
        share({"from": "system", "value": "be brief"}, U, A, U),      # 1 ok, trailing user dropped
        share(A, U, A),                                               # 2 assistant first
        share({"from": "tool", "value": "x"}, A),                     # 3 unknown role
        share(U, {"from": "gpt", "value": "   "}),                     # 4 empty turn
        share(),                                                      # 5 empty
        share(U, U, A),                                               # 6 not alternating
        share(U),                                                     # 7 no assistant
        share(U, A, {"from": "system", "value": "late"}, U, A),       # 8 misplaced system
        {"conversations": "nope"},                                    # 9 bad schema
        [1, 2],                                                       # 10 bad schema
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                      {"role": "assistant", "content": "ok"}]},       # 11 content parts
    ]
    p = tmp_path / "d.json"
    p.write_text(json.dumps(rows, indent=1))
    recs = list(iter_conversations(p))
    assert [r.row for r in recs] == list(range(len(rows)))
    assert recs[0].messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert [m["role"] for m in recs[1].messages] == ["system", "user", "assistant"]
    cats = [r.category if r.reason else "ok" for r in recs]
    assert cats == ["ok", "ok", "assistant_first", "unknown_role", "empty_turn", "empty", "not_alternating",
                    "no_assistant", "misplaced_system", "bad_schema", "bad_schema", "ok"]
    assert "'tool'" in recs[3].reason
    assert recs[11].messages[0]["content"] == "ab"
    assert all((r.messages is None) == (r.reason is not None) for r in recs)


def test_skip_leading_assistant_keeps_the_rest(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([share(A, U, A), share(A)]))
    a, b = iter_conversations(p, skip_leading_assistant=True)
    assert [m["role"] for m in a.messages] == ["user", "assistant"]
    assert b.category == "empty"


def test_streaming_across_small_chunks_and_multibyte_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "_CHUNK", 7)  # every element and many UTF-8 characters straddle chunks
    rows = [share({"from": "human", "value": "é日本語🙂" * 5}, {"from": "gpt", "value": f"{i}" * 30}) for i in range(20)]
    p = tmp_path / "d.json"
    p.write_text(json.dumps(rows, ensure_ascii=False))
    recs = list(iter_conversations(p))
    assert len(recs) == 20 and all(r.ok for r in recs)
    assert recs[3].messages[0]["content"] == "é日本語🙂" * 5


def test_truncated_array_keeps_complete_rows_and_rejects_the_rest(tmp_path):
    text = json.dumps([share(U, A)] * 3)
    p = tmp_path / "d.json"
    p.write_text(text[: len(text) - 20])  # cut inside the last element, like the packaged ShareGPT file
    recs = list(iter_conversations(p))
    assert [r.ok for r in recs] == [True, True, False]
    assert recs[2].category == "malformed_json" and recs[2].row == 2


def test_limit_counts_rejected_rows(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([share(A), share(U, A), share(U, A)]))
    assert len(list(iter_conversations(p, limit=2))) == 2


def test_jsonl_messages_text_malformed_and_non_utf8(tmp_path):
    p = tmp_path / "d.jsonl"
    write_jsonl(p, [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        "{not json",
        "",  # blank lines are not rows
        {"text": "plain pretraining text"},
        {"something": 1},
    ])
    with open(p, "ab") as f:  # a row with a raw latin-1 byte inside a string
        f.write(b'{"messages": [{"role": "user", "content": "caf\xe9"}, {"role": "assistant", "content": "x"}]}\n')
    recs = list(iter_conversations(p))
    assert [r.row for r in recs] == [0, 1, 2, 3, 4]
    assert recs[0].messages[1] == {"role": "assistant", "content": "a"}
    assert recs[1].category == "malformed_json" and "line 2" in recs[1].reason
    assert recs[2].text == "plain pretraining text"
    assert recs[3].category == "bad_schema" and "something" in recs[3].reason
    assert recs[4].category == "non_utf8"


def test_gzip_jsonl(tmp_path):
    p = tmp_path / "d.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write(json.dumps(share(U, A)) + "\n")
    (rec,) = iter_conversations(p)
    assert rec.ok and rec.messages[0]["content"] == "hi"


def test_missing_data_names_the_spec(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        list(iter_conversations(tmp_path / "nope.json"))
