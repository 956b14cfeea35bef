#!/usr/bin/env python3
"""Write a toy target dir (eyas.target.toys): python scripts/make_toy_target.py OUT [--kind kimi-k2.5|llava-llama]
[--size full|tiny] [--seed N] [--conversations N] [--overwrite]. --conversations also writes OUT.chats.jsonl, N
single-turn chats whose answers `eyas regenerate` replaces with the toy's own."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eyas.target.toys import SIZES, TOYS, build_toy, toy_conversations


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--kind", choices=TOYS, default=TOYS[0])
    ap.add_argument("--size", choices=SIZES, default=SIZES[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--conversations", type=int, default=0)
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    out = build_toy(args.out, args.kind, seed=args.seed, size=args.size, overwrite=args.overwrite)
    info = json.loads((out / "TOY.json").read_text())
    if args.conversations:
        chats = out.with_name(out.name + ".chats.jsonl")
        chats.write_text("".join(json.dumps(r) + "\n" for r in toy_conversations(args.conversations, args.seed)))
        info["conversations"] = str(chats)
    print(json.dumps({"out": str(out), **info}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
