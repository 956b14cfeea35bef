"""bench/regen_compare.py: rows one backend dropped are named, not silently left out of the match."""

import json
from pathlib import Path

from eyas.target.toys import build_toy

ROOT = Path(__file__).resolve().parents[2]


def test_rows_only_one_backend_wrote_are_listed_beside_the_match(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import regen_compare

    target = build_toy(tmp_path / "toy", "llava-llama", size="tiny")

    def row(i, answer):
        return json.dumps({"row": i, "messages": [{"role": "user", "content": f"q{i}?"},
                                                  {"role": "assistant", "content": answer}]}) + "\n"

    # row 0: an empty answer the second backend dropped; row 3: one the first dropped; rows 1, 2 the same
    (tmp_path / "a.jsonl").write_text(row(0, "ab") + row(1, "cd") + row(2, "ef"))
    (tmp_path / "b.jsonl").write_text(row(1, "cd") + row(2, "ef") + row(3, "gh"))
    for name, written in (("a", 3), ("b", 3)):
        (tmp_path / f"{name}.log").write_text("progress\n" + json.dumps(
            {"input": 4, "written": written, "failed": 1, "turns": written, "seconds": 2.0}, indent=2) + "\n")
    assert regen_compare.main(["--target", str(target), "--pair", str(tmp_path / "a.jsonl"),
                               str(tmp_path / "b.jsonl"), "--logs", str(tmp_path / "a.log"), str(tmp_path / "b.log"),
                               "--out", str(tmp_path / "cmp.json")]) == 0
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert doc["rows_compared"] == 2 and doc["conversations_identical"] == 1.0
    assert doc["rows_only_in_a"] == [0] and doc["rows_only_in_b"] == [3]
