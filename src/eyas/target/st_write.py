"""A safetensors file written tensor by tensor, from threads, while the tensors are still being made.

The header is known before any tensor exists (names, dtypes and shapes come from the GGUF's header), so the
file is laid out first and each tensor is written at its offset (os.pwrite, which releases the GIL) as soon as
it is ready: the disk works while the next tensor is dequantised. Nothing is serialised into one buffer first,
as `safetensors.torch.save_file` does (a copy of the whole model). The layout is save_file's: header JSON with
`__metadata__` first, padded with spaces to 8 bytes, tensors by dtype then name; tests/target/test_st_write.py checks
the file equals save_file's byte for byte.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

# in the order of safetensors' Dtype enum: save_file lays tensors out by it (highest first), then by name
DTYPES = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.float16: "F16",
          torch.bfloat16: "BF16", torch.int32: "I32", torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}
_RANK = {d: i for i, d in enumerate(DTYPES)}
_MAX_WRITE = 1 << 30   # bytes per pwrite call (Linux writes at most 2 GiB - 4 KiB in one)


class SafetensorsWriter:
    """`layout`: name -> (dtype, shape) of every tensor the file will hold. `put(name, tensor)` queues one (a CPU
    tensor of that dtype and shape); `close()` waits for the writes and fails naming a tensor never put."""

    def __init__(self, path: str | os.PathLike, layout: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None, workers: int = 4):
        self.path = Path(path)
        self.layout = layout
        header: dict = {"__metadata__": dict(metadata)} if metadata else {}
        self.offsets: dict[str, tuple[int, int]] = {}
        unknown = [n for n, (dtype, _) in layout.items() if dtype not in DTYPES]
        if unknown:
            raise ValueError(f"{self.path}: tensor {unknown[0]} has dtype {layout[unknown[0]][0]}, which this "
                             "writer cannot hold")
        end = 0
        for name in sorted(layout, key=lambda n: (-_RANK[layout[n][0]], n)):
            dtype, shape = layout[name]
            n = _numel(shape) * torch.empty((), dtype=dtype).element_size()
            self.offsets[name] = (end, end + n)
            header[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [end, end + n]}
            end += n
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        blob += b" " * (-len(blob) % 8)
        self.base = 8 + len(blob)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(self.fd, self.base + end)
        self._pwrite(len(blob).to_bytes(8, "little") + blob, 0)
        self.pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="st-write")
        self.pending: dict[str, Future] = {}

    def put(self, name: str, tensor: torch.Tensor) -> None:
        if name not in self.layout:
            raise KeyError(f"{self.path}: tensor {name} is not in the file's layout")
        if name in self.pending:
            raise ValueError(f"{self.path}: tensor {name} was written twice")
        dtype, shape = self.layout[name]
        if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{self.path}: tensor {name} is {tensor.dtype} {list(tensor.shape)}, its layout says "
                             f"{dtype} {list(shape)}")
        t = tensor.detach().cpu().contiguous()
        self.pending[name] = self.pool.submit(self._write_tensor, name, t)

    def _write_tensor(self, name: str, t: torch.Tensor) -> None:
        data = memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
        self._pwrite(data, self.base + self.offsets[name][0])

    def _pwrite(self, data, pos: int) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            n = os.pwrite(self.fd, view[:_MAX_WRITE], pos)
            view, pos = view[n:], pos + n

    def close(self) -> None:
        try:
            for f in self.pending.values():
                f.result()
            missing = sorted(set(self.layout) - set(self.pending))
            if missing:
                raise ValueError(f"{self.path}: tensor {missing[0]} was never written ({len(missing)} missing)")
        finally:
            self.pool.shutdown(wait=True)
            os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:   # a failed conversion: stop, leave no file that looks complete
            self.pool.shutdown(wait=True, cancel_futures=True)
            os.close(self.fd)
            self.path.unlink(missing_ok=True)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
