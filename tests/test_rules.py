"""One owner per shared rule: every stage that takes a value refuses a bad one with the owner's words, before
any weight loads. The target here is a config + tokenizer dir (no weights) and the drafts' weight files are
unreadable where the rule lives in config.json, so a stage that reached for weights would fail differently."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyas.cli import main
from eyas.data.dataset import VOCAB as VOCAB_FILE
from tests.doctor.test_doctor import VOCAB, llama_config, make_draft, write_target

UNSORTED = ["4", "2", "3"]                       # every id in range for the 6-layer target: only the order is wrong
SORTED_RULE = "must be strictly increasing"
OUT_OF_RANGE = ["1", "99"]
RANGE_RULE = "[99] out of range: the target has 6 decoder layers"
VOCAB_RULE = "t2d: marks"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("rules")
    target = write_target(root / "target", llama_config())          # config + tokenizer, no weights
    good = make_draft(root / "draft")                                 # aux (2, 3, 4), draft vocab 40
    # A draft whose config lists its aux ids unsorted (and whose weights cannot be read at all).
    unsorted = root / "unsorted"
    unsorted.mkdir()
    doc = json.loads((good / "config.json").read_text())
    doc["draft"]["aux_layer_ids"] = [4, 2, 3]
    (unsorted / "config.json").write_text(json.dumps(doc))
    (unsorted / "model.safetensors").write_bytes(b"not weights")
    # A draft whose t2d marks one target id more than d2t maps.
    bad_vocab = root / "bad-vocab"
    bad_vocab.mkdir()
    (bad_vocab / "config.json").write_text((good / "config.json").read_text())
    sd = load_file(str(good / "model.safetensors"))
    sd["t2d"][int(torch.nonzero(~sd["t2d"])[0])] = True
    save_file(sd, str(bad_vocab / "model.safetensors"))
    # A PREPARED dir with the same broken vocabulary.
    prep = root / "prep"
    prep.mkdir()
    freq = torch.ones(VOCAB, dtype=torch.int64)
    save_file({"d2t": sd["d2t"], "t2d": sd["t2d"], "freq": freq}, str(prep / VOCAB_FILE))
    (prep / "manifest.json").write_text(json.dumps(
        {"format": "eyas-prepared", "format_version": 1, "target": {"name": "tiny", "vocab_size": VOCAB},
         "max_length": 16, "shards": [], "summary": {"rows": 0, "tokens": 0}}))
    from eyas.export import export_vllm

    export = export_vllm(good, root / "export", verifier=target)
    bad_export = root / "bad-export"          # a published draft with the same broken map, for `eyas import`
    bad_export.mkdir()
    for f in export.iterdir():
        (bad_export / f.name).write_bytes(f.read_bytes())
    ex = load_file(str(bad_export / "model.safetensors"))
    ex["t2d"] = sd["t2d"]
    save_file(ex, str(bad_export / "model.safetensors"))
    return {"root": root, "target": target, "good": good, "export": export, "bad_export": bad_export, "unsorted": unsorted, "bad_vocab": bad_vocab, "prep": prep}


def _run(argv, capsys):
    """(exit code, stdout + stderr) of `eyas ARGV`, argparse exits included."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_unsorted_aux_ids_are_refused_by_every_stage(world, capsys, tmp_path):
    t, out = world["target"], str(tmp_path / "o")
    flag = ["--aux-layer-ids", *UNSORTED]
    runs = {
        "extract": ["extract", "--target", t, "--data", str(world["prep"]), "--out", out, "--device", "cpu", *flag],
        "train": ["train", "--target", t, "--store", out, "--out", out, "--device", "cpu", *flag],
        "doctor": ["doctor", "--target", t, *flag],
        "import": ["import", "--src", str(world["export"]), "--out", out, *flag],
        # doctor --draft, export and eval read the ids from the draft's config.json
        "doctor --draft": ["doctor", "--target", t, "--draft", str(world["unsorted"])],
        "export": ["export", "--draft", str(world["unsorted"]), "--out", out],
        "eval": ["eval", "--target", t, "--draft", str(world["unsorted"]), "--device", "cpu"],
    }
    for stage, argv in runs.items():
        rc, text = _run(argv, capsys)
        assert rc in (1, 2), (stage, rc, text)
        assert f"[4, 2, 3] {SORTED_RULE} (no repeats)" in text and "use [2, 3, 4]" in text, (stage, text)
        assert "Traceback" not in text and "safetensors" not in text.lower(), (stage, text)


