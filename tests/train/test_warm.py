"""train/warm.py: `eyas train --warm-only` trains a few steps of the run's shapes on stand-in rows, before the
run's data exists, and refuses what it cannot warm."""

import json

import pytest

from eyas.cli import main
from tests.data.templates import make_model_dir as tiny_target_dir


def test_warm_only_trains_a_few_steps_on_stand_in_rows(tmp_path, capsys):
    target = tiny_target_dir(tmp_path / "target")
    rc = main(["train", "--warm-only", "--online", "--target", str(target), "--out", str(tmp_path / "warm"),
               "--max-length", "64", "--draft-vocab-size", "32", "--batch-size", "2", "--ttt-steps", "2",
               "--device", "cpu"])
    assert rc == 0
    man = json.loads((tmp_path / "warm" / "prepared" / "manifest.json").read_text())
    assert man["max_length"] == 64 and man["summary"]["rows_out"] > 0   # the real data stage wrote them
    assert (tmp_path / "warm" / "run" / "model.safetensors").is_file()
    out = capsys.readouterr().out
    assert '"warm_only": true' in out and '"steps": 3' in out


@pytest.mark.parametrize("flags, says", [
    (["--max-length", "64", "--draft-vocab-size", "32"], "--online"),
    (["--online", "--draft-vocab-size", "32"], "--max-length and --draft-vocab-size"),
])
def test_warm_only_refuses_what_it_cannot_warm(tmp_path, capsys, flags, says):
    target = tiny_target_dir(tmp_path / "target")
    rc = main(["train", "--warm-only", "--target", str(target), "--out", str(tmp_path / "w"), "--device", "cpu",
               *flags])
    assert rc != 0 and says in capsys.readouterr().err
