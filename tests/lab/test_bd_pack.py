"""lab/bd_pack.py: a best-draft recipe's OUT carried between GPU sessions in sha256-checked parts, the draft's
embedding left out when it is the target's and rebuilt on unpack; a bad or missing part is named."""

import io
import json
import tarfile

import pytest
import torch
from safetensors.torch import load as load_weights, save_file

from tests.data.templates import make_tokenizer

from tests.scripts import load_script


def load():
    return load_script("lab/bd_pack.py")


def half_trained(tmp_path, twin):
    """An OUT cut in training: the target's bf16 embedding in fp32 in the draft (as training on a GPU makes it),
    the best draft = the latest checkpoint's weights (twin) or older ones, generated rows on disk."""
    torch.manual_seed(0)
    target = tmp_path / "target"
    target.mkdir()
    emb = torch.randn(50, 8).to(torch.bfloat16)
    save_file({"model.embed_tokens.weight": emb, "lm_head.weight": torch.randn(50, 8)},
              str(target / "model.safetensors"))
    make_tokenizer("smollm2").save_pretrained(target)
    w = tmp_path / "w"
    ck = w / "run" / "checkpoints" / "step-400"
    ck.mkdir(parents=True)
    draft = {"embed_tokens.weight": emb.float(), "fc.weight": torch.randn(8, 24), "lm_head.weight": torch.randn(20, 8)}
    save_file(draft, str(ck / "model.safetensors"), metadata={"format": "pt"})
    if twin:
        (w / "run" / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes())
    else:
        save_file({**draft, "fc.weight": torch.randn(8, 24)}, str(w / "run" / "model.safetensors"),
                  metadata={"format": "pt"})
    old = w / "run" / "checkpoints" / "step-200"   # an older checkpoint: not packed
    old.mkdir()
    (old / "state.pt").write_bytes(b"old")
    torch.save({"step": 400, "optimizer": {"m": torch.randn(100)}}, ck / "state.pt")
    (ck / "config.json").write_text("{}")
    (w / "run" / "metrics.jsonl").write_text(json.dumps({"split": "eval", "step": 400, "tau": 2.0}) + "\n")
    (w / "regen.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    (w / "state.json").write_text(json.dumps({
        "done": {"gen:regen": 10.0, "prep": 2.0}, "started": ["gen:regen", "prep", "train"], "prep": {"tokens": 1},
        "seconds_total": 12.0, "recipe": {"plan": "best-draft", "target": str(target), "kinds": "regen"}}))
    return w


@pytest.mark.parametrize("twin", [True, False])
def test_pack_unpack_round_trip_and_a_bad_part_is_named(tmp_path, twin, monkeypatch):
    mod = load()
    w = half_trained(tmp_path, twin)
    st = json.loads((w / "state.json").read_text())
    monkeypatch.setattr(mod, "PART_BYTES", 1000)   # several parts from a small run
    pk = tmp_path / "pk"
    assert mod.main(["pack", "--work", str(w), "--to", str(pk), "--data"]) == 0
    man = json.loads((pk / "manifest.json").read_text())
    assert len(man["parts"]) >= 2 and all(p["bytes"] <= 1000 for p in man["parts"])
    assert sum(p["bytes"] for p in man["parts"]) == man["total_bytes"]
    # the embedding is the target's bf16 one in fp32: left out, rebuilt on unpack; the twin weights stored once
    stripped = ["run/model.safetensors"] + ([] if twin else ["run/checkpoints/step-400/model.safetensors"])
    assert man["embedding_from_target"] == {n: {"cast": "none", "dtype": "float32"} for n in stripped}
    assert man["copies"] == ({"run/checkpoints/step-400/model.safetensors": "run/model.safetensors"} if twin else {})
    assert "run/checkpoints/step-200/state.pt" not in man["files"] and "regen.jsonl" in man["files"]
    blob = b"".join((pk / p["name"]).read_bytes() for p in man["parts"])
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == sorted(set(man["files"]) - set(man["copies"]))
        for n in stripped:
            assert set(load_weights(tar.extractfile(n).read())) == {"fc.weight", "lm_head.weight"}
    files = {n: (w / n).read_bytes() for n in man["files"]}

    w.rename(tmp_path / "w-old")
    unpack = ["unpack", "--work", str(w), "--from", str(pk)]
    assert mod.main(unpack) == 0
    assert {n: (w / n).read_bytes() for n in man["files"] if n != "state.json"} == \
        {n: b for n, b in files.items() if n != "state.json"}
    st2 = json.loads((w / "state.json").read_text())
    assert st2["done"] == {"gen:regen": 10.0} and "prep" not in st2   # rows carried; prep is redone from them
    assert st2["seconds_total"] == 12.0 and st2["recipe"] == st["recipe"] and "train" in st2["started"]
    assert not (w / "run" / "checkpoints" / "step-200").exists()

    with pytest.raises(SystemExit, match="already holds a run"):
        mod.main(unpack)
    (w / "state.json").unlink()
    with pytest.raises(SystemExit, match="unpack into that same --work"):
        mod.main(["unpack", "--work", str(tmp_path / "elsewhere"), "--from", str(pk)])
    part = pk / man["parts"][1]["name"]
    part.write_bytes(part.read_bytes()[:-1] + b"\0")
    with pytest.raises(SystemExit, match=f"part {part.name} is corrupt"):
        mod.main(unpack)
    part.unlink()
    with pytest.raises(SystemExit, match=f"part {part.name} is missing"):
        mod.main(unpack)
