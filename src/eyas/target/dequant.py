"""GGML block dequantisation in torch, on any device: raw GGUF bytes -> float32.

Each function takes the blocks of one tensor as uint8 [n, type_size] and returns float32 [n, block_size],
computing every float32 product and sum in the order of the `gguf` package's reference (`gguf.quants`),
so the results are bit-identical to it (tests/target/test_dequant.py). Layouts (ggml-common.h):
  Q4_0  d:f16, qs[16]            x = d * (nibble - 8); byte j holds x_j (low) and x_{j+16} (high)
  Q4_1  d:f16, m:f16, qs[16]     x = d * nibble + m
  Q5_0  d:f16, qh[4], qs[16]     x = d * ((nibble | bit_j << 4) - 16); bit j of qh (little-endian u32) -> x_j
  Q5_1  d:f16, m:f16, qh[4], qs[16]
  Q8_0  d:f16, qs[32] int8       x = q * d
  Q4_K  d, dmin:f16, scales[12], qs[128]   8 sub-blocks of 32 with 6-bit scale and min each:
        x = (d * sc) * nibble - dmin * m; bytes 32i..32i+31 hold sub-block 2i (low) and 2i+1 (high)
  Q5_K  as Q4_K with qh[32]: bit i of qh byte j is the fifth bit of sub-block i's element j
  Q6_K  ql[128], qh[64], scales[16] int8, d:f16   16 sub-blocks of 16: x = (d * scale) * (q6 - 32)
Types without a function here fall back to the reference (numpy) in `dequantize`.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

QK_K = 256


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two bytes per row (little-endian fp16) -> float32 [n, 1]."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, g, 32] bytes -> [n, g, 2, 32]: the low nibbles, then the high ones."""
    return torch.stack([qs & 0x0F, qs >> 4], dim=-2)


def _bits(b: torch.Tensor, count: int) -> torch.Tensor:
    """[n, k] bytes -> [n, k, count]: bit i of each byte (i = 0..count-1), as uint8 0/1."""
    shifts = torch.arange(count, device=b.device, dtype=torch.uint8)
    return (b.unsqueeze(-1) >> shifts) & 1


def q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:18]).reshape(-1, 32).to(torch.int8) - 8
    return d * q.float()


def q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return d * _nibbles(b[:, 4:20]).reshape(-1, 32).float() + m


def _q5(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """The 5-bit values of Q5_0/Q5_1 blocks: [n, 32] uint8."""
    high = _bits(qh, 8).reshape(-1, 32)           # bit j of the u32 = bit j % 8 of byte j // 8
    return _nibbles(qs).reshape(-1, 32) | (high << 4)


def q5_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    return d * (_q5(b[:, 2:6], b[:, 6:22]).to(torch.int8) - 16).float()


def q5_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return d * _q5(b[:, 4:8], b[:, 8:24]).float() + m


def q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:34].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 scale bytes -> (scale, min) [n, 8], 6 bits each: bytes 0-3 hold scales 0-3 (and the
    top bits of scales 4-7), bytes 4-7 mins 0-3 (and the top bits of mins 4-7), bytes 8-11 the low bits of 4-7."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_scale_shift(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's per-sub-block factors [n, 8, 1]: d * scale and dmin * min."""
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    return (d * sc.float()).reshape(n, 8, 1), (dmin * mn.float()).reshape(n, 8, 1)


def q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scale, shift = _k_scale_shift(b)
    q = _nibbles(b[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32).float()
    return (scale * q - shift).reshape(n, QK_K)


def q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scale, shift = _k_scale_shift(b)
    low = _nibbles(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
    high = _bits(b[:, 16:48], 8).transpose(1, 2)   # [n, 8 sub-blocks, 32]
    return (scale * (low | (high << 4)).float() - shift).reshape(n, QK_K)


def q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql, qh = b[:, :128], b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    scale = (_f16(b[:, 208:210]) * scales).reshape(n, 16, 1)
    halves = ql.reshape(n, 2, 64)                  # each half: 64 bytes, low nibbles then high ones
    low = torch.stack([halves & 0x0F, halves >> 4], dim=2).reshape(n, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], device=b.device, dtype=torch.uint8).reshape(1, 1, 4, 1)
    high = ((qh.reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 8, 32)
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(n, 16, 16).float()
    return (scale * q).reshape(n, QK_K)


BLOCK_FNS = {Q.Q4_0: q4_0, Q.Q4_1: q4_1, Q.Q5_0: q5_0, Q.Q5_1: q5_1, Q.Q8_0: q8_0,
             Q.Q4_K: q4_k, Q.Q5_K: q5_k, Q.Q6_K: q6_k}
PLAIN = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}


def dequantize(raw: torch.Tensor, qtype, shape: tuple[int, ...], name: str = "tensor") -> torch.Tensor:
    """Raw bytes (uint8, any shape, on any device) of a tensor of `qtype` -> float32 `shape` on that device.

    Types without a torch kernel here go through the reference on the CPU (correct, slower)."""
    qtype = Q(qtype)
    raw = raw.reshape(-1)
    numel = int(np.prod(shape)) if shape else 1
    if qtype in PLAIN:
        out = raw.view(PLAIN[qtype]).float()
    elif qtype in BLOCK_FNS:
        block, size = GGML_QUANT_SIZES[qtype]
        if raw.numel() % size or raw.numel() // size * block != numel:
            raise ValueError(f"{name}: {raw.numel()} bytes of {qtype.name} do not hold {numel} values")
        out = BLOCK_FNS[qtype](raw.view(-1, size)).reshape(-1)
    else:
        from gguf.quants import dequantize as reference

        out = torch.from_numpy(reference(raw.cpu().numpy(), qtype).copy()).reshape(-1).to(raw.device)
    if out.numel() != numel:
        raise ValueError(f"{name}: {out.numel()} values of {qtype.name}, expected {numel} for shape {list(shape)}")
    return out.reshape(shape)
