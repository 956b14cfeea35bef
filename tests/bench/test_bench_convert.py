"""bench/convert.py on a tiny GGUF on the CPU: phases timed, every check run and passing (the GPU command is the
same script on a built-in target)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from gguf import GGMLQuantizationType as Q

from tests.target.fixtures import CHAT_TEMPLATE, tiny_qwen2, write_tiny_gguf

BENCH = Path(__file__).parents[2] / "bench" / "convert.py"


def test_convert_bench_writes_phases_and_passing_checks(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_convert", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    (tmp_path / "src").mkdir()
    gguf = write_tiny_gguf(tmp_path / "src" / "q.gguf", tiny_qwen2(seed=2), arch="qwen2", chat_template=CHAT_TEMPLATE,
                           qtypes={"token_embd.weight": Q.Q4_K, "output.weight": Q.Q6_K})
    out = tmp_path / "convert.json"
    assert bench.main(["--gguf", str(gguf), "--device", "cpu", "--out", str(out), "--write-threads", "2"]) == 0
    r = json.loads(out.read_text())
    assert set(r["convert"]["seconds"]) == {"parse", "config", "tokenizer", "dequant", "write", "total"}
    assert r["convert"]["metadata"] == "header" and r["convert"]["write_threads"] == 2
    check = r["check"]
    assert check["all_equal"] and check["header"]["equal"] and check["metadata"]["equal"]
    assert {t["type"] for t in check["tensors"]} >= {"Q4_K", "Q6_K", "F32"}
    assert r["versions"]["gguf"] and r["written_bytes"] > 0
