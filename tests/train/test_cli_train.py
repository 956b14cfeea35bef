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


# ---------------------------------------------------------------- the RUN dir is owned (eyas.outputs)
def _one_line(capsys):
    err = eyas_lines(capsys.readouterr().err)
    assert len(err) == 1, err
    return err[0]


def test_train_into_the_target_dir_is_refused_and_leaves_it_whole(dirs, tmp_path, capsys):
    import shutil
    root, target, prep = dirs
    t = shutil.copytree(target, tmp_path / "t")
    before = {p.name: p.read_bytes() for p in t.iterdir()}
    for extra in ([], ["--overwrite"]):
        rc = main(["train", "--target", str(t), "--store", str(root / "bf16"), "--data", str(prep), "--out", str(t),
                   *COMMON, *extra])
        assert rc == 1 and "is the --target" in _one_line(capsys)
    assert {p.name: p.read_bytes() for p in t.iterdir()} == before


def test_store_of_another_target_with_the_same_config_is_refused(dirs, tmp_path, capsys):
    # item 6: the store check compared only the config hash; B's weights gave states A never makes.
    from tests.train.fakes import save_tiny_target
    root, target, prep = dirs
    other = save_tiny_target(tmp_path / "b", layers=4, seed=7)          # same config, other weights
    rc = main(["train", "--target", str(other), "--store", str(root / "bf16"), "--data", str(prep),
               "--out", str(tmp_path / "r"), *COMMON])
    assert rc == 1 and "was extracted from target" in _one_line(capsys)
    assert not (tmp_path / "r" / "checkpoints").exists()
    assert main(["doctor", "--target", str(other), "--store", str(root / "bf16")]) == 1     # doctor says so too
    assert "other weights give other hidden states" in capsys.readouterr().out


@pytest.mark.parametrize("change", [["--warmup-steps", "3"], ["--min-lr-ratio", "0.5"], ["--weight-decay", "0.5"],
                                    ["--step-decay", "0.5"], ["--target", "B"]])
def test_resume_with_other_settings_or_target_is_refused(dirs, tmp_path, capsys, change):
    import shutil
    from tests.train.fakes import save_tiny_target
    root, target, prep = dirs
    out = tmp_path / "run"
    args = ["train", "--target", str(target), "--store", str(root / "bf16"), "--data", str(prep), "--out", str(out),
            *COMMON]
    assert main(args) == 0
    capsys.readouterr()
    if change[0] == "--target":   # the same config and path names, other weights: B copied over A's place
        b = tmp_path / "b"
        shutil.copytree(target, b)
        save_tiny_target(tmp_path / "b2", layers=4, seed=7)
        shutil.copy(tmp_path / "b2" / "model.safetensors", b / "model.safetensors")
        change = ["--target", str(b)]
    cfg_before = (out / "train_config.yaml").read_text()
    rc = main([*args, "--resume", *change])
    line = _one_line(capsys)
    assert rc == 1 and "started with other settings" in line and change[0] in line
    assert (out / "train_config.yaml").read_text() == cfg_before


def test_two_runs_on_one_out_the_second_is_refused(dirs, tmp_path, capsys):
    from eyas.outputs import claim
    root, target, prep = dirs
    out = tmp_path / "run"
    with claim(out, "run"):                  # a run with another seed holds it
        rc = main(["train", "--target", str(target), "--store", str(root / "bf16"), "--data", str(prep),
                   "--out", str(out), *COMMON, "--seed", "3"])
    assert rc == 1 and "another eyas process is writing it" in _one_line(capsys)
    assert not (out / "metrics.jsonl").exists()


def test_a_diverging_run_stops_with_one_line_and_saves_no_nan(dirs, tmp_path, capsys, monkeypatch):
    # item 4: --lr 100 (or a target emitting NaN) saved a "best" draft full of NaN with exit 0.
    from eyas.train.loop import Trainer
    root, target, prep = dirs
    out = tmp_path / "run"
    real = Trainer.train_step

    def step(self):
        st, n = real(self)
        if self.step == 3:
            st = st * float("nan")           # what a target emitting NaN gives the loss
        return st, n

    monkeypatch.setattr(Trainer, "train_step", step)
    rc = main(["train", "--target", str(target), "--store", str(root / "bf16"), "--data", str(prep),
               "--out", str(out), *COMMON])
    line = _one_line(capsys)
    assert rc == 1 and "training diverged at step 3" in line and "step-2" in line
    assert not (out / "checkpoints" / "step-4").exists()
    from safetensors.torch import load_file
    for f in [out / "model.safetensors", *out.glob("checkpoints/*/model.safetensors")]:
        assert all(torch.isfinite(v).all() for v in load_file(str(f)).values() if v.is_floating_point())


