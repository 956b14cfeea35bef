"""A GGUF file's header, parsed once: metadata key/values, tensor infos, where the aligned data starts.

Layout (little-endian, versions 2 and 3):
  magic "GGUF", u32 version, u64 tensor_count, u64 kv_count
  kv_count x (string key, u32 value_type, value)      string = u64 length + utf-8 bytes
  tensor_count x (string name, u32 n_dims, u64 dims[n_dims] innermost first, u32 ggml_type, u64 offset)
  padding to `general.alignment` (default 32), then the tensor data; each offset is from the data start.
Values: scalars (u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64) become Python numbers, strings str, numeric
arrays numpy arrays, string arrays lists of str (the 150k-token vocabularies: one loop of slices of one bytes
object, no numpy object per entry). tests/target/test_gguf_header.py checks everything equals `gguf.GGUFReader`'s.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# value type -> numpy dtype of a scalar or of an array's elements
NUMERIC = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
           7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
SCALAR = {t: struct.Struct("<" + c) for t, c in zip(NUMERIC, "BbHhIif?Qqd")}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]     # torch order (outermost first): GGUF's dims reversed
    qtype: GGMLQuantizationType
    offset: int                # of its first byte in the file
    nbytes: int

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1


@dataclass
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    types: dict[str, tuple[int, ...]]   # key -> value type (ARRAY, element type, ...)
    tensors: list[TensorInfo]
    alignment: int
    data_offset: int
    size: int                           # of the file
    _map: np.ndarray | None = field(default=None, repr=False)

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def data(self, t: TensorInfo) -> np.ndarray:
        """The raw bytes of a tensor: a uint8 view of a copy-on-write map (torch can wrap it without a copy;
        the file is never written)."""
        if self._map is None:
            self._map = np.memmap(self.path, mode="c", dtype=np.uint8)
        return self._map[t.offset:t.offset + t.nbytes]


class _Cursor:
    """Reads values from the header bytes, naming the file and what it was reading when they run out."""

    def __init__(self, buf: bytes | mmap.mmap, path: Path):
        self.buf, self.pos, self.path = buf, 0, path
        self.what = "the header"

    def fail(self, why: str) -> ValueError:
        return ValueError(f"{self.path}: not a readable GGUF file: {why} (reading {self.what} at byte {self.pos})")

    def unpack(self, s: struct.Struct):
        if self.pos + s.size > len(self.buf):
            raise self.fail("the file ends inside its header")
        v = s.unpack_from(self.buf, self.pos)[0]
        self.pos += s.size
        return v

    def string(self) -> str:
        n = self.unpack(_U64)
        end = self.pos + n
        if end > len(self.buf):
            raise self.fail(f"a string of {n} bytes runs past the end of the file")
        try:
            s = bytes(self.buf[self.pos:end]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"a string is not UTF-8: {e}") from e
        self.pos = end
        return s

    def strings(self, count: int) -> list[str]:
        """`count` consecutive strings: one slice of the region, then a loop of decodes of its pieces."""
        buf, pos, size = self.buf, self.pos, len(self.buf)
        spans = []
        unpack = _U64.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                raise self.fail("the file ends inside a string array")
            n = unpack(buf, pos)[0]
            spans.append((pos + 8, pos + 8 + n))
            pos += 8 + n
        if pos > size:
            raise self.fail("a string array runs past the end of the file")
        start = self.pos
        region = bytes(buf[start:pos])
        self.pos = pos
        try:
            return [region[a - start:b - start].decode("utf-8") for a, b in spans]
        except UnicodeDecodeError as e:
            raise self.fail(f"a string is not UTF-8: {e}") from e

    def value(self, vtype: int) -> tuple[Any, tuple[int, ...]]:
        """(value, its type chain: (vtype,) or (ARRAY, element type, ...))."""
        if vtype in SCALAR:
            v = self.unpack(SCALAR[vtype])
            return (bool(v) if vtype == 7 else v), (vtype,)
        if vtype == STRING:
            return self.string(), (vtype,)
        if vtype == ARRAY:
            etype, count = self.unpack(_U32), self.unpack(_U64)
            if etype in NUMERIC:
                dtype = np.dtype(NUMERIC[etype]).newbyteorder("<")
                end = self.pos + count * dtype.itemsize
                if end > len(self.buf):
                    raise self.fail(f"an array of {count} values runs past the end of the file")
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos = end
                return arr, (ARRAY, etype)
            if etype == STRING:
                return self.strings(count), (ARRAY, STRING)
            items, sub = [], (etype,)
            for _ in range(count):       # arrays of arrays: rare and short
                v, sub = self.value(etype)
                items.append(v)
            return items, (ARRAY, *sub)
        raise self.fail(f"unknown value type {vtype}")


def read_header(path: str | Path) -> GGUFHeader:
    """Parse the header of a GGUF file; anything that is not one is a ValueError naming the file."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ValueError(f"{path}: not a readable GGUF file: {e}") from e
    with f:
        size = path.stat().st_size
        if size < 24:
            raise ValueError(f"{path}: not a readable GGUF file: {size} bytes, shorter than a GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            header = _parse(_Cursor(buf, path), path, size)
    return header


def _parse(c: _Cursor, path: Path, size: int) -> GGUFHeader:
    if bytes(c.buf[:4]) != MAGIC:
        raise ValueError(f"{path}: not a readable GGUF file: it starts with {bytes(c.buf[:4])!r}, not b'GGUF'")
    c.pos = 4
    version = c.unpack(_U32)
    if version & 0xFFFF == 0:
        raise ValueError(f"{path}: a big-endian GGUF; eyas reads little-endian ones")
    if version not in VERSIONS:
        raise ValueError(f"{path}: GGUF version {version}; eyas reads versions {', '.join(map(str, VERSIONS))}")
    n_tensors, n_kv = c.unpack(_U64), c.unpack(_U64)
    metadata: dict[str, Any] = {}
    types: dict[str, tuple[int, ...]] = {}
    for i in range(n_kv):
        c.what = f"metadata key {i + 1} of {n_kv}"
        key = c.string()
        c.what = f"the value of {key!r}"
        if key in metadata:
            raise c.fail(f"key {key!r} appears twice")
        metadata[key], types[key] = c.value(c.unpack(_U32))
    raw = []
    for i in range(n_tensors):
        c.what = f"tensor info {i + 1} of {n_tensors}"
        name = c.string()
        c.what = f"the info of tensor {name!r}"
        dims = [c.unpack(_U64) for _ in range(c.unpack(_U32))]
        raw.append((name, tuple(reversed(dims)), c.unpack(_U32), c.unpack(_U64)))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if types.get("general.alignment", (4,)) != (4,) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"{path}: general.alignment is {alignment!r}, not a power of two (u32)")
    data_offset = -(-c.pos // alignment) * alignment
    tensors, seen = [], set()
    for name, shape, qtype_id, offset in raw:
        if name in seen:
            raise ValueError(f"{path}: tensor {name!r} appears twice")
        seen.add(name)
        try:
            qtype = GGMLQuantizationType(qtype_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError) as e:
            raise ValueError(f"{path}: tensor {name!r} has ggml type {qtype_id}, which this gguf package does "
                             "not know") from e
        numel = int(np.prod(shape)) if shape else 1
        if numel % block:
            raise ValueError(f"{path}: tensor {name!r} has {numel} values, not whole {qtype.name} blocks of {block}")
        t = TensorInfo(name, tuple(int(d) for d in shape), qtype, data_offset + offset, numel // block * type_size)
        if t.offset + t.nbytes > size:
            raise ValueError(f"{path}: tensor {name!r} ends at byte {t.offset + t.nbytes:,}, past the end of the "
                             f"file ({size:,} bytes): cut short?")
        tensors.append(t)
    return GGUFHeader(path, version, metadata, types, tensors, alignment, data_offset, size)
