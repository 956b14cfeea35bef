"""End to end through the real readers: PREPARED dir -> `eyas extract` (bf16, fp8) -> `eyas train` offline
and online via the CLI, tiny target saved to disk."""

import json

import numpy as np
import pytest
import torch

from eyas.cli import main
from eyas.draft.io import load_draft


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from eyas.data.dataset import PreparedWriter, write_manifest, write_vocab
    from tests.train.fakes import save_tiny_target

    root = tmp_path_factory.mktemp("e2e")
    target = save_tiny_target(root / "target", layers=4)
    prep = root / "prep"
    prep.mkdir()
    rng = np.random.default_rng(0)
    w = PreparedWriter(prep, shard_rows=4)
    for docs in [[20, 12], [32], [9, 9, 9], [30], [16, 16], [25], [31], [12, 20]]:
        w.add([(rng.integers(0, 96, n), np.arange(n) >= n // 2) for n in docs])
    w.flush()
    freq = torch.bincount(torch.from_numpy(rng.integers(0, 96, 2000)), minlength=96)
    ids = torch.sort(torch.topk(freq, 48).indices).values
    t2d = torch.zeros(96, dtype=torch.bool)
    t2d[ids] = True
    write_vocab(prep, ids - torch.arange(48), t2d, freq)
    write_manifest(prep, {"format": "eyas-prepared", "format_version": 1, "target": {"name": "tiny", "vocab_size": 96},
                          "max_length": 32, "shards": w.shards, "summary": {"rows": 8}})
    for dt in ("bf16", "fp8"):
        assert main(["extract", "--target", str(target), "--data", str(prep), "--out", str(root / dt),
                     "--store-dtype", dt, "--device", "cpu"]) == 0
    return root, target, prep


COMMON = ["--ttt-steps", "2", "--batch-size", "2", "--steps", "4", "--eval-every", "2", "--save-every", "2",
          "--eval-fraction", "0.25", "--no-progress", "--no-tensorboard", "--device", "cpu", "--lr", "1e-3"]


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_train_offline_from_store(dirs, dtype, capsys):
    root, target, prep = dirs
    out = root / f"run-{dtype}"
    assert main(["train", "--target", str(target), "--store", str(root / dtype), "--data", str(prep),
                 "--out", str(out), *[a for a in COMMON if a != "--no-progress"]]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out)
    assert summary["mode"] == "offline" and summary["steps"] == 4 and summary["best_tau"] >= 1.0
    # progress into a log (not a terminal): plain lines with count and ETA, the loss beside them
    assert "train: 0/4 steps (0%)" in printed.err and "train: 4/4 steps (100%)" in printed.err
    assert ", done, loss " in printed.err
    model, meta = load_draft(out)
    assert model.config.draft_vocab_size == 48 and meta["aux_layer_ids"] == [0, 2, 3]
    assert (out / "checkpoints" / "step-4" / "state.pt").is_file()


def test_train_online_and_vocab_resize(dirs, capsys):
    root, target, prep = dirs
    out = root / "run-online"
    assert main(["train", "--target", str(target), "--data", str(prep), "--online", "--draft-vocab-size", "32",
                 "--out", str(out), *COMMON]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mode"] == "online"
    model, _ = load_draft(out)
    assert model.config.draft_vocab_size == 32 and int(model.t2d.sum()) == 32


def test_store_from_another_target_is_refused(dirs, tmp_path, capsys):
    root, target, prep = dirs
    from tests.train.fakes import save_tiny_target
    other = save_tiny_target(tmp_path / "other", layers=5)
    rc = main(["train", "--target", str(other), "--store", str(root / "bf16"), "--data", str(prep),
               "--out", str(tmp_path / "r"), *COMMON])
    assert rc == 1 and "different target" in capsys.readouterr().err


def eyas_lines(err):
    """eyas's own stderr lines (transformers' loading bars go to stderr too)."""
    assert "Traceback" not in err, err
    return [x for x in err.splitlines() if x.startswith("eyas ")]


def test_store_from_other_prepared_data_is_refused(dirs, tmp_path, capsys):
    # item 4: `train --data B` on a store extracted from A trained with rc 0 (same row count).
    import shutil
    root, target, prep = dirs
    other = tmp_path / "prep-b"
    shutil.copytree(prep, other)
    m = json.loads((other / "manifest.json").read_text())
    m["summary"]["note"] = "re-prepared"           # any change to the prepared set changes its fingerprint
    (other / "manifest.json").write_text(json.dumps(m))
    rc = main(["train", "--target", str(target), "--store", str(root / "bf16"), "--data", str(other),
               "--out", str(tmp_path / "r"), *COMMON])
    err = eyas_lines(capsys.readouterr().err)
    assert rc == 1 and len(err) == 1 and "other prepared data" in err[0] and "manifest_sha256" in err[0]


def test_second_train_into_the_same_out_refuses_and_ctrl_c_says_resume(dirs, tmp_path, capsys, monkeypatch):
    root, target, prep = dirs
    out = tmp_path / "run"
    args = ["train", "--target", str(target), "--store", str(root / "bf16"), "--data", str(prep), "--out", str(out),
            *COMMON]
    from eyas.train.loop import Trainer
    real = Trainer.train_step

    def step(self):
        if self.step == 3:
            raise KeyboardInterrupt   # what Ctrl-C raises in the main thread
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", step)
    assert main(args) == 130
    err = eyas_lines(capsys.readouterr().err)
    assert len(err) == 1 and "--resume" in err[0] and "step-2" in err[0]
    monkeypatch.setattr(Trainer, "train_step", real)
    metrics = (out / "metrics.jsonl").read_text()
    assert main(args) == 1                       # no silent restart over the interrupted run
    err = eyas_lines(capsys.readouterr().err)
    assert len(err) == 1 and "--resume" in err[0] and "--overwrite" in err[0]
    assert (out / "metrics.jsonl").read_text() == metrics
    assert main(args + ["--resume"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4
