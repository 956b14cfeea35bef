"""train/checkpoint.py: the failures fault injection found (issue #17 items 1, 5, 7, 9, 13) stay fixed."""

import json
import os

import pytest
import torch

from eyas.config import ConfigError
from eyas.train import TrainConfig, train
from eyas.train.checkpoint import CheckpointError, latest_checkpoint
from tests.train.fakes import FakePrepared, FakeStore, make_rows, tiny_target, vocab_for


@pytest.fixture(scope="module")
def world():
    target = tiny_target()
    rows = make_rows(10, length=20)
    d2t, t2d = vocab_for(rows, 64)
    return target, FakePrepared(rows, d2t, t2d), FakeStore(rows, target)


def cfg(tmp_path, name="run", **kw):
    base = dict(target="tiny-llama", out=tmp_path / name, store=tmp_path / "store", ttt_steps=2, batch_size=2,
                steps=6, lr=1e-3, eval_fraction=0.2, eval_every=3, save_every=2, log_every=1, seed=1,
                keep_checkpoints=2, progress=False, tensorboard=False, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def go(c, world):
    target, prepared, store = world
    return train(c, target=target, store=store, dataset=prepared)


def log(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_crafted_state_pt_cannot_run_code_on_resume(tmp_path, world):
    # item 1: state.pt was loaded with weights_only=False; a pickle's __reduce__ ran a shell command.
    c = cfg(tmp_path)
    go(c, world)
    pwned = tmp_path / "PWNED"

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {pwned}",))

    torch.save({"optimizer": Boom(), "step": 6}, latest_checkpoint(c.out) / "state.pt")
    with pytest.raises(CheckpointError, match="state.pt: not a loadable eyas checkpoint"):
        go(c.model_copy(update={"resume": True}), world)
    assert not pwned.exists()


def test_fresh_run_into_a_finished_run_dir_is_refused(tmp_path, world):
    # item 5: the old run's step-6 counted as newest, pruning deleted the new run's checkpoints, and
    # --resume then loaded the old run and exited 0 at once.
    c = cfg(tmp_path)
    go(c, world)
    before = log(c.out)
    with pytest.raises(ConfigError, match=r"--resume to continue it, or --overwrite"):
        go(c.model_copy(update={"steps": 4}), world)
    assert log(c.out) == before  # nothing of the old run was touched
    go(c.model_copy(update={"steps": 4, "save_every": 1, "overwrite": True}), world)
    assert sorted(p.name for p in (c.out / "checkpoints").iterdir()) == ["step-3", "step-4"]
    assert max(m["step"] for m in log(c.out)) == 4


def test_leftover_tmp_checkpoint_is_no_dead_end(tmp_path, world):
    # item 7: a kill inside save_checkpoint left step-N.tmp; both --resume and a fresh run died on int('11.tmp').
    c = cfg(tmp_path, steps=4)
    go(c, world)
    (c.out / "checkpoints" / "step-11.tmp").mkdir()
    (c.out / "checkpoints" / "step-11.tmp" / "model.safetensors").write_bytes(b"half")
    (c.out / "checkpoints" / "step-backup").mkdir()  # a name that is not a step is left alone
    assert latest_checkpoint(c.out).name == "step-4"
    s = go(c.model_copy(update={"resume": True}), world)
    assert s["steps"] == 4 and not (c.out / "checkpoints" / "step-11.tmp").exists()
    (c.out / "checkpoints" / "step-7.tmp").mkdir()
    go(c.model_copy(update={"overwrite": True}), world)
    assert sorted(p.name for p in (c.out / "checkpoints").iterdir()) == ["step-2", "step-4"]


def test_disk_full_inside_save_checkpoint_keeps_the_last_checkpoint(tmp_path, world, monkeypatch):
    # item 7/13: a full disk in torch.save left step-N.tmp and a RuntimeError traceback.
    c = cfg(tmp_path)
    monkeypatch.setenv("EYAS_TRAIN_DISK_FULL_AT", "checkpoint-draft-written")
    with pytest.raises(CheckpointError, match=r"step-2: could not write .*--resume"):
        go(c, world)
    assert not list((c.out / "checkpoints").glob("*.tmp"))
    monkeypatch.delenv("EYAS_TRAIN_DISK_FULL_AT")
    go(c.model_copy(update={"overwrite": True}), world)
    assert latest_checkpoint(c.out).name == "step-6"


def test_resume_does_not_log_steps_twice(tmp_path, world):
    # item 9: metrics.jsonl repeated the steps after the last checkpoint on resume.
    full = cfg(tmp_path, "full")
    go(full, world)
    part = cfg(tmp_path, "part")
    go(part, world)
    import shutil
    shutil.rmtree(part.out / "checkpoints" / "step-6")   # as if killed between step 4's save and step 6's
    go(part.model_copy(update={"resume": True}), world)
    a, b = log(full.out), log(part.out)
    assert [(m["split"], m["step"]) for m in b] == [(m["split"], m["step"]) for m in a]
    assert [m["loss"] for m in b] == [m["loss"] for m in a]


def test_ctrl_c_says_resume(tmp_path, world, monkeypatch):
    from eyas.train.checkpoint import Interrupted
    from eyas.train.loop import Trainer

    real = Trainer.train_step

    def step(self):
        if self.step == 3:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", step)
    c = cfg(tmp_path)
    with pytest.raises(Interrupted, match="interrupted at step 3; continue from step-2 .*--resume"):
        go(c, world)
