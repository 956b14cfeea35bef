"""Benchmark `eyas prepare`: rows/s over the full ShareGPT file and the draft-vocabulary coverage.

    python bench/prepare.py --out bench/results/prepare.json [--workers 2] [--max-samples N]

Runs the real stage (streaming parse, chat-template masks with validation, packing, shards, vocab) into a
temporary directory, then reports the stage's own summary plus the coverage the same token counts give at
other draft-vocabulary sizes. CPU only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import typing
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
from _emit import emit  # noqa: E402

from eyas.data import PreparedDataset, build_draft_vocab
from eyas.data.prepare import PrepareConfig, prepare
from eyas.data.sources import ASSISTANT_FIRST_DEFAULT, AssistantFirst
from eyas.decode.evaluate import commit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--data", default="sharegpt")
    ap.add_argument("--max-samples", type=int, default=None, help="default: the whole file")
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--draft-vocab-size", type=int, default=32000)
    ap.add_argument("--assistant-first", choices=typing.get_args(AssistantFirst), default=ASSISTANT_FIRST_DEFAULT)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="eyas-bench-prepare-") as tmp:
        cfg = PrepareConfig(target=args.target, data=args.data, out=Path(tmp) / "prepared",
                            max_samples=args.max_samples, max_length=args.max_length,
                            draft_vocab_size=args.draft_vocab_size, assistant_first=args.assistant_first,
                            workers=args.workers, batch_size=args.batch_size)
        summary = prepare(cfg)
        freq = PreparedDataset(cfg.out).freq()
    coverage = {str(n): round(build_draft_vocab(freq, n)[2], 6) for n in (4096, 8192, 16384, 32000)}
    result = {
        "benchmark": "prepare",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "bench/prepare.py", *(argv or sys.argv[1:])]),
        "commit": (commit() or "")[:7] or None,
        "hardware": {"cpus": os.cpu_count(), "machine": platform.machine(), "processor": platform.processor(),
                     "torch_threads": torch.get_num_threads(),
                     "loadavg_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()]},  # shared machines
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "rows_per_s": summary["rows_per_s"],
        "tokens_per_s": round(summary["tokens"] / summary["seconds"], 1) if summary["seconds"] else 0.0,
        "coverage_at_draft_vocab_size": summary["coverage"],
        "coverage_by_size": coverage,
        "distinct_masked_tokens": int((freq > 0).sum()),
        "summary": summary,
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
