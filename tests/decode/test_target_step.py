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


def test_grouped_sdpa_equals_sdpa_with_k_v_repeated():
    """The query heads of a KV group sharing it (mask rows repeated per head) = transformers' sdpa, which repeats K
    and V per head: one-token steps (shared or per-head mask) and tree-verify steps; what it cannot group falls back."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from eyas.data.attention import grouped_sdpa
    g = torch.Generator().manual_seed(0)
    mod = torch.nn.Module()
    mod.is_causal, mod.num_key_value_groups = True, 3
    k, v = torch.randn(1, 2, 40, 8, generator=g), torch.randn(1, 2, 40, 8, generator=g)
    for T, heads in ((1, 1), (1, 6), (5, 1), (7, 1)):
        q = torch.randn(1, 6, T, 8, generator=g)
        see = torch.rand(1, heads, T, 40, generator=g) < 0.6
        see[..., 0] = True
        mask = torch.zeros(see.shape).masked_fill(~see, torch.finfo(torch.float32).min)
        want, _ = sdpa_attention_forward(mod, q, k, v, mask)
        got, _ = grouped_sdpa(mod, q, k, v, mask, max_rows=64)
        torch.testing.assert_close(got, want)
    q = torch.randn(1, 6, 5, 8, generator=g)
    for mask, rows in ((None, 64), (torch.zeros(1, 1, 5, 40), 12)):   # causal flag, too many rows: sdpa's own path
        torch.testing.assert_close(grouped_sdpa(mod, q, k, v, mask, max_rows=rows)[0],
                                   sdpa_attention_forward(mod, q, k, v, mask)[0])


def test_a_grouped_runner_steps_as_the_plain_one_and_gives_the_model_back(monkeypatch):
    """EYAS_GROUPED_STEPS=1: a prefill (causal first chunk and masked) and a tree-verify step give the plain runner's
    logits and aux; the model's attention implementation is the runner's while it lives and sdpa after close."""
    from eyas.decode.target_step import GROUPED
    runners = []
    for grouped in ("0", "1"):
        monkeypatch.setenv("EYAS_GROUPED_STEPS", grouped)
        model = tiny_llama(seed=2).requires_grad_(False)
        runners.append(TargetRunner(model, wrap_model(model).layout, [1, 2], 64, min_bucket=16))
    plain, grouped = runners
    assert not plain.grouped and grouped.grouped and grouped.model.config._attn_implementation == GROUPED
    toks = torch.randint(0, 64, (26,), generator=torch.Generator().manual_seed(1))
    anc = torch.ones(20, 20, dtype=torch.bool).tril()
    tree_anc = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
                            dtype=torch.bool)
    outs = []
    for r in runners:
        ar = torch.arange(20)
        first = r.step(toks[:12], ar[:12], ar[:12], torch.tensor(0), anc[:12, :12], kv_len=32, eager=True, causal=True)
        rest = r.step(toks[12:20], ar[12:], ar[12:], torch.tensor(12), anc[:8, :8], kv_len=32, eager=True)
        pos = torch.tensor([20, 21, 21, 22, 22])
        tree = r.step(toks[20:25], pos, torch.arange(20, 25), torch.tensor(20), tree_anc, kv_len=32)
        outs.append([t.clone() for pair in (first, rest, tree) for t in pair])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b)
    second = TargetRunner(grouped.model, wrap_model(grouped.model).layout, [1, 2], 64, min_bucket=16)
    assert second.grouped and second.causal_from_start(8)   # made beside it: still an sdpa model to the second
    second.close()
    assert grouped.model.config._attn_implementation == GROUPED
    grouped.close()
    assert grouped.model.config._attn_implementation == "sdpa"