def test_out_of_range_aux_ids_are_refused_by_every_stage_that_takes_them(world, capsys, tmp_path):
    t, out = world["target"], str(tmp_path / "o")
    flag = ["--aux-layer-ids", *OUT_OF_RANGE]
    runs = {
        "extract": ["extract", "--target", t, "--data", str(world["prep"]), "--out", out, "--device", "cpu", *flag],
        "train": ["train", "--target", t, "--data", str(world["prep"]), "--online", "--out", out, "--device", "cpu",
                  *flag],
        "doctor": ["doctor", "--target", t, *flag],
        "import": ["import", "--src", str(world["export"]), "--out", out, "--target", t, *flag],
    }
    for stage, argv in runs.items():
        rc, text = _run(argv, capsys)
        assert rc == 1, (stage, rc, text)
        assert RANGE_RULE in text, (stage, text)


def test_an_inconsistent_draft_vocab_is_refused_by_every_stage(world, capsys, tmp_path):
    t, out = world["target"], str(tmp_path / "o")
    runs = {
        "train": ["train", "--target", t, "--data", str(world["prep"]), "--online", "--out", out, "--device", "cpu"],
        "doctor": ["doctor", "--target", t, "--data", str(world["prep"])],
        "doctor --draft": ["doctor", "--target", t, "--draft", str(world["bad_vocab"])],
        "export": ["export", "--draft", str(world["bad_vocab"]), "--out", out],
        "eval": ["eval", "--target", t, "--draft", str(world["bad_vocab"]), "--device", "cpu"],
        "import": ["import", "--src", str(world["bad_export"]), "--out", out, "--target", t],
    }
    for stage, argv in runs.items():
        rc, text = _run(argv, capsys)
        assert rc == 1, (stage, rc, text)
        assert f"{VOCAB_RULE} 41 target ids but d2t maps 40 draft ids" in text, (stage, text)


def test_a_zero_draft_vocab_size_is_refused_by_every_command_that_takes_it(world, capsys, tmp_path):
    t, out = world["target"], str(tmp_path / "o")
    runs = {
        "prepare": ["prepare", "--target", t, "--data", "x.jsonl", "--out", out],
        "train": ["train", "--target", t, "--store", out, "--out", out],
        "doctor": ["doctor", "--target", t],
        "demo": ["demo", "--out", out],
    }
    for stage, argv in runs.items():
        rc, text = _run(argv + ["--draft-vocab-size", "0"], capsys)
        assert rc == 2 and "draft-vocab-size" in text.replace("_", "-") and "greater than or equal to" in text, (stage, text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_device_cuda_without_cuda_is_one_line_in_every_command(world, capsys, tmp_path):
    t, out = world["target"], str(tmp_path / "o")
    runs = {
        "extract": ["extract", "--target", t, "--data", str(world["prep"]), "--out", out],
        "train": ["train", "--target", t, "--store", out, "--out", out],
        "eval": ["eval", "--target", t, "--draft", str(world["good"])],
        "regenerate": ["regenerate", "--target", t, "--data", "x.jsonl", "--out", out],
        "demo": ["demo", "--out", out],
    }
    for stage, argv in runs.items():
        rc, text = _run(argv + ["--device", "cuda"], capsys)
        lines = text.strip().splitlines()
        assert rc == 1 and len(lines) == 1, (stage, text)
        assert lines[0].startswith(f"eyas {stage}: error: --device cuda: torch ") and "no CUDA GPU" in lines[0], text


def test_old_dtype_spellings_are_refused_by_every_command(capsys):
    for cmd in ("train", "eval", "regenerate", "export", "serve-check"):
        rc, text = _run([cmd, "--dtype", "bfloat16"], capsys)
        assert rc == 2 and "invalid choice: 'bfloat16'" in text, (cmd, text)
    for cmd in ("extract", "doctor"):
        rc, text = _run([cmd, "--store-dtype", "fp16"], capsys)
        assert rc == 2 and "invalid choice: 'fp16'" in text, (cmd, text)
