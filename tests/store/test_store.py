"""Store round trip against the target itself, fp8 accuracy, validation errors, rank slicing + merge."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyas.data.dataset import PreparedDataset
from eyas.store import HiddenStateStore, StoreError, bytes_per_token, fp8_decode, fp8_encode, verify_store
from eyas.extract import ExtractConfig, run
from eyas.store.extract import extract_to_store, make_batches
from eyas.store.format import sha256_file, target_identity
from eyas.target import default_aux_layer_ids, load_target, target_states


@pytest.fixture(scope="module")
def target(tiny_target):
    from eyas.devices import fast_bf16

    # the dtype `eyas extract` computes in on this CPU, so API-made and CLI-made stores compare byte for byte
    return load_target(str(tiny_target), dtype=torch.bfloat16 if fast_bf16("cpu") else torch.float32)


def identity(target, name, dtype="bf16"):
    lay = target.layout
    return target_identity(name, target.config, default_aux_layer_ids(lay.num_layers), dtype,
                           hidden_size=lay.hidden_size, num_layers=lay.num_layers, vocab_size=lay.vocab_size)


@pytest.fixture(scope="module")
def bf16_store(tiny_target, prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("store") / "bf16"
    summary = run(ExtractConfig(target=str(tiny_target), data=prepared, out=out, shard_mb=0.03, token_budget=96))
    return out, summary


def test_bytes_per_token():
    assert bytes_per_token(4096, 3, "bf16") == 4 * 4096 * 2 + 9
    assert bytes_per_token(4096, 3, "fp8") == 4 * 4096 + 4 * 4 + 9
    with pytest.raises(ValueError, match="fp16"):
        bytes_per_token(8, 3, "fp16")


def test_fp8_per_token_scale_bounds_relative_error():
    # Rows of wildly different magnitude (deep residual streams grow): each keeps ~e4m3 precision.
    x = torch.randn(64, 3, 256) * torch.logspace(-3, 4, 64)[:, None, None]
    q, s = fp8_encode(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 3)
    err = (fp8_decode(q, s, torch.float32) - x).norm(dim=-1) / x.norm(dim=-1)
    assert err.max() < 0.05, err.max()


def test_make_batches_respects_budget_and_covers_rows():
    lengths = {i: n for i, n in enumerate([5, 40, 7, 33, 40, 2, 90])}
    batches = make_batches(lengths, 80)
    assert sorted(r for b in batches for r in b) == list(lengths)
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[r] for r in b) <= 80


def test_store_equals_target_states_per_row(bf16_store, prepared, target, tiny_target):
    out, summary = bf16_store
    assert summary["merged"] and summary["samples"] == 12 and summary["shards"] > 2
    ds = PreparedDataset(prepared)
    store = HiddenStateStore(out, expect=identity(target, str(tiny_target)), prepared=ds)
    assert len(store) == len(ds)
    aux_ids = store.aux_layer_ids
    for i in range(len(ds)):
        row, s = ds[i], store[i]
        assert torch.equal(s["input_ids"], row["input_ids"]) and torch.equal(s["loss_mask"], row["loss_mask"])
        assert torch.equal(s["position_ids"], row["position_ids"])
        # Reference: one row alone with an explicit document mask; the store batched it with other rows.
        aux, last, _ = target_states(target.model, target.layout, row["input_ids"][None], aux_ids,
                                     position_ids=row["position_ids"][None])
        torch.testing.assert_close(s["aux"], aux[0].to(s["aux"].dtype), atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(s["last"], last[0].to(s["last"].dtype), atol=3e-2, rtol=3e-2)
    assert verify_store(out) == []


def test_documents_in_one_row_do_not_see_each_other(bf16_store, prepared, target):
    # Row 1 packs docs of 12, 20, 8 tokens: the 2nd doc's states must equal those of the doc alone.
    out, _ = bf16_store
    store, ds, t = HiddenStateStore(out), PreparedDataset(prepared), target
    doc = ds[1]["input_ids"][12:32]
    aux, last, _ = target_states(t.model, t.layout, doc[None], store.aux_layer_ids)
    torch.testing.assert_close(store[1]["aux"][12:32], aux[0].to(store[1]["aux"].dtype), atol=3e-2, rtol=3e-2)


def test_fp8_store_close_to_bf16_and_half_the_bytes(bf16_store, tiny_target, prepared, tmp_path):
    out8 = tmp_path / "fp8"
    s8 = run(ExtractConfig(target=str(tiny_target), data=prepared, out=out8, store_dtype="fp8", shard_mb=0.03,
                           token_budget=96))
    a, b = HiddenStateStore(bf16_store[0]), HiddenStateStore(out8)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert y["aux"].dtype == torch.bfloat16
        err = (y["aux"].float() - x["aux"].float()).norm(dim=-1) / x["aux"].float().norm(dim=-1)
        assert err.max() < 0.08
    size = lambda d: sum(p.stat().st_size for p in d.glob("shard-*"))  # noqa: E731
    assert size(out8) < 0.65 * size(bf16_store[0])
    assert s8["bytes_per_token"] < bf16_store[1]["bytes_per_token"]
    assert verify_store(out8) == []


def test_expect_mismatch_names_the_key(bf16_store):
    with pytest.raises(StoreError, match="aux_layer_ids"):
        HiddenStateStore(bf16_store[0], expect={"aux_layer_ids": [1, 2, 3]})
    with pytest.raises(StoreError, match="config_hash"):
        HiddenStateStore(bf16_store[0], expect={"config_hash": "0" * 64})


def test_token_ids_checked_against_other_data(bf16_store, tmp_path):
    from storekit import ROWS, make_prepared

    other = make_prepared(tmp_path / "other", ROWS[::-1])
    store = HiddenStateStore(bf16_store[0], prepared=str(other))   # a path string works like a dataset
    with pytest.raises(StoreError, match=r"shard-\d+\.safetensors sample 0: token ids differ"):
        store[0]


def _copy_store(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst, json.loads((dst / "manifest.json").read_text())


def test_verify_store_finds_truncated_and_corrupted_shards(bf16_store, tmp_path):
    d, m = _copy_store(bf16_store[0], tmp_path / "s")
    f0, f1 = d / m["shards"][0]["file"], d / m["shards"][1]["file"]
    f0.write_bytes(f0.read_bytes()[:-100])                     # truncated
    data = bytearray(f1.read_bytes())
    data[-10] ^= 0xFF                                          # one flipped byte, same size
    f1.write_bytes(bytes(data))
    problems = verify_store(d)
    assert any(f0.name in p and "truncated" in p for p in problems)
    assert any(f1.name in p and "sha256" in p for p in problems)
    with pytest.raises(StoreError, match=f0.name):
        HiddenStateStore(d)[m["shards"][0]["first"]]


def test_nan_is_reported_with_shard_and_sample(bf16_store, tmp_path):
    d, m = _copy_store(bf16_store[0], tmp_path / "s")
    e = m["shards"][2]
    t = load_file(str(d / e["file"]))
    t["last"][int(t["offsets"][-2])] = float("nan")             # first token of the shard's last sample
    save_file(t, str(d / e["file"]))
    bad = e["first"] + e["count"] - 1
    with pytest.raises(StoreError, match=f"{e['file']}: .*manifest says"):   # the edit itself is caught first
        HiddenStateStore(d)[bad]
    e["bytes"], e["sha256"] = (d / e["file"]).stat().st_size, sha256_file(d / e["file"])
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreError, match=f"{e['file']} sample {bad}: NaN"):  # a NaN the manifest vouches for
        HiddenStateStore(d)[bad]
    assert verify_store(d) == [f"{e['file']} sample {bad}: NaN or Inf in the stored hidden states"]


def test_ranks_take_disjoint_slices_and_merge_equals_single_run(bf16_store, target, prepared, tmp_path):
    ds = PreparedDataset(prepared)
    ident = identity(target, str(target.source.name))
    out = tmp_path / "ranks"
    kw = dict(identity=ident, shard_mb=0.03, token_budget=96)
    r1 = extract_to_store(target.model, target.layout, ds, out, rank=1, world=2, **kw)
    assert not r1["merged"] and not (out / "manifest.json").exists()
    r0 = extract_to_store(target.model, target.layout, ds, out, rank=0, world=2, **kw)
    assert r0["merged"] and r0["shards_written"] + r1["shards_written"] == r0["shards"]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert {s["shard"] for s in ranks[0]["shards"]}.isdisjoint({s["shard"] for s in ranks[1]["shards"]})
    single = json.loads((bf16_store[0] / "manifest.json").read_text())
    merged = json.loads((out / "manifest.json").read_text())
    assert [s["sha256"] for s in merged["shards"]] == [s["sha256"] for s in single["shards"]]
    # A third call finds the finished store and does nothing; other settings are refused.
    assert extract_to_store(target.model, target.layout, ds, out, **kw)["status"].startswith("complete")
    with pytest.raises(StoreError, match="other settings"):
        extract_to_store(target.model, target.layout, ds, out, **{**kw, "shard_mb": 1.0})


def test_resume_with_other_settings_is_refused(target, prepared, tmp_path):
    ds = PreparedDataset(prepared)
    out = tmp_path / "s"
    kw = dict(identity=identity(target, "x"), shard_mb=0.03, token_budget=96)
    extract_to_store(target.model, target.layout, ds, out, rank=0, world=3, **kw)
    with pytest.raises(StoreError, match="rank-0.json .*different settings .*target"):
        extract_to_store(target.model, target.layout, ds, out, rank=1, world=3,
                         **{**kw, "identity": identity(target, "x", "fp8")})


def test_bad_token_id_names_the_row(target, tmp_path):
    from storekit import make_prepared

    ds = PreparedDataset(make_prepared(tmp_path / "p", [[10], [10]], vocab=500))
    ds_ids = [int(ds[i]["input_ids"].max()) for i in range(2)]
    bad_row = next(i for i, m in enumerate(ds_ids) if m >= 96)
    with pytest.raises(StoreError, match=f"prepared row {bad_row}: token id"):
        extract_to_store(target.model, target.layout, ds, tmp_path / "s", identity=identity(target, "x"))


def test_packed_batches_equal_padded_batches(bf16_store, target, prepared, tiny_target, tmp_path):
    # The flash_attention_2 layout (a batch = one row of concatenated samples) must give the same states;
    # sdpa builds the document mask from the restarting position ids.
    ds = PreparedDataset(prepared)
    s = extract_to_store(target.model, target.layout, ds, tmp_path / "p", identity=identity(target, str(tiny_target)),
                         shard_mb=0.03, token_budget=96, packed=True)
    assert s["padding_fraction"] == 0.0
    a, b = HiddenStateStore(bf16_store[0]), HiddenStateStore(tmp_path / "p")
    for i in range(len(a)):
        torch.testing.assert_close(b[i]["aux"], a[i]["aux"], atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(b[i]["last"], a[i]["last"], atol=3e-2, rtol=3e-2)


def test_nan_from_the_target_fails_the_run_naming_the_row(target, prepared, tmp_path):
    import copy

    bad = copy.deepcopy(target.model)
    from eyas.target import find_layout

    lay = find_layout(bad)
    with torch.no_grad():
        lay.layers[1].mlp.down_proj.weight.fill_(float("nan"))
    with pytest.raises(StoreError, match=r"prepared row \d+: the target produced NaN/Inf"):
        extract_to_store(bad, lay, PreparedDataset(prepared), tmp_path / "s", identity=identity(target, "x"),
                         shard_mb=0.03, token_budget=96)
    assert not list((tmp_path / "s").glob("shard-*"))
