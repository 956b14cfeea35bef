"""A best-draft recipe's OUT (`eyas run best-draft --out WORK`) carried between GPU sessions in parts of at most
PART_BYTES (a device call brings back ~60 MiB and carries 64 MiB), each sha256-checked, the draft's embedding left
out when it is the target's (rebuilt on unpack and checked against the packed digest).

    python lab/bd_pack.py pack --work /tmp/w/best_draft --to /tmp/bd [--data]   # parts <= 15 MiB + manifest.json
    python lab/bd_pack.py unpack --work /tmp/w/best_draft --from /tmp/bd [--target T]

pack takes state.json, the evals, the run's metrics, the best draft and, while train is not done, its latest
checkpoint; --data adds the generated rows, else unpack marks gen/prep to be redone (greedy: the same rows).
Unpack into the same --work path (train's --resume checks the prepared data's path), then rerun the recipe.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import tarfile
import time
from argparse import ArgumentParser, Namespace
from datetime import datetime, timezone
from pathlib import Path

PART_BYTES = 15 * 2**20
EMBED = "embed_tokens.weight"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def target_embedding(target: str):
    """The target's input embedding (a dir's safetensors, no model load; the export's owner of this read), or None
    (hub id, gguf: the pack keeps it)."""
    from eyas.export.writers import target_embedding as read

    return read(target)


def as_embedding(ref, cast: str, dtype: str):
    import torch

    return (ref if cast == "none" else ref.to(getattr(torch, cast))).to(getattr(torch, dtype))


def strip(data: bytes, ref) -> tuple[bytes, dict | None]:
    """Draft weights without the embedding when it is the target's under the cast training made, and that cast."""
    import torch
    from safetensors.torch import load, save

    sd = load(data)
    emb = sd.get(EMBED)
    dtype = str(getattr(emb, "dtype", "")).removeprefix("torch.")
    for cast in ("none", "bfloat16", "float16"):
        if ref is not None and emb is not None and emb.shape == ref.shape and \
                torch.equal(as_embedding(ref, cast, dtype), emb):
            rest = {k: v for k, v in sd.items() if k != EMBED}
            return save(rest, metadata={"format": "pt"}), {"cast": cast, "dtype": dtype}
    return data, None


