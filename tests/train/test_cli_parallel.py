"""The parallel drafters through the CLI, on the real readers: `eyas train --draft-kind` offline (store) and online
(PREPARED), then `eyas eval` (chain and tree, greedy identical to the target), `eyas export`, `eyas import`, and
`eyas doctor` on the export."""

import json

import pytest

from eyas.cli import main
from eyas.draft.io import load_draft
from tests.train.test_cli_train import COMMON, dirs  # noqa: F401 - the shared fixture


@pytest.mark.parametrize("kind, mode", [("p-eagle", "offline"), ("dflash", "online")])
def test_train_eval_export_import(dirs, kind, mode, capsys, tmp_path):
    root, target, prep = dirs
    out = tmp_path / "run"
    src = ["--store", str(root / "bf16")] if mode == "offline" else ["--online"]
    assert main(["train", "--target", str(target), "--data", str(prep), "--out", str(out), "--draft-kind", kind,
                 "--draft-layers", "2", *src, *COMMON]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mode"] == mode and summary["steps"] == 4
    model, meta = load_draft(out)
    assert model.config.kind == kind and model.config.parallel_tokens == 2 and meta["train"]["draft_kind"] == kind
    bench = tmp_path / "bench.jsonl"
    bench.write_text("\n".join(json.dumps({"question_id": i, "category": "c", "turns": [f"t{i} t5 t9 t{i + 3}"]})
                               for i in range(3)))
    res = tmp_path / "eval.json"
    assert main(["eval", "--target", str(target), "--draft", str(out), "--bench", str(bench), "--max-new-tokens", "12",
                 "--chain", "2", "--tree", "total=4,depth=2,topk=2", "--device", "cpu", "--out", str(res)]) == 0
    doc = json.loads(res.read_text())
    assert [r["identical_rate"] for r in doc["results"]] == [1.0, 1.0] and all(r["tau"] >= 1 for r in doc["results"])
    capsys.readouterr()
    exp = tmp_path / "export"
    assert main(["export", "--draft", str(out), "--out", str(exp)]) == 0
    cfg = json.loads((exp / "config.json").read_text())
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
    assert main(["import", "--src", str(exp), "--out", str(tmp_path / "back")]) == 0
    assert load_draft(tmp_path / "back")[0].config.kind == kind
    capsys.readouterr()
    assert main(["doctor", "--target", str(target), "--draft", str(exp), "--json"]) in (0, 1)
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks[f"draft: {kind} hand-over"]["status"] == "pass"
    assert checks["draft vs target"]["status"] == "pass", checks["draft vs target"]["detail"]
