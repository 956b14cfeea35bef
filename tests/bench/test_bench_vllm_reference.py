"""bench/vllm_reference.py: rows from a served sweep (with --gpu) or from an ar_pace run (its GPU recorded) go into
the table; an ar_pace run without its vLLM half is refused, naming the file."""

from __future__ import annotations

import json
import shutil

import pytest

from eyas.decode import vllm_reference as vr
from tests.target.fixtures import write_hf_dir

from tests.scripts import load_script


def load():
    return load_script("bench/vllm_reference.py")


def test_rows_from_an_ar_pace_run_and_a_sweep(tmp_path, capsys):
    bench, target = load(), str(write_hf_dir(tmp_path / "t"))
    table = tmp_path / "table.json"
    shutil.copy(vr.TABLE, table)
    pace = tmp_path / "pace.json"
    pace.write_text(json.dumps({"hardware": {"gpu": "NVIDIA X1"}, "batch_size": 1, "prompts": 4, "max_new_tokens": 8,
                                "vllm": {"tok_s": 123.45, "version": "0.26.0"}}))
    assert bench.main(["--ar-pace", str(pace), "--target", target, "--table", str(table)]) == 0
    rows = [r for r in vr.read_table(table) if r["gpu"] == "NVIDIA X1"]
    assert [(r["batch"], r["ar_tokens_per_s"], r["vllm"], r["spec"]) for r in rows] == [(1, 123.5, "0.26.0", {})]
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"base_tok_s": {"8": 900.0}, "engine_version": "0.26.0", "rows": [
        {"chain": 3, "batch_size": 8, "tok_s": 1000.0, "tau": 2.5}]}))
    with pytest.raises(SystemExit):
        bench.main(["--sweep", str(sweep), "--target", target, "--table", str(table)])   # no --gpu
    assert "--sweep needs --gpu" in capsys.readouterr().err
    assert bench.main(["--sweep", str(sweep), "--target", target, "--table", str(table), "--gpu", "NVIDIA X1"]) == 0
    rows = {r["batch"]: r for r in vr.read_table(table) if r["gpu"] == "NVIDIA X1"}
    assert rows[8]["spec"] == {"3": {"tau": 2.5, "tokens_per_s": 1000.0}} and rows[1]["ar_tokens_per_s"] == 123.5


def test_an_ar_pace_run_without_its_vllm_half_is_refused(tmp_path, capsys):
    bench, target = load(), str(write_hf_dir(tmp_path / "t"))
    pace = tmp_path / "pace.json"
    pace.write_text(json.dumps({"hardware": {"gpu": "NVIDIA X1"}, "eyas": {"tok_s": 1.0}}))
    with pytest.raises(SystemExit):
        bench.main(["--ar-pace", str(pace), "--target", target, "--table", str(tmp_path / "unused.json")])
    assert f"{pace}: no vLLM AR figure in it" in capsys.readouterr().err
