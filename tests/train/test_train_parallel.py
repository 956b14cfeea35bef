"""`eyas train --draft-kind p-eagle|dflash`: the same loop as EAGLE-3 (offline = online, exact resume, the RUN dir a
draft dir carrying the full config), the kind's model and objective, the mask token chosen from the data."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from eyas.config import ConfigError
from eyas.draft.io import load_draft
from eyas.train import TrainConfig, train
from eyas.vocab import unused_token
from tests.train.fakes import VOCAB, FakePrepared, FakeStore
from tests.train.test_train import assert_same_run, metrics, world  # noqa: F401 - the shared fixture

KINDS = ["p-eagle", "dflash"]


def cfg(tmp_path, kind, name="run", **kw):
    base = dict(target="tiny-llama", out=tmp_path / name, store=tmp_path / "store", draft_kind=kind, draft_layers=2,
                ttt_steps=3, batch_size=2, steps=6, lr=1e-3, eval_fraction=0.2, eval_every=3, save_every=3,
                log_every=1, seed=1, progress=False, tensorboard=False, device="cpu", mask_token_id=VOCAB - 1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("kind", KINDS)
def test_offline_equals_online(tmp_path, world, kind):
    target, rows, prepared, store = world
    train(cfg(tmp_path, kind, "off"), target=target, store=store, dataset=prepared)
    train(cfg(tmp_path, kind, "on", online=True, store=None, data=tmp_path / "prep", pad_to=32), target=target,
          dataset=prepared)
    assert_same_run(tmp_path / "off", tmp_path / "on")


@pytest.mark.parametrize("kind", KINDS)
def test_run_dir_is_a_draft_of_the_kind_and_resume_continues_exactly(tmp_path, world, kind):
    target, rows, prepared, store = world
    full = cfg(tmp_path, kind, "full", steps=8, save_every=4, eval_every=4)
    train(full, target=target, store=store, dataset=prepared)
    part = cfg(tmp_path, kind, "part", steps=8, save_every=4, eval_every=4)
    train(part, target=target, store=store, dataset=prepared)
    shutil.rmtree(part.out / "checkpoints" / "step-8")              # a crash after step 4
    kept = [m for m in metrics(part.out) if m["step"] <= 4]
    (part.out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in kept))
    train(part.model_copy(update={"resume": True}), target=target, store=store, dataset=prepared)
    for x, y in zip(metrics(full.out), metrics(part.out), strict=True):
        assert (x["split"], x["step"], x["loss"], x["acc"]) == (y["split"], y["step"], y["loss"], y["acc"])
    model, meta = load_draft(full.out)
    dc = model.config
    assert (dc.kind, dc.num_layers, dc.parallel_tokens, dc.mask_token_id) == (kind, 2, 3, VOCAB - 1)
    assert meta["train"]["draft_kind"] == kind and len(metrics(full.out)[-1]["acc"]) == 3
    ck, _ = load_draft(full.out / "checkpoints" / "step-4")
    assert ck.config.kind == kind
    with pytest.raises(ConfigError, match="--draft-kind"):
        train(part.model_copy(update={"resume": True, "draft_kind": "eagle3", "draft_layers": None}), target=target,
              store=store, dataset=prepared)


def test_training_lowers_the_loss_and_learns_depth_one(tmp_path, world):
    target, rows, prepared, store = world
    few = FakeStore(rows[:2], target)
    for kind in KINDS:
        c = cfg(tmp_path, kind, kind, steps=80, lr=1e-2, eval_fraction=0, log_every=10, save_every=1000,
                warmup_steps=5)
        train(c, target=target, store=few, dataset=FakePrepared(rows[:2], *prepared.vocab()))
        m = metrics(c.out)
        assert m[-1]["loss"] < 0.7 * m[0]["loss"] and m[-1]["acc"][0] >= 0.9, (kind, m[0], m[-1])


def test_the_default_mask_token_is_one_the_data_never_uses(tmp_path, world):
    target, rows, prepared, store = world
    freq = torch.ones(VOCAB, dtype=torch.long)
    freq[[5, 40, 90]] = 0
    (tmp_path / "store").mkdir()
    save_file({"d2t": prepared.vocab()[0], "t2d": prepared.vocab()[1], "freq": freq},
              str(tmp_path / "store" / "vocab.safetensors"))
    c = cfg(tmp_path, "dflash", steps=1, eval_fraction=0, mask_token_id=None)
    train(c, target=target, store=store, dataset=prepared)
    assert load_draft(c.out)[0].config.mask_token_id == 90 == unused_token(freq, VOCAB)
    assert unused_token(None, VOCAB) == VOCAB - 1 and unused_token(torch.ones(VOCAB), VOCAB) == VOCAB - 1
