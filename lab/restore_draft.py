"""Rebuild a draft dir from the parts `gpu_session.sh watch` brings back (`draft.tar.NN`: bf16 weights without the
embedding, which is the target's, plus config.json and metrics.jsonl), so a later session carries ~29 MB instead of
retraining:   python lab/restore_draft.py --parts .carry/draft --target /tmp/smol-hf --out /tmp/w/run9k
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load, save_file

from eyas.export.writers import target_embedding


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=Path, required=True, help="folder holding draft.tar.00, draft.tar.01, ...")
    ap.add_argument("--target", type=Path, required=True, help="the target's HF dir (its embed_tokens)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    parts = sorted(a.parts.glob("draft.tar.*"))
    if not parts:
        sys.exit(f"{a.parts}: no draft.tar.* parts")
    tar = tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts)))
    files = {m.name.lstrip("./"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    sd = load(files["draft-bf16.safetensors"])
    emb = target_embedding(str(a.target))   # the export's owner of this read (no model load)
    if emb is None:
        sys.exit(f"{a.target}: no embed_tokens.weight in its safetensors")
    sd["embed_tokens.weight"] = emb.to(torch.bfloat16)
    a.out.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(a.out / "model.safetensors"))
    for name in ("config.json", "metrics.jsonl"):
        (a.out / name).write_bytes(files[f"run9k/{name}"])
    print(f"restored {a.out} ({len(sd)} tensors, embed_tokens from {a.target})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
