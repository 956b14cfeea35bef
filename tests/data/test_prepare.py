"""`eyas prepare` end to end on a tiny in-process target: packing, positions, overlong policy, rejects, vocab."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from eyas.cli import main
from eyas.data import PreparedDataset, PreparedError, check_draft_vocab, render_with_mask
from eyas.data.prepare import PrepareConfig, prepare
from tests.data.templates import make_target_dir, make_tokenizer


def conv(i: int, n_turns: int = 1, long: int = 1) -> dict:
    turns = []
    for t in range(n_turns):
        turns += [{"from": "human", "value": f"question {i}.{t} " + "why? " * (i % 3)},
                  {"from": "gpt", "value": f"answer {i}.{t} " + "the quick brown fox " * long}]
    return {"id": f"c{i}", "conversations": turns}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_target_dir(tmp_path_factory.mktemp("tgt"), "smollm2")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rows = [conv(i, n_turns=1 + i % 3) for i in range(24)]
    rows[5] = {"id": "bad", "conversations": [{"from": "gpt", "value": "I start"}]}
    rows[9] = conv(9, long=60)  # ~300+ tokens: overlong at max_length 128
    p = tmp_path_factory.mktemp("data") / "d.json"
    p.write_text(json.dumps(rows))
    return p


def source_messages(data) -> dict[int, list]:
    """Normalised messages of the fixture's valid rows, by row number (row 5 is the rejected one)."""
    roles = {"human": "user", "gpt": "assistant"}
    return {i: [{"role": roles[t["from"]], "content": t["value"]} for t in r["conversations"]]
            for i, r in enumerate(json.loads(data.read_text())) if i != 5}


def run_prepare(target, data, out, **kw):
    return prepare(PrepareConfig(target=str(target), data=str(data), out=out, **kw))


def test_rows_are_valid_packed_documents(target, data, tmp_path):
    s = run_prepare(target, data, tmp_path / "p", max_length=128, draft_vocab_size=64, assistant_first="reject")
    ds = PreparedDataset(tmp_path / "p", verify=True)
    assert s["rows_in"] == 24 and s["rows_out"] + s["rows_rejected"] == 24
    tok = make_tokenizer("smollm2")
    lengths = {i: len(render_with_mask(tok, m)[0]) for i, m in source_messages(data).items()}
    assert lengths[9] > 128  # the planted long conversation
    assert s["rejected_by_reason"] == {"assistant_first": 1} and s["truncated"] == sum(n > 128 for n in lengths.values())
    assert len(ds) == s["packed_rows"] < s["rows_out"]  # several conversations per row
    docs_seen, tokens, masked = 0, 0, 0
    freq = torch.zeros(len(tok), dtype=torch.int64)
    for i in range(len(ds)):
        row = ds[i]
        ids, mask, pos = row["input_ids"], row["loss_mask"], row["position_ids"]
        assert ids.dtype == torch.int64 and mask.dtype == torch.bool and pos.dtype == torch.int64
        assert ids.shape == mask.shape == pos.shape and 0 < len(ids) <= 128
        lengths = ds.doc_lengths(i)
        assert sum(lengths) == len(ids)
        starts = np.cumsum([0] + lengths[:-1])
        assert (pos == 0).nonzero().flatten().tolist() == starts.tolist()  # positions restart per document
        for a, n in zip(starts, lengths):
            assert mask[a:a + n].any()  # every document keeps at least one assistant token
        freq += torch.bincount(ids[mask], minlength=len(tok))
        docs_seen += len(lengths)
        tokens += len(ids)
        masked += int(mask.sum())
    assert docs_seen == s["rows_out"] and tokens == s["tokens"] and masked == s["masked_tokens"]
    assert torch.equal(ds.freq(), freq)
    d2t, t2d = ds.vocab()
    assert d2t.numel() == 64 == s["draft_vocab_size"] and t2d.numel() == len(tok)
    assert check_draft_vocab(d2t, t2d) == []
    assert s["coverage"] == pytest.approx(float(freq[t2d].sum()) / float(freq.sum()), abs=1e-6)
    assert ds.manifest["target"]["vocab_size"] == len(tok)
    rejects = ds.rejects()
    assert rejects == [{"row": 5, "id": "bad", "reason": rejects[0]["reason"]}]
    assert rejects[0]["reason"].startswith("assistant_first")


def test_assistant_first_rows_lose_their_leading_turn_by_default_in_prepare_and_regenerate(target, tmp_path):
    """One default for every stage (sources.ASSISTANT_FIRST_DEFAULT): prepare rejected rows opening with the
    assistant where regenerate skipped those turns, and a raw ShareGPT curve lost 6,900 of 17,671 rows."""
    from eyas.data.regenerate import RegenerateConfig

    split = {"id": "part2", "conversations": [{"from": "gpt", "value": "...the end of an earlier answer."},
                                              {"from": "human", "value": "And then?"},
                                              {"from": "gpt", "value": "Then it rained."}]}
    data = tmp_path / "d.json"
    data.write_text(json.dumps([conv(0), split]))
    s = run_prepare(target, data, tmp_path / "p", max_length=4096, pack=False)
    assert s["rows_out"] == 2 and s["rows_rejected"] == 0
    ds = PreparedDataset(tmp_path / "p")
    kept = [{"role": "user", "content": "And then?"}, {"role": "assistant", "content": "Then it rained."}]
    want = list(render_with_mask(make_tokenizer("smollm2"), kept)[0])
    assert any(ds[i]["input_ids"].tolist() == want for i in range(len(ds)))   # from its user turn on
    s = run_prepare(target, data, tmp_path / "r", max_length=4096, pack=False, assistant_first="reject")
    assert s["rejected_by_reason"] == {"assistant_first": 1}
    assert RegenerateConfig(target="t", data="d", out=tmp_path / "o").assistant_first == \
        PrepareConfig(target="t", data="d", out=tmp_path / "o").assistant_first == "skip"


