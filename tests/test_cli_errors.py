"""Every failure a user can cause prints one line naming what and the fix, exit != 0, no traceback
(issue #17 item 13); a bug keeps its traceback."""

import json

import pytest

from eyas.cli import COMMANDS, main

USER_ERRORS = ["config", "store", "prepared", "contract", "checkpoint", "mask", "engine", "missing", "exists",
               "permission", "isdir", "disk-full", "key", "import", "unicode", "json", "recursion", "unpickling",
               "memory", "multiline", "safetensors", "oom", "cpu-oom", "safetensors-full"]


@pytest.fixture
def boom(monkeypatch):
    monkeypatch.setitem(COMMANDS, "boom", ("tests.errors_cmd", "RaiseConfig", "run", "raise an error"))


@pytest.mark.parametrize("kind", USER_ERRORS)
def test_user_errors_are_one_line(boom, capsys, kind):
    assert main(["boom", "--kind", kind]) == 1
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eyas boom: error: ") and "Traceback" not in cap.err, cap.err
    assert len(lines[0]) > len("eyas boom: error: ") + 10


def test_a_full_disk_and_an_out_of_memory_batch_say_so(boom, capsys):
    # item 13: a full disk while writing safetensors said "damaged ... run `eyas doctor`"; item 10: a CPU batch
    # out of memory was a traceback.
    main(["boom", "--kind", "safetensors-full"])
    err = capsys.readouterr().err
    assert "disk full" in err and "damaged" not in err and "resumed" not in err   # boom resumes nothing
    main(["boom", "--kind", "cpu-oom"])
    assert "out of memory" in capsys.readouterr().err


def test_os_errors_name_the_file_and_the_fix(boom, capsys):
    main(["boom", "--kind", "disk-full"])
    err = capsys.readouterr().err
    assert "/out/shard-00003.safetensors.tmp" in err and "disk full" in err and "free space" in err
    main(["boom", "--kind", "exists"])
    assert "/out/run" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["interrupt", "ctrl-c"])
def test_ctrl_c_exits_130_with_one_line(boom, capsys, kind):
    assert main(["boom", "--kind", kind]) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    if kind == "interrupt":
        assert "--resume" in lines[0]
    else:   # a bare Ctrl-C (before a stage's own handler) still says what happened and what to do
        assert "interrupted" in lines[0] and "rerun" in lines[0]


def test_a_bug_keeps_its_traceback(boom):
    with pytest.raises(ZeroDivisionError):
        main(["boom", "--kind", "bug"])


@pytest.mark.parametrize("content", ["", "\n\n", "this is not json\nat all\n", "a,b,c\n1,2,3\n", "\x00\x01\x02"])
def test_prepare_on_empty_or_non_json_input_fails_in_one_line(tmp_path, capsys, content):
    from tests.data.templates import make_target_dir

    target = make_target_dir(tmp_path / "tgt", "smollm2")
    data = tmp_path / "in.jsonl"
    data.write_text(content)
    rc = main(["prepare", "--target", str(target), "--data", str(data), "--out", str(tmp_path / "out"),
               "--workers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and str(data) in err[0]
    assert ("no rows" in err[0]) if not content.strip() else ("rejected" in err[0])


def test_export_into_the_run_itself_is_refused(tmp_path, capsys):
    # item 10: `eyas export --draft R --out R` deleted the whole training run.
    from eyas.draft.io import save_draft
    from eyas.draft.model import DraftConfig, Eagle3Draft

    run = tmp_path / "run"
    cfg = DraftConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=96, draft_vocab_size=96, target_hidden_size=32, aux_layer_ids=[1, 2, 3])
    save_draft(Eagle3Draft(cfg), run, {"target": {"name": "tiny"}})
    (run / "metrics.jsonl").write_text("{}\n")
    for out in (run, tmp_path):
        assert main(["export", "--draft", str(run), "--out", str(out), "--verifier", "tiny"]) == 1
        assert "would destroy an input" in capsys.readouterr().err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("x")
    assert main(["export", "--draft", str(run), "--out", str(mine), "--verifier", "tiny"]) == 1
    assert "thesis.txt" in capsys.readouterr().err and (mine / "thesis.txt").exists()
    assert (run / "metrics.jsonl").exists()
    exp = tmp_path / "exp"
    assert main(["export", "--draft", str(run), "--out", str(exp), "--verifier", "tiny", "--embed", "include"]) == 0
    capsys.readouterr()
    assert main(["export", "--draft", str(run), "--out", str(exp), "--verifier", "tiny", "--embed", "include"]) == 0
    assert json.loads((exp / "config.json").read_text())["eyas"]
