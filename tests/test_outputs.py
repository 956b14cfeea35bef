"""eyas.outputs on its own: the one rule every command's --out follows (resolve, protect inputs, own work vs
foreign, --overwrite, one lock, the settings/identity record)."""

import json
import shutil

import pytest

from eyas.outputs import (OutputError, claim, content_id, differences, input_id, inspect, read_record,
                          recorded_input, same_input, write_result)


def test_an_input_is_never_an_output_even_through_a_link_or_with_overwrite(tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("x\n")
    link = tmp_path / "out.jsonl"
    link.symlink_to(data)
    for out in (data, link):
        with pytest.raises(OutputError, match="is the --data"):
            claim(out, "regenerate", overwrite=True, inputs={"data": data})
    with pytest.raises(OutputError, match="holds the --data"):        # a directory holding an input
        claim(tmp_path, "prepared", overwrite=True, inputs={"data": data})
    assert data.read_text() == "x\n"


def test_foreign_things_are_refused_and_overwrite_deletes_only_eyas_files(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("years")
    with pytest.raises(OutputError, match=r"other files \(thesis.txt\), not a training run.*--overwrite"):
        claim(mine, "run")
    with pytest.raises(OutputError, match="nothing was deleted"):
        claim(mine, "run", overwrite=True)
    assert (mine / "thesis.txt").read_text() == "years"
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text(json.dumps({"format": "eyas-store"}))
    (store / "shard-00000.safetensors").write_bytes(b"x")
    with pytest.raises(OutputError, match="already holds a hidden-state store, not a training run"):
        claim(store, "run")
    with claim(store, "run", overwrite=True, settings={"lr": 1}) as held:
        assert held.existing == "free" and [p.name for p in store.iterdir()] == ["eyas-output.json"]
    with pytest.raises(OutputError, match="is a file, not a directory"):
        claim(tmp_path / "mine" / "thesis.txt", "run", overwrite=True)


def test_own_work_resumes_with_the_same_record_and_is_refused_with_another(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("rows\n")
    out = tmp_path / "o.jsonl"
    with claim(out, "regenerate", inputs={"data": data}, settings={"temperature": 0.0, "seed": 1}):
        out.write_text(json.dumps({"row": 0, "messages": []}) + "\n")
    rec = read_record(out)
    assert rec["kind"] == "regenerate" and rec["settings"] == {"seed": 1, "temperature": 0.0}
    assert recorded_input(out, "data")["sha256"] == content_id(data)
    with claim(out, "regenerate", inputs={"data": data}, settings={"temperature": 0.0, "seed": 1}) as held:
        assert held.existing == "own"
    data.write_text("other rows\n")
    with pytest.raises(OutputError, match=r"--seed 1 \(now 2\); --data .*content .*\(now .*content"):
        claim(out, "regenerate", inputs={"data": data}, settings={"temperature": 0.0, "seed": 2})
    with claim(out, "regenerate", overwrite=True, inputs={"data": data}, settings={"temperature": 0.0, "seed": 2}):
        assert not out.exists()                                  # started over
    assert read_record(out)["settings"]["seed"] == 2


def test_a_fresh_run_over_its_own_work_needs_resume_or_overwrite(tmp_path):
    run = tmp_path / "run"
    with claim(run, "run", resume=False, settings={}):
        (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(OutputError, match="pass --resume to continue it, or --overwrite"):
        claim(run, "run", resume=False, settings={})
    claim(run, "run", resume=True, settings={}).release()
    (run / "metrics.jsonl").unlink()                             # nothing of value left: free again
    assert inspect(run.resolve(), "run") == ("free", "")


def test_one_writer_per_output(tmp_path):
    held = claim(tmp_path / "store", "store", settings={})
    with pytest.raises(OutputError, match="another eyas process is writing it"):
        claim(tmp_path / "store", "store", settings={})
    held.release()
    claim(tmp_path / "store", "store", settings={}).release()


def test_inputs_are_known_by_content(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "config.json").write_text("{}")
    (a / "model.safetensors").write_bytes(bytes(range(256)) * 8192)     # 2 MiB: sampled, not read whole
    moved = shutil.copytree(a, tmp_path / "moved")
    (moved / "README.md").write_text("a card")                            # docs are not the model
    assert same_input(input_id(a), input_id(moved))
    b = bytearray((moved / "model.safetensors").read_bytes())
    b[-1] ^= 1
    (moved / "model.safetensors").write_bytes(bytes(b))
    assert not same_input(input_id(a), input_id(moved))
    assert same_input(input_id("org/model"), input_id("org/model")) and input_id("org/model")["sha256"] is None
    assert differences({"settings": {"lr": 1}, "inputs": {}}, {"settings": {"lr": 2}, "inputs": {}}) == \
        ["--lr 1 (now 2)"]
    old, new = {"settings": {"lr": 1}}, {"settings": {"lr": 1, "kind": "eagle3"}}   # a setting added since
    assert differences(old, new, {"kind": "eagle3"}) == [] and differences(old, new) == ["--kind None (now 'eagle3')"]
    assert differences(old, {"settings": {"lr": 1, "kind": "dflash"}}, {"kind": "eagle3"}) == \
        ["--kind 'eagle3' (now 'dflash')"]


def test_a_built_in_target_is_known_by_its_source_on_every_stack(tmp_path, monkeypatch):
    """The same GGUF converted on two machines: config.json carries each one's transformers version (the GPU's
    5.17, this CPU's 5.25), yet a draft trained on one must meet the same target on the other, by name or path."""
    done = {"converter": 2, "from": "22 parts, sha256 cc32", "gguf": "q.gguf", "fetch_s": 3.1,
            "convert": {"device": "cuda", "seconds": {"total": 11.9}}}
    dirs = []
    for name, version, device in (("gpu", "5.17.0", "cuda"), ("cpu", "5.25.0", "cpu")):
        d = tmp_path / name / "models" / "qwen2.5-coder-1.5b"
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "transformers_version": version}))
        (d / "model.safetensors").write_bytes(b"w" * 64)
        (d / ".complete").write_text(json.dumps({**done, "convert": {"device": device}}))
        dirs.append(d)
    assert input_id(dirs[0])["sha256"] == input_id(dirs[1])["sha256"] and same_input(input_id(dirs[0]),
                                                                                   input_id(dirs[1]))
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cpu"))       # by its built-in name: the converted dir
    assert same_input(input_id("qwen2.5-coder-1.5b"), input_id(dirs[0]))
    # a record written before (rows a session generated, a draft it trained) named the converted files' digest
    from eyas.outputs import files_id
    older = {"spec": "qwen2.5-coder-1.5b", "sha256": files_id(dirs[0])}
    assert same_input(older, input_id(dirs[0])) and not same_input(older, input_id(dirs[1]))
    (dirs[1] / ".complete").write_text(json.dumps({**done, "from": "22 parts, sha256 0000"}))   # another GGUF
    assert not same_input(input_id(dirs[0]), input_id(dirs[1]))
    (dirs[1] / ".complete").write_text(json.dumps({**done, "converter": 3}))                    # another converter
    assert not same_input(input_id(dirs[0]), input_id(dirs[1]))


def test_a_result_file_is_whole_or_absent(tmp_path):
    p = write_result(tmp_path / "r" / "eval.json", '{"a": 1}')
    assert json.loads(p.read_text()) == {"a": 1} and [x.name for x in p.parent.iterdir()] == ["eval.json"]


def test_a_stage_failing_before_it_writes_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with claim(tmp_path / "store", "store", settings={}):
            raise RuntimeError("the engine is missing")
    with pytest.raises(RuntimeError):
        with claim(tmp_path / "o.jsonl", "regenerate", settings={}):
            raise RuntimeError("no backend")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".o.jsonl.lock", ".store.lock"]
