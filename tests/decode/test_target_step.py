"""TargetRunner's eager prefill: the last-row logits it keeps equal the full forward's last row, and the lm_head
runs as one plain matmul (no per-prefill copy of its weight)."""

import torch
from torch.profiler import ProfilerActivity, profile

from eyas.decode.target_step import TargetRunner
from eyas.target import wrap_model

from conftest import tiny_llama


def prefill(runner, n, last_only):
    ar = torch.arange(n)
    anc = torch.ones(n, n, dtype=torch.bool).tril()
    toks = torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(1))
    return runner.step(toks, ar, ar, torch.tensor(0), anc, kv_len=runner.bucket(n), eager=True, last_only=last_only)


def test_last_only_prefill_keeps_the_last_rows_logits_without_copying_the_lm_head():
    model = tiny_llama(seed=2).requires_grad_(False)  # as load_target leaves it (frozen weights fold no matmul)
    target = wrap_model(model)
    runner = TargetRunner(model, target.layout, [1, 2], 64, min_bucket=16)
    full, aux_full = prefill(runner, 20, last_only=False)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        last, aux_last = prefill(runner, 20, last_only=True)
    assert last.shape == (1, full.shape[-1])
    torch.testing.assert_close(last[0], full[-1])
    torch.testing.assert_close(aux_last, aux_full)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::bmm" not in ops and "aten::contiguous" not in ops  # the int slice's strided view caused both
