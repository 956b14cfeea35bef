"""Hostile input to `prepare` (issue #17 item 11): every row is kept with a valid mask or rejected with a reason,
and the run never aborts. Fixed regressions first, then a hypothesis fuzz over whole files (thousands of rows:
deep nesting, encodings, BOMs, gzip that is truncated or mislabelled, garbage bytes)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eyas.data import PreparedDataset, iter_conversations
from eyas.data.dataset import PreparedError
from eyas.data.prepare import PrepareConfig, prepare
from tests.data.templates import make_target_dir

GOOD = {"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello you"}]}


def line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def reasons(path):
    return [r.reason and r.category for r in iter_conversations(path)]


def test_deep_nesting_is_a_reject_not_a_crash(tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000
    p = tmp_path / "deep.jsonl"
    p.write_bytes(line(GOOD) + deep + b"\n" + line(GOOD))
    assert reasons(p) == [None, "too_deep", None]
    a = tmp_path / "deep.json"   # inside a top-level array the element is stepped over, the rest still reads
    a.write_bytes(b"[" + json.dumps(GOOD).encode() + b"," + b'{"x": ' + deep + b"}," + json.dumps(GOOD).encode() + b"]")
    assert reasons(a) == [None, "too_deep", None]


def test_truncated_and_mislabelled_gzip(tmp_path):
    import random
    rnd = random.Random(0)   # incompressible text, so half the stream really holds rows
    blob = gzip.compress(b"".join(line({"text": "%032x" % rnd.getrandbits(128)}) for _ in range(2000)))
    t = tmp_path / "cut.jsonl.gz"
    t.write_bytes(blob[: len(blob) // 2])
    got = reasons(t)
    assert got[-1] == "bad_gzip" and set(got[:-1]) == {None} and len(got) > 900   # the readable half is kept
    plain = tmp_path / "plain.jsonl.gz"       # not gzip at all, despite the name
    plain.write_bytes(line(GOOD) * 3)
    assert reasons(plain) == [None] * 3
    hidden = tmp_path / "hidden.jsonl"        # gzip without the suffix
    hidden.write_bytes(gzip.compress(line(GOOD) * 2))
    assert reasons(hidden) == [None] * 2


def test_bom_does_not_reject_the_first_row(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + line(GOOD) + line(GOOD))
    assert reasons(p) == [None, None]


def test_null_text_part_is_not_the_string_none(tmp_path):
    p = tmp_path / "parts.jsonl"
    p.write_bytes(line({"messages": [{"role": "user", "content": [{"type": "text", "text": None}]},
                                     {"role": "assistant", "content": "a"}]}))
    rec = next(iter_conversations(p))
    assert rec.reason and rec.category == "bad_schema"


# ---------------------------------------------------------------- the fuzz
LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12))
JSONISH = st.recursive(LEAF, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c,
                                                                                        max_size=3)), max_leaves=8)
TEXT = st.one_of(st.text(min_size=1, max_size=30), st.sampled_from(["ok", "日本語 🙂", "<|im_end|>", "\ud800", " "]))
CONTENT = st.one_of(TEXT, st.none(), st.integers(), st.lists(st.fixed_dictionaries(
    {"type": st.just("text"), "text": st.one_of(TEXT, st.none())}), max_size=2))
TURN = st.fixed_dictionaries({"from": st.sampled_from(["human", "gpt", "system", "tool", "user", "assistant"]),
                              "value": CONTENT})
ROW = st.one_of(
    st.just(GOOD),
    st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3).map(lambda p: {"conversations": [
        t for q, a in p for t in ({"from": "human", "value": q}, {"from": "gpt", "value": a})]}),
    st.fixed_dictionaries({"conversations": st.lists(TURN, max_size=5)}),
    st.fixed_dictionaries({"text": CONTENT}),
    JSONISH,
)


def encode_row(draw_row, depth: int, garbage: bytes) -> bytes:
    if depth:
        return b'{"conversations": ' + b"[" * depth + b"]" * depth + b"}"
    if garbage:
        return garbage.replace(b"\n", b" ")
    return json.dumps(draw_row).encode()


ROWS = st.lists(st.tuples(ROW, st.sampled_from([0, 0, 0, 0, 50, 5000, 100_000]),
                          st.one_of(st.just(b""), st.just(b""), st.binary(min_size=1, max_size=20))),
                min_size=1, max_size=60)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_target_dir(tmp_path_factory.mktemp("tgt"), "smollm2")


stats = {"files": 0, "rows": 0, "kept": 0}


# derandomize: the same 30 draws every run, so CI cannot flake on the non-vacuity check below (a random run once
# kept only 14 documents); widen the search locally with HYPOTHESIS settings or more examples when changing prepare.
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.data_too_large, HealthCheck.too_slow])
@given(rows=ROWS, repeat=st.integers(1, 40), array=st.booleans(), encoding=st.sampled_from(["utf-8", "utf-8-bom", "latin-1", "utf-16"]),
       packing=st.sampled_from(["plain", "gzip", "gzip-truncated", "gzip-named-plain", "plain-named-gz"]))
def test_prepare_never_aborts_and_accounts_for_every_row(tmp_path_factory, target, rows, repeat, array, encoding,
                                                         packing):
    d = tmp_path_factory.mktemp("fuzz")
    rows = rows * repeat   # thousands of rows per run without thousands of draws
    parts = [encode_row(*r) for r in rows]
    body = (b"[" + b",".join(p if p.strip() else b"null" for p in parts) + b"]") if array else b"\n".join(parts) + b"\n"
    if encoding == "utf-8-bom":
        body = b"\xef\xbb\xbf" + body
    elif encoding != "utf-8":
        body = body.decode("utf-8", "surrogateescape").encode(encoding, "replace" if encoding == "latin-1"
                                                              else "surrogatepass")
    if packing.startswith("gzip"):
        body = gzip.compress(body)
        if packing == "gzip-truncated":
            body = body[: max(10, len(body) * 2 // 3)]
    name = "in.jsonl.gz" if packing in ("gzip", "gzip-truncated", "plain-named-gz") else "in.jsonl"
    src = d / name
    src.write_bytes(body)
    cfg = PrepareConfig(target=str(target), data=str(src), out=d / "out", max_length=64, draft_vocab_size=40,
                        workers=1, batch_size=64)
    try:
        s = prepare(cfg)
    except PreparedError as e:   # nothing kept: one line, and the reasons are in rejects.jsonl
        assert "\n" not in str(e) and ("rejected" in str(e) or "no rows" in str(e))
        s = None
    rejects = [json.loads(x) for x in (d / "out" / "rejects.jsonl").read_text().splitlines()]
    assert all(r["reason"] and ":" in r["reason"] for r in rejects)
    assert len({r["row"] for r in rejects}) == len(rejects)
    stats["files"] += 1
    stats["rows"] += len(rows)
    if s is None:
        return
    assert s["rows_in"] == s["rows_out"] + s["rows_rejected"] and s["rows_rejected"] == len(rejects)
    ds = PreparedDataset(d / "out", verify=True)
    kept_docs = 0
    for i in range(len(ds)):
        r = ds[i]
        assert r["input_ids"].shape == r["loss_mask"].shape == r["position_ids"].shape
        assert int(r["input_ids"].max()) < 64 * 1024 and int(r["input_ids"].min()) >= 0
        start = 0
        for n in ds.doc_lengths(i):   # every kept document has a mask with at least one assistant token
            assert bool(r["loss_mask"][start:start + n].any())
            assert torch.equal(r["position_ids"][start:start + n], torch.arange(n))
            start += n
            kept_docs += 1
    assert kept_docs == s["rows_out"]
    stats["kept"] += kept_docs


def test_fuzz_was_not_vacuous(tmp_path_factory, target):
    if stats["files"] == 0:
        test_prepare_never_aborts_and_accounts_for_every_row(tmp_path_factory, target)
    assert stats["rows"] > 1000 and stats["kept"] > 20, stats