def test_weights_made_non_finite_by_an_update_are_never_saved(dirs, tmp_path, capsys, monkeypatch):
    from eyas.train.loop import Trainer
    root, target, prep = dirs
    out = tmp_path / "run"
    real = Trainer.train_step

    def step(self):
        res = real(self)
        if self.step == 2:
            with torch.no_grad():
                self.draft.fc.weight.fill_(float("inf"))   # the step's loss was finite; its update was not
        return res

    monkeypatch.setattr(Trainer, "train_step", step)
    rc = main(["train", "--target", str(target), "--store", str(root / "bf16"), "--data", str(prep),
               "--out", str(out), *COMMON])
    line = _one_line(capsys)
    assert rc == 1 and "training diverged at step 2" in line and "fc.weight" in line
    assert not (out / "checkpoints").exists() or not list((out / "checkpoints").iterdir())


def test_online_refuses_a_changed_shard_and_an_id_past_the_vocabulary(dirs, tmp_path, capsys):
    # item 9: online training trained on a shard whose checksum no longer matched; an id past the vocabulary
    # was an IndexError mid-epoch.
    import shutil
    root, target, prep = dirs
    p = shutil.copytree(prep, tmp_path / "p")
    shard = sorted(p.glob("rows-*.safetensors"))[0]
    b = bytearray(shard.read_bytes())
    b[-8] ^= 0x5A
    shard.write_bytes(bytes(b))
    args = ["train", "--target", str(target), "--data", str(p), "--online", "--out", str(tmp_path / "r"), *COMMON]
    assert main(args) == 1 and "sha256" in _one_line(capsys)

    from safetensors.numpy import load_file, save_file
    from eyas.data.dataset import sha256_file
    q = shutil.copytree(prep, tmp_path / "q")
    shard = sorted(q.glob("rows-*.safetensors"))[0]
    t = load_file(str(shard))
    t["input_ids"][3] = 500                                   # past the target's 96 tokens
    save_file(t, str(shard))
    m = json.loads((q / "manifest.json").read_text())
    m["shards"][0]["sha256"] = sha256_file(shard)             # a consistent dataset, made for another tokenizer
    (q / "manifest.json").write_text(json.dumps(m))
    args = ["train", "--target", str(target), "--data", str(q), "--online", "--out", str(tmp_path / "r2"), *COMMON]
    assert main(args) == 1 and "outside the target vocabulary" in _one_line(capsys)


@pytest.mark.parametrize("flag", [["--steps", "-5"], ["--max-length", "-4"], ["--eval-batches", "-1"],
                                  ["--tau-chain", "-2"], ["--warmup-steps", "-1"]])
def test_flags_without_sense_are_refused(dirs, tmp_path, capsys, flag):
    root, target, prep = dirs
    rc = main(["train", "--target", str(target), "--store", str(root / "bf16"), "--out", str(tmp_path / "r"),
               *flag])
    err = capsys.readouterr().err
    assert rc == 2 and flag[0] in err and "greater than or equal" in err
    assert not (tmp_path / "r").exists()


def test_a_state_pt_whose_step_is_not_an_integer_is_one_line(dirs, tmp_path, capsys):
    from eyas.train.checkpoint import latest_checkpoint
    root, target, prep = dirs
    out = tmp_path / "run"
    args = ["train", "--target", str(target), "--store", str(root / "bf16"), "--data", str(prep), "--out", str(out),
            *COMMON]
    assert main(args) == 0
    capsys.readouterr()
    ck = latest_checkpoint(out) / "state.pt"
    st = torch.load(ck, weights_only=True)
    torch.save({**st, "step": "four"}, ck)
    assert main([*args, "--resume"]) == 1
    line = _one_line(capsys)
    assert "step is a str" in line and "weights_only" not in line
    torch.save({"optimizer": object.__new__(torch.nn.Identity)}, ck)      # not tensors and containers
    assert main([*args, "--resume"]) == 1
    line = _one_line(capsys)
    assert "not a loadable eyas checkpoint" in line and "weights_only" not in line
