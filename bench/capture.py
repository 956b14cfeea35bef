"""Cost of hidden-state capture: `target_states` (hooks + aux stacked to [B,T,k,H] + last) vs a plain
backbone forward of the same target, same inputs, same run.

GPU (the benchmark; Llama-3.1-8B shapes, random bf16 weights, 8 x 2048 = 16k tokens per batch):
    PYTHONPATH=src python bench/capture.py --out bench/results/capture-h200.json
CPU smoke run at tiny shapes:
    PYTHONPATH=src python bench/capture.py --tiny --threads 1 --out bench/results/capture-cpu-tiny.json

The two variants alternate rep by rep (plain, capture, plain, ...) after a warm-up, so clock and
thermal drift hit both alike; each rep is timed with CUDA events (perf_counter on CPU) and the
median is reported. Target: overhead <= 3 %.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
from _emit import emit  # noqa: E402

from eyas.target import default_aux_layer_ids, find_layout, target_states

SHAPES = {
    "llama-3.1-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    # SmolLM2-135M (the demo target): what its decode costs at a realistic KV capacity, without its weights
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    "tiny": dict(hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=512, max_position_embeddings=512),
}


def random_llama(shape: dict, device: torch.device, dtype: torch.dtype, attn: str):
    """Random weights without ever holding an fp32 copy: build on meta, allocate on the device,
    initialise in place. Rotary tables are buffers computed in __init__; to_empty leaves them
    uninitialised, so those modules are rebuilt from their config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**shape, tie_word_embeddings=False)
    cfg._attn_implementation = attn
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(dtype)
    model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0) if p.ndim == 1 else p.normal_(0.0, 0.02)
    for name, mod in list(model.named_modules()):
        if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, type(mod)(mod.config).to(device))
    return model.eval().requires_grad_(False)


class Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        """Seconds for one call of fn, device work included."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def run(args) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    shape_name = "tiny" if args.tiny else "llama-3.1-8b"
    batch = args.batch or (2 if args.tiny else 8)
    seq = args.seq or (128 if args.tiny else 2048)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = random_llama(SHAPES[shape_name], device, dtype, args.attn)
    layout = find_layout(model)
    aux_ids = default_aux_layer_ids(layout.num_layers)
    backbone = model.get_submodule(layout.paths["layers"].rpartition(".")[0])
    ids = torch.randint(0, layout.vocab_size, (batch, seq), device=device)

    def plain():
        backbone(input_ids=ids, use_cache=False)

    out = {}

    def captured():
        out["aux"], out["last"], _ = target_states(model, layout, ids, aux_ids)

    timer = Timer(device)
    with torch.no_grad():
        for _ in range(args.warmup):
            timer(plain)
            timer(captured)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = {"plain": [], "capture": []}
        for _ in range(args.reps):
            times["plain"].append(timer(plain))
            times["capture"].append(timer(captured))
    aux, last = out["aux"], out["last"]
    assert aux.shape == (batch, seq, len(aux_ids), layout.hidden_size) and last.shape == (batch, seq, layout.hidden_size)
    assert bool(torch.isfinite(aux).all()) and bool(torch.isfinite(last).all()), "non-finite captured states"
    tokens = batch * seq
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "bench": "capture",
        "shape": shape_name,
        "config": {k: v for k, v in SHAPES[shape_name].items() if not isinstance(v, dict)},
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": batch, "seq_len": seq, "tokens_per_batch": tokens, "aux_layer_ids": aux_ids,
        "dtype": str(dtype).replace("torch.", ""), "attn_implementation": args.attn,
        "cpu_threads": torch.get_num_threads() if device.type == "cpu" else None,
        "warmup": args.warmup, "reps": args.reps,
        "plain_tokens_per_s": tokens / med["plain"],
        "capture_tokens_per_s": tokens / med["capture"],
        "plain_median_s": med["plain"], "capture_median_s": med["capture"],
        "plain_s": times["plain"], "capture_s": times["capture"],
        "overhead_pct": 100.0 * (med["capture"] / med["plain"] - 1.0),
        "target_overhead_pct": 3.0,
        "captured_bytes_per_batch": aux.numel() * aux.element_size() + last.numel() * last.element_size(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    result["within_target"] = result["overhead_pct"] <= result["target_overhead_pct"]
    return result


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run)")
    p.add_argument("--batch", type=int, default=None, help="rows per batch (default 8; tiny 2)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 2048; tiny 128)")
    p.add_argument("--reps", type=int, default=10, help="timed reps per variant (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed reps per variant first")
    p.add_argument("--attn", default="sdpa", help="attention implementation: sdpa | flash_attention_2 | eager")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None, help="default bf16 on GPU, fp32 on CPU")
    p.add_argument("--device", default=None, help="default cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (1 is fastest on a busy CPU)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON result here too")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    return emit(run(args), args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