def test_unpacked_rows_match_render_with_mask(target, data, tmp_path):
    s = run_prepare(target, data, tmp_path / "p", max_length=4096, pack=False)
    ds = PreparedDataset(tmp_path / "p")
    assert len(ds) == s["rows_out"] == 23 and s["truncated"] == 0
    tok = make_tokenizer("smollm2")
    rendered = {j: render_with_mask(tok, m) for j, m in source_messages(data).items()}
    seen = set()
    for i in range(len(ds)):
        got = ds[i]
        for j, (ids, mask) in rendered.items():  # packing reorders documents; find this one's source
            if torch.equal(ids, got["input_ids"]):
                assert torch.equal(mask, got["loss_mask"])
                assert got["position_ids"].tolist() == list(range(len(ids)))
                seen.add(j)
                break
        else:
            pytest.fail(f"row {i} matches no source conversation")
    assert len(seen) == 23


def test_drop_policy_rejects_overlong(target, data, tmp_path):
    s = run_prepare(target, data, tmp_path / "p", max_length=128, overlong="drop")
    tok = make_tokenizer("smollm2")
    n_long = sum(len(render_with_mask(tok, m)[0]) > 128 for m in source_messages(data).values())
    assert s["truncated"] == 0 and s["rejected_by_reason"]["overlong"] == n_long > 0
    assert s["rows_out"] == 23 - n_long
    assert all(len(PreparedDataset(tmp_path / "p")[i]["input_ids"]) <= 128 for i in range(s["packed_rows"]))


def test_rerun_reuses_and_refuses_to_clobber(target, data, tmp_path):
    out = tmp_path / "p"
    first = run_prepare(target, data, out, max_length=256)
    again = run_prepare(target, data, out, max_length=256)
    assert again["reused"] is True and again["tokens"] == first["tokens"]
    with pytest.raises(ValueError, match="--overwrite"):
        run_prepare(target, data, out, max_length=128)
    third = run_prepare(target, data, out, max_length=128, overwrite=True)
    assert third.get("reused") is None and PreparedDataset(out).manifest["max_length"] == 128


def test_workers_give_identical_output(target, data, tmp_path):
    run_prepare(target, data, tmp_path / "a", max_length=128, batch_size=4, workers=1)
    run_prepare(target, data, tmp_path / "b", max_length=128, batch_size=4, workers=2)
    a, b = PreparedDataset(tmp_path / "a"), PreparedDataset(tmp_path / "b")
    assert len(a) == len(b)
    for i in range(len(a)):
        assert all(torch.equal(a[i][k], b[i][k]) for k in a[i])
    # byte-identical shards (deterministic headers), so the manifests' checksums agree
    assert [s["sha256"] for s in a.manifest["shards"]] == [s["sha256"] for s in b.manifest["shards"]]


def test_cli_json_summary(target, data, tmp_path, capsys):
    rc = main(["prepare", "--target", str(target), "--data", str(data), "--out", str(tmp_path / "p"),
               "--max-length", "128", "--draft-vocab-size", "32", "--max-samples", "10", "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out)
    for key in ("rows_in", "rows_out", "rows_rejected", "rejected_by_reason", "tokens", "masked_tokens",
                "draft_vocab_size", "coverage"):
        assert key in s
    assert s["rows_in"] == 10 and s["draft_vocab_size"] == 32


def test_text_rows_are_fully_masked(target, tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"text": "The quick brown fox jumps over the lazy dog."}) + "\n")
    s = run_prepare(target, p, tmp_path / "p", max_length=128)
    row = PreparedDataset(tmp_path / "p")[0]
    assert s["rows_out"] == 1 and bool(row["loss_mask"].all())


def test_reader_errors_name_the_problem(target, data, tmp_path):
    with pytest.raises(PreparedError, match="manifest.json"):
        PreparedDataset(tmp_path)
    run_prepare(target, data, tmp_path / "p", max_length=128)
    (tmp_path / "p" / "rows-00000.safetensors").unlink()
    with pytest.raises(PreparedError, match="rows-00000.safetensors"):
        PreparedDataset(tmp_path / "p")


@pytest.mark.slow
def test_real_sharegpt_with_smollm2(tmp_path):
    """The packaged ShareGPT file through the real SmolLM2 tokenizer: every kept row's masks validate."""
    s = prepare(PrepareConfig(target="smollm2-135m", data="sharegpt", out=tmp_path / "p", max_samples=300))
    assert s["rows_in"] == 300 and s["rows_out"] > 250
    assert set(s["rejected_by_reason"]) <= {"empty", "empty_turn", "no_assistant", "not_alternating", "overlong",
                                            "special_token_in_content", "misplaced_system"}
    ds = PreparedDataset(tmp_path / "p")
    row = ds[0]
    assert len(row["input_ids"]) <= 2048 and row["loss_mask"].any()
    d2t, t2d = ds.vocab()
    assert d2t.numel() == 32000 and t2d.numel() == 49152 and check_draft_vocab(d2t, t2d) == []


def test_crashed_run_leftovers_are_replaced(target, data, tmp_path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "rows-00000.safetensors.tmp").write_bytes(b"partial")  # a run killed mid-shard, no manifest
    assert run_prepare(target, data, out, max_length=128)["rows_in"] == 24
    (out / "notes.txt").write_text("mine")
    (out / "manifest.json").unlink()
    with pytest.raises(ValueError, match="other files"):
        run_prepare(target, data, out, max_length=128)
