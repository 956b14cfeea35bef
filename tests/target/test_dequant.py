"""eyas's torch dequantisation equals the `gguf` package's reference bit for bit, for every type it implements.

Random raw blocks cover every bit pattern of the quants and scales; the fp16 scale fields are drawn finite
(random bytes there would mostly be fine too, but NaN payloads are not worth comparing). Both sides compute
each float32 product and difference in the same order, so equality is exact (rtol = atol = 0).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize as reference

from eyas.target.dequant import BLOCK_FNS, PLAIN, dequantize

# byte offsets of each type's fp16 fields inside a block
F16_FIELDS = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
              Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}


def random_blocks(qtype, n_blocks: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    _, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:   # finite scales of varied magnitude and sign
        vals = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-4, 2, n_blocks)).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    return raw


@pytest.mark.parametrize("qtype", sorted(BLOCK_FNS, key=int), ids=lambda q: Q(q).name)
def test_block_types_equal_the_reference(qtype):
    block, _ = GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, 300, seed=int(qtype))
    shape = (300 * block // 512, 512) if block == 256 else (300 * block // 64, 64)
    want = reference(raw.reshape(shape[0], -1), qtype).reshape(shape)
    got = dequantize(torch.from_numpy(raw), qtype, shape)
    assert got.dtype == torch.float32 and tuple(got.shape) == shape
    assert torch.equal(got, torch.from_numpy(want)), (got - torch.from_numpy(want)).abs().max()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda q: q.name)
def test_plain_types_equal_the_reference(qtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 32)).astype(np.float32)
    raw = {Q.F32: x.view(np.uint8), Q.F16: x.astype(np.float16).view(np.uint8),
           Q.BF16: (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)}[qtype]
    want = reference(raw.view({Q.F32: np.float32, Q.F16: np.float16, Q.BF16: np.uint8}[qtype]), qtype)
    got = dequantize(torch.from_numpy(raw.copy()), qtype, (7, 32))
    assert torch.equal(got, torch.from_numpy(np.asarray(want, dtype=np.float32).reshape(7, 32)))
    assert set(PLAIN) == {Q.F32, Q.F16, Q.BF16}


def test_other_types_fall_back_to_the_reference():
    raw = np.random.default_rng(2).integers(0, 256, size=(4, GGML_QUANT_SIZES[Q.Q2_K][1]), dtype=np.uint8)
    raw[:, -4:] = np.array([0.5, -0.25], dtype=np.float16).view(np.uint8)   # d, dmin finite
    got = dequantize(torch.from_numpy(raw), Q.Q2_K, (4, 256))
    assert torch.equal(got, torch.from_numpy(reference(raw, Q.Q2_K)).reshape(4, 256))


def test_wrong_byte_count_names_the_tensor():
    raw = torch.zeros(3 * 144 + 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"blk.0.attn_q.weight: 433 bytes of Q4_K do not hold 768 values"):
        dequantize(raw, Q.Q4_K, (3, 256), name="blk.0.attn_q.weight")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("qtype", sorted(BLOCK_FNS, key=int), ids=lambda q: Q(q).name)
def test_block_types_on_cuda_equal_the_reference(qtype):
    """Each float32 op is its own kernel in eager torch (no fused multiply-add), so CUDA is exact too."""
    block, _ = GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, 4096, seed=int(qtype) + 1)
    shape = (4096 * block // 512, 512) if block == 256 else (4096 * block // 64, 64)
    want = torch.from_numpy(reference(raw.reshape(shape[0], -1), qtype).reshape(shape))
    got = dequantize(torch.from_numpy(raw).cuda(), qtype, shape)
    assert got.is_cuda and torch.equal(got.cpu(), want)
