"""Add vLLM's measured speeds for a model and GPU to eyas's table (src/eyas/decode/vllm_reference.json).

    python bench/vllm_reference.py --sweep vllm_speedup.json --target qwen2.5-coder-1.5b --gpu "NVIDIA H200"

    python bench/vllm_reference.py --ar-pace ar_pace_q15.json --target qwen2.5-coder-1.5b

`--sweep` is a bench/vllm_speedup.py result: its plain-target tokens/s per batch size become the rows'
AR figures and its chain-K rows their spec figures. `--ar-pace` is a bench/ar_pace.py result: vLLM's AR at batch
1 on the GPU it records (no spec figures). The rows are keyed by the target's architecture
(`arch_key`, read from its config alone), so `eyas eval` and the demo find them for that model on that GPU.
Rows of the same architecture, GPU, dtype, batch and vLLM version are replaced. Prints the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eyas.decode.vllm_reference import TABLE, arch_key, merge_rows, rows_from_ar_pace, rows_from_sweep
from eyas.target import load_config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--sweep", type=Path, help="a bench/vllm_speedup.py result JSON")
    src.add_argument("--ar-pace", type=Path, help="a bench/ar_pace.py result JSON (its vLLM half)")
    ap.add_argument("--target", required=True, help="the target the sweep served (built-in name, HF dir, ...)")
    ap.add_argument("--gpu", default=None, help="the GPU's name as torch.cuda.get_device_name gives it (--sweep; "
                                                 "an ar_pace result records its own)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--table", type=Path, default=TABLE)
    ap.add_argument("--source", default=None, help="where the sweep is recorded (default: --sweep's path)")
    args = ap.parse_args(argv)
    arch, given = arch_key(load_config(args.target)), args.sweep or args.ar_pace
    doc = json.loads(given.read_text())
    if args.sweep:
        if not args.gpu:
            ap.error("--sweep needs --gpu (a sweep does not record it)")
        rows = rows_from_sweep(doc, model=args.target, arch=arch, gpu=args.gpu, dtype=args.dtype,
                               source=args.source or str(given))
    else:
        rows = rows_from_ar_pace(doc, model=args.target, arch=arch, dtype=args.dtype, source=args.source or str(given))
        if not rows:
            ap.error(f"{given}: no vLLM AR figure in it (its vLLM half did not run)")
    merge_rows(args.table, rows)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
