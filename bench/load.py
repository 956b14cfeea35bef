"""Target load time vs the disk: an 8B-shape random bf16 safetensors checkpoint (about 16 GB, sharded) written
to local disk, the disk's sequential read bandwidth measured on it (dd with O_DIRECT, page cache bypassed),
then `load_target` to the device cold (page cache dropped) and warm, and transformers' from_pretrained warm
for comparison. Goal: cold load >= 70 % of the measured read bandwidth.

  PYTHONPATH=src python bench/load.py --out bench/results/load-h200.json     # GPU, ~16 GB in /tmp (--dir)
  PYTHONPATH=src python bench/load.py --tiny --out /tmp/load-tiny.json       # CPU smoke run

Cold cache: `echo 3 > /proc/sys/vm/drop_caches` (root) after sync; if that is not allowed, posix_fadvise
DONTNEED on every shard (drops clean pages without root); the JSON says which one worked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
from _emit import emit  # noqa: E402

LLAMA_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                tie_word_embeddings=False)
TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, max_position_embeddings=512, tie_word_embeddings=False)


def write_checkpoint(d: Path, shape: dict, shard_bytes: int, device: torch.device) -> int:
    """Random bf16 weights of a Llama of `shape` as HF sharded safetensors + config + a one-word tokenizer."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    cfg = LlamaConfig(**shape)
    cfg.architectures = ["LlamaForCausalLM"]
    with torch.device("meta"):
        meta = LlamaForCausalLM(cfg)
    shapes = {k: v.shape for k, v in meta.state_dict().items()}
    d.mkdir(parents=True, exist_ok=True)
    shards, cur, size = [], {}, 0
    g = torch.Generator(device=device).manual_seed(0)
    for k, s in shapes.items():
        t = torch.randn(s, generator=g, device=device, dtype=torch.float32).mul_(0.02).to(torch.bfloat16).cpu()
        if cur and size + t.numel() * 2 > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = t
        size += t.numel() * 2
    shards.append(cur)
    weight_map, total = {}, 0
    for i, sd in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sd, str(d / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in sd})
        total += sum(t.numel() * 2 for t in sd.values())
        print(f"[bench/load] wrote {name}", flush=True)
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                 "weight_map": weight_map}))
    cfg.dtype = torch.bfloat16
    cfg.save_pretrained(d)
    tok = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(d)
    os.sync()
    return total


def drop_cache(files: list[Path], how: str = "auto") -> str:
    os.sync()
    try:
        if how != "auto":
            raise OSError(0, "not tried (--drop fadvise)")
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError as e:
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return f"posix_fadvise DONTNEED (drop_caches not allowed: {e.strerror or e})"


def disk_read_bw(files: list[Path]) -> dict:
    """Sequential read MB/s of the shards with O_DIRECT (dd), one file after the other, then all at once."""
    def dd(f):
        return subprocess.Popen(["dd", f"if={f}", "of=/dev/null", "bs=16M", "iflag=direct"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    nbytes = sum(f.stat().st_size for f in files)
    out = {}
    try:
        t0 = time.perf_counter()
        for f in files:
            p = dd(f)
            if p.wait() != 0:
                raise OSError(p.stderr.read().decode().strip())
        out["dd_sequential_mb_per_s"] = round(nbytes / (time.perf_counter() - t0) / 1e6, 1)
        t0 = time.perf_counter()
        procs = [dd(f) for f in files]
        if any(p.wait() != 0 for p in procs):
            raise OSError("parallel dd failed")
        out["dd_parallel_mb_per_s"] = round(nbytes / (time.perf_counter() - t0) / 1e6, 1)
    except (OSError, FileNotFoundError) as e:
        out["dd_error"] = str(e)[:300]
    return out


def buffered_read_bw(files: list[Path], how: str) -> float:
    """MB/s of reading the shards once through the page cache, after dropping it (when dd cannot O_DIRECT)."""
    drop_cache(files, how)
    t0 = time.perf_counter()
    n = 0
    buf = bytearray(64 << 20)
    for f in files:
        with open(f, "rb", buffering=0) as h:
            while (k := h.readinto(buf)):
                n += k
    return round(n / (time.perf_counter() - t0) / 1e6, 1)


def fs_type(d: Path) -> str:
    try:
        return subprocess.run(["stat", "-f", "-c", "%T", str(d)], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (smoke run)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/eyas-bench-load"), help="checkpoint dir (local disk)")
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--workers", type=int, default=16, help="parallel reader threads")
    ap.add_argument("--no-hf", action="store_true", help="skip the from_pretrained comparison")
    ap.add_argument("--drop", choices=["auto", "fadvise"], default="auto",
                    help="auto: drop_caches when root, else fadvise; fadvise: only this checkpoint's pages")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint (reused by the next run)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)

    from eyas.target import load_target
    from eyas.target.fastload import safetensors_files

    device = torch.device(a.device or ("cpu" if a.tiny or not torch.cuda.is_available() else "cuda"))
    shape = TINY if a.tiny else LLAMA_8B
    shard_bytes = int((0.0002 if a.tiny else a.shard_gb) * 2**30)
    d = a.dir
    t0 = time.perf_counter()
    if not (d / "model.safetensors.index.json").is_file():
        shutil.rmtree(d, ignore_errors=True)
        write_checkpoint(d, shape, shard_bytes, device)
    write_s = time.perf_counter() - t0
    files = safetensors_files(d)
    nbytes = sum(f.stat().st_size for f in files)
    res = {"bench": "load", "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "shape": "tiny" if a.tiny else "llama-3.1-8b", "dir": str(d),
           "filesystem": fs_type(d), "shards": len(files), "bytes": nbytes, "write_s": round(write_s, 2),
           "workers": a.workers}
    print(f"[bench/load] {len(files)} shards, {nbytes / 1e9:.2f} GB in {d} ({res['filesystem']})", flush=True)
    res["cache_drop"] = drop_cache(files, a.drop)
    res.update(disk_read_bw(files))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(fn):
        if device.type == "cuda":
            torch.cuda.empty_cache()
        sync()
        t = time.perf_counter()
        m = fn()
        sync()
        dt = time.perf_counter() - t
        ok = all(p.device.type == device.type for p in m.parameters())
        del m
        return round(dt, 3), ok

    def fast():
        return load_target(d, dtype=torch.bfloat16, device=device).model

    res["cache_drop"] = drop_cache(files, a.drop)
    res["fast_cold_s"], on_dev = timed(fast)
    res["fast_warm_s"], _ = timed(fast)
    res["all_params_on_device"] = on_dev
    res["fast_cold_mb_per_s"] = round(nbytes / res["fast_cold_s"] / 1e6, 1)
    res["fast_warm_mb_per_s"] = round(nbytes / res["fast_warm_s"] / 1e6, 1)
    if "dd_sequential_mb_per_s" not in res:
        res["buffered_read_mb_per_s"] = buffered_read_bw(files, a.drop)
    disk = res.get("dd_sequential_mb_per_s") or res.get("buffered_read_mb_per_s")
    if disk:
        res["cold_frac_of_disk"] = round(res["fast_cold_mb_per_s"] / disk, 3)
    print(f"[bench/load] fast load cold {res['fast_cold_s']} s, warm {res['fast_warm_s']} s; disk {disk} MB/s",
          flush=True)
    if not a.no_hf:
        res["from_pretrained_warm_s"], _ = timed(lambda: load_target(d, dtype=torch.bfloat16, device=device,
                                                                     fast=False).model)
    if not a.keep:
        shutil.rmtree(d, ignore_errors=True)
    return emit(res, a.out)


if __name__ == "__main__":
    main(sys.argv[1:])
