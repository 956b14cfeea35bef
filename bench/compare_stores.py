"""Two hidden-state stores of the same prepared rows, state by state (eyas.store.compare), as JSON.

    python bench/compare_stores.py HF_STORE VLLM_STORE [--reference TARGET] --out eq.json

With --reference the target is loaded in float32 and both stores are also measured against its states (the
yardstick for "within bf16 rounding"). Throughput of each extraction comes from the stage times beside it.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from eyas.store.compare import compare_stores
from eyas.store.reader import HiddenStateStore


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--reference")
    ap.add_argument("--out", required=True)
    x = ap.parse_args(argv)
    ref = None
    if x.reference:
        from eyas.target import load_target

        ref = load_target(x.reference, dtype=torch.float32, device="cuda" if torch.cuda.is_available() else "cpu")
    res = compare_stores(HiddenStateStore(x.a), HiddenStateStore(x.b), reference=ref)
    res.update(a=x.a, b=x.b, reference=x.reference)
    Path(x.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
