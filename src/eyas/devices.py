"""Device and dtype: one vocabulary for every command's flags, one rule for resolving them.

dtype values, across all commands: auto | bf16 | fp16 | fp32 | fp8 (a command takes the subset that means
something for it: fp8 only for the hidden-state store, export has no fp8). `auto` = bf16 on a GPU, fp32 on
a CPU. Device values: auto | cpu | cuda | cuda:N (auto = cuda[:LOCAL_RANK] when this torch has CUDA, else
cpu). A device this torch cannot use fails in one line naming the fix, before anything loads.
torch is imported inside the resolvers so that configs (and `eyas --help`) stay light.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Literal

if TYPE_CHECKING:
    import torch

DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8")          # the whole vocabulary
Dtype = Literal["auto", "bf16", "fp16", "fp32"]           # weights / compute of a model
StoreDtype = Literal["bf16", "fp8"]                       # hidden states on disk (see eyas.store.format)
# The one dtype table: eyas name -> (torch's and the engines' spelling, bytes per element).
DTYPE_TABLE = {"bf16": ("bfloat16", 2), "fp16": ("float16", 2), "fp32": ("float32", 4), "fp8": ("float8_e4m3fn", 1)}
TORCH_NAMES = {k: v for k, (v, _) in DTYPE_TABLE.items() if k != "fp8"}  # model dtypes as engines (vLLM) spell them
DEVICE_HELP = "auto, cpu, cuda or cuda:N (auto: cuda[:LOCAL_RANK] when available, else cpu)"
DTYPE_HELP = "auto (bf16 on GPU, fp32 on CPU), bf16, fp16 or fp32"


class DeviceError(ValueError):
    """A --device this torch cannot use (one line, with the fix)."""


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def dist_env() -> tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) as torchrun sets them; (0, 1, 0) in a plain process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), local_rank()


def resolve_device(spec: str | None = "auto", rank: int | None = None) -> "torch.device":
    """`--device` -> torch.device. "cuda" without an index means this process's GPU (LOCAL_RANK under torchrun)."""
    import torch

    spec = (spec or "auto").strip()
    rank = local_rank() if rank is None else rank
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(spec)
    except (RuntimeError, ValueError):
        raise DeviceError(f"--device {spec!r}: not a device; use {DEVICE_HELP}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = f"torch {torch.__version__}" + (" (a CPU-only build)" if torch.version.cuda is None else "")
            raise DeviceError(f"--device {spec}: {build} sees no CUDA GPU; use --device cpu (or auto), or "
                              f"install a CUDA build of torch on a machine with a GPU")
        if dev.index is None:
            dev = torch.device("cuda", rank)
        if dev.index >= torch.cuda.device_count():
            raise DeviceError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) visible "
                              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    return dev


def resolve_dtype(name: str, device: "torch.device | str") -> "torch.dtype":
    """`--dtype` -> torch.dtype for a model on `device` (auto: bf16 on GPU, fp32 elsewhere)."""
    import torch

    if name == "auto":
        kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
        return torch.bfloat16 if kind == "cuda" else torch.float32
    if name not in TORCH_NAMES:
        raise ValueError(f"dtype {name!r}: choose one of {', '.join(DTYPES[:-1])}")
    return getattr(torch, TORCH_NAMES[name])


def fast_bf16(device: "torch.device | str") -> bool:
    """Whether bf16 matmuls are native on `device`: GPUs, and CPUs with AMX / AVX512-BF16 (~1.7x faster than fp32
    there). Elsewhere CPU bf16 is emulated and many times slower than fp32 (29 vs ~1,600 tok/s for SmolLM2 on a
    2-core AMD EPYC), so forwards that only feed a bf16/fp8 store or a loss run in fp32 there."""
    import torch

    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    if kind != "cpu":
        return True
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def dtype_bytes(dtype: "str | torch.dtype") -> int:
    """Bytes per element of a dtype in any spelling: bf16, bfloat16, torch.bfloat16, a torch.dtype, fp8 /
    float8_e4m3fn (a config's `float8_e4m3fn`, an engine's `fp8`); ValueError naming it otherwise."""
    name = str(dtype).replace("torch.", "")
    for short, (long, size) in DTYPE_TABLE.items():
        if name in (short, long):
            return size
    raise ValueError(f"dtype {dtype!r}: not one of {[n for s, (l, _) in DTYPE_TABLE.items() for n in (s, l)]}")


def dtype_name(dtype: "torch.dtype") -> str:
    """torch.dtype -> the vocabulary's spelling (bf16, fp16, fp32)."""
    return {v: k for k, v in TORCH_NAMES.items()}[str(dtype).replace("torch.", "")]


@contextmanager
def varying_shape_attention() -> Iterator[None]:
    """SDPA without its cuDNN backend, for eager forwards whose shapes change from call to call (prefills).
    cuDNN builds an execution graph per new (batch, length) and caches it: tens to hundreds of ms per new shape
    (a native-generator prefill cost 88 ms on the H200), while flash / memory-efficient attention have no
    per-shape set-up. Static-shape steps (CUDA graphs, compiled decode steps) keep PyTorch's own choice."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


def capture_graph(fn, device: "torch.device | str | None" = None, pool=None, after=None):
    """`fn` as one CUDA graph: run twice on a side stream first (compiles, cuBLAS workspaces; `after()` follows each
    run, e.g. to undo its state), then captured into `pool` (None: the graph's own). Returns (graph, fn's output in
    the graph's memory, which every replay rewrites)."""
    import torch

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
            if after is not None:
                after()
    torch.cuda.current_stream(device).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        out = fn()
    return g, out
