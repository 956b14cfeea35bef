"""The capture contract on CUDA (sdpa kernels, the GPU stack's transformers): run with `-m gpu`."""

from __future__ import annotations

import pytest
import torch

from eyas.target import find_layout, packed_position_ids, target_states
from tests.target.zoo import BY_NAME

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

AUX = [2, 4, 5]


@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "deepseek_v3", "gemma3", "qwen2_5_vl", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_capture_padded_packed_on_cuda(name, dtype):
    model = BY_NAME[name].model().to("cuda", dtype)
    layout = find_layout(model)
    gen = torch.Generator().manual_seed(2)
    docs = [torch.randint(1, 80, (n,), generator=gen).cuda() for n in (9, 6, 5)]
    ref = model(input_ids=docs[0][None], output_hidden_states=True, use_cache=False)
    aux, last, _ = target_states(model, layout, docs[0][None], AUX)
    for j, k in enumerate(AUX):
        assert torch.equal(aux[0, :, j], ref.hidden_states[k][0])
    singles = [target_states(model, layout, d[None], AUX)[:2] for d in docs]
    # bf16: other batch shapes pick other kernels; states agree to bf16 rounding, a leak is O(1).
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
    packed_aux, packed_last, _ = target_states(model, layout, torch.cat(docs)[None], AUX,
                                               position_ids=packed_position_ids([9, 6, 5], device="cuda"))
    ids = torch.zeros(3, 9, dtype=torch.long, device="cuda")
    mask = torch.zeros_like(ids)
    for i, d in enumerate(docs):
        ids[i, 9 - len(d):], mask[i, 9 - len(d):] = d, 1  # left padding
    pad_aux, pad_last, _ = target_states(model, layout, ids, AUX, attention_mask=mask)
    start = 0
    for i, (d, (s_aux, s_last)) in enumerate(zip(docs, singles)):
        cols = slice(start, start + len(d))
        start += len(d)
        torch.testing.assert_close(packed_aux[0, cols], s_aux[0], **tol)
        torch.testing.assert_close(packed_last[0, cols], s_last[0], **tol)
        valid = mask[i].bool()
        torch.testing.assert_close(pad_aux[i][valid], s_aux[0], **tol)
        torch.testing.assert_close(pad_last[i][valid], s_last[0], **tol)
