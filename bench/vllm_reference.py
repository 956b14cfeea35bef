"""Add vLLM's measured speeds for a model and GPU to eyas's table (src/eyas/decode/vllm_reference.json).

    python bench/vllm_reference.py --sweep vllm_speedup.json --target qwen2.5-coder-1.5b --gpu "NVIDIA H200"

`--sweep` is a bench/vllm_speedup.py result: its plain-target tokens/s per batch size become the rows'
AR figures and its chain-K rows their spec figures. The rows are keyed by the target's architecture
(`arch_key`, read from its config alone), so `eyas eval` and the demo find them for that model on that GPU.
Rows of the same architecture, GPU, dtype, batch and vLLM version are replaced. Prints the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eyas.decode.vllm_reference import TABLE, arch_key, merge_rows, rows_from_sweep
from eyas.target import load_config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", type=Path, required=True, help="a bench/vllm_speedup.py result JSON")
    ap.add_argument("--target", required=True, help="the target the sweep served (built-in name, HF dir, ...)")
    ap.add_argument("--gpu", required=True, help="the GPU's name as torch.cuda.get_device_name gives it")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--table", type=Path, default=TABLE)
    ap.add_argument("--source", default=None, help="where the sweep is recorded (default: --sweep's path)")
    args = ap.parse_args(argv)
    sweep = json.loads(args.sweep.read_text())
    rows = rows_from_sweep(sweep, model=args.target, arch=arch_key(load_config(args.target)), gpu=args.gpu,
                           dtype=args.dtype, source=args.source or str(args.sweep))
    merge_rows(args.table, rows)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