def pack(a: Namespace) -> None:
    if not (a.work / "state.json").is_file():
        raise SystemExit(f"pack: {a.work} holds no state.json (nothing run there yet)")
    from eyas.train.checkpoint import latest_checkpoint

    st = json.loads((a.work / "state.json").read_text())
    run, ref = a.work / "run", target_embedding(a.target or st["recipe"]["target"])
    names = ["state.json", *(p.name for p in sorted(a.work.glob("eval-*.json")))]
    names += [f"run/{n}" for n in ("config.json", "metrics.jsonl", "train_config.yaml", "model.safetensors")]
    ck = None if "train" in st["done"] else latest_checkpoint(run)   # a finished run needs its draft only
    if ck:
        names += [str(p.relative_to(a.work)) for p in sorted(ck.iterdir()) if p.is_file()]
    if a.data:   # the generated rows (prep is redone from them: smaller than the prepared shards)
        names += [p.name for k in st["recipe"]["kinds"].split(",") if k != "raw" for p in a.work.glob(f"{k}.jsonl*")]
    files, digests, embeds, copies = {}, {}, {}, {}
    for n in (n for n in names if (a.work / n).is_file()):
        data = (a.work / n).read_bytes()
        digests[n] = sha(data)
        twin = next((m for m in files if digests[m] == digests[n]), None)
        if twin:   # the best draft is often the latest checkpoint's weights: stored once
            copies[n] = twin
            continue
        if n.endswith("model.safetensors"):
            data, embeds[n] = strip(data, ref)
            if embeds[n] is None:
                del embeds[n]
        files[n] = data
    a.to.mkdir(parents=True, exist_ok=True)
    tgz = a.to / "best_draft.tgz"
    with tarfile.open(tgz, "w:gz", compresslevel=1) as tar:   # fp32 weights hardly compress; rows do
        for n, data in files.items():
            info = tarfile.TarInfo(n)
            info.size, info.mtime = len(data), int(time.time())
            tar.addfile(info, io.BytesIO(data))
    parts, blob = [], tgz.read_bytes()
    tgz.unlink()
    for i in range(0, max(1, len(blob)), PART_BYTES):
        name = f"best_draft.tgz.{i // PART_BYTES:02d}"
        (a.to / name).write_bytes(blob[i:i + PART_BYTES])
        parts.append({"name": name, "bytes": len(blob[i:i + PART_BYTES]), "sha256": sha(blob[i:i + PART_BYTES])})
    man = {"work": str(a.work), "parts": parts, "total_bytes": len(blob), "sha256": sha(blob), "files": digests,
           "embedding_from_target": embeds, "copies": copies, "train_done": "train" in st["done"],
           "data": a.data, "recipe": st["recipe"],
           "packed_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    (a.to / "manifest.json").write_text(json.dumps(man, indent=1))
    print(f"[bd_pack] packed {len(files)} files into {len(parts)} parts ({len(blob) / 2**20:.1f} MiB) in {a.to}")


def unpack(a: Namespace) -> None:
    src = Path(a.src)
    if not (src / "manifest.json").is_file():
        raise SystemExit(f"unpack {src}: no manifest.json there")
    man = json.loads((src / "manifest.json").read_text())
    blob = b""
    for p in man["parts"]:
        f = src / p["name"]
        if not f.is_file():
            raise SystemExit(f"unpack {src}: part {p['name']} is missing ({len(man['parts'])} parts in the manifest)")
        data = f.read_bytes()
        if len(data) != p["bytes"] or sha(data) != p["sha256"]:
            raise SystemExit(f"unpack {src}: part {p['name']} is corrupt ({len(data)} bytes, sha256 "
                             f"{sha(data)[:12]}; the manifest says {p['bytes']} bytes, {p['sha256'][:12]}): "
                             "carry it again")
        blob += data
    if man["work"] != str(a.work):   # train's --resume checks the prepared data's path
        raise SystemExit(f"unpack: packed from --work {man['work']}; unpack into that same --work, not {a.work}")
    if (a.work / "state.json").exists():
        raise SystemExit(f"unpack: {a.work} already holds a run (state.json); unpack into an empty --work")
    a.work.mkdir(parents=True, exist_ok=True)
    target = a.target or man["recipe"]["target"]
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        tar.extractall(a.work, filter="data")
    ref = target_embedding(target) if man["embedding_from_target"] else None
    for n, e in man["embedding_from_target"].items():
        from safetensors.torch import load, save

        data = save({**load((a.work / n).read_bytes()), EMBED: as_embedding(ref, e["cast"], e["dtype"])},
                    metadata={"format": "pt"})
        if sha(data) != man["files"][n]:
            raise SystemExit(f"unpack: {n} rebuilt with {target}'s embedding differs from the packed draft "
                             f"(another target?)")
        (a.work / n).write_bytes(data)
    for n, m in man["copies"].items():
        shutil.copyfile(a.work / m, a.work / n)
    st = json.loads((a.work / "state.json").read_text())
    redo = [] if "train" in st["done"] else \
        [k for k in st["done"] if k == "prep" or k.startswith("gen:") and not (a.work / f"{k[4:]}.jsonl").is_file()]
    for k in redo:   # train's data must be here again: regenerated (greedy: the same rows) and prepared anew
        st["done"].pop(k)
        st.pop(k, None)   # "prep": its cached summary
    (a.work / "state.json").write_text(json.dumps(st, indent=1))
    print(f"[bd_pack] unpacked {len(man['files'])} files from {len(man['parts'])} parts into {a.work}"
          + (f"; to redo: {', '.join(redo)}" if redo else ""))


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--to", type=Path, required=True, help="folder for the parts and manifest.json")
    p.add_argument("--data", action="store_true", help="add the generated rows")
    p.add_argument("--target", default=None, help="default: the recipe's")
    u = sub.add_parser("unpack")
    u.add_argument("--work", type=Path, required=True)
    u.add_argument("--from", dest="src", type=Path, required=True)
    u.add_argument("--target", default=None, help="default: the recipe's")
    a = ap.parse_args(argv)
    a.work = a.work.resolve()
    (pack if a.cmd == "pack" else unpack)(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
