"""KV buckets: a target step attends over only the first kv_len cache slots. Same logits as over the
whole capacity, decodes whose context crosses bucket boundaries stay token-identical to greedy AR,
and no step ever touches a slot at or above its bucket."""

import pytest
import torch
from conftest import random_draft, tiny_gemma3, tiny_llama
from test_lossless import SPECS, prompts, train_draft

from eyas.decode.proposer import EagleProposer
from eyas.decode.speculative import HostSpecDecoder, SpecDecoder, ar_generate, warm_ar
from eyas.decode.target_step import TargetRunner, kv_buckets

CAP = 160


def test_bucket_choice_covers_every_slot():
    model = tiny_llama(layers=1)
    runner = TargetRunner(model, random_draft(model)[1].layout, [0], CAP, min_bucket=16)
    assert runner.buckets == (16, 32, 64, 160)  # 128 is within 25 % of the capacity: left out
    for n in range(1, CAP + 1):
        b = runner.bucket(n)
        assert b in runner.buckets and b >= n  # every slot < n is inside the bucket
        assert all(c < n for c in runner.buckets if c < b)  # and it is the smallest such bucket
    with pytest.raises(ValueError):
        runner.bucket(CAP + 1)
    assert kv_buckets(3000) == (256, 512, 1024, 2048, 3000) and kv_buckets(2500) == (256, 512, 1024, 2500)
    assert kv_buckets(2049, 1024) == (1024, 2049)  # Spec-Bench's capacity: 2048 would be one more compile
    assert kv_buckets(256) == (256,) and kv_buckets(100) == (100,)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3], ids=["llama", "gemma3-sliding"])
def test_prefix_attention_equals_full_capacity(make):
    model = make()
    draft, target = random_draft(model)
    runner = TargetRunner(model, target.layout, draft.config.aux_layer_ids, CAP, min_bucket=16)
    n, T = 21, 6  # context past the sliding window (8); tree slots 21..26 -> bucket 32
    g = torch.Generator().manual_seed(0)
    ar = torch.arange(n)
    with torch.no_grad():
        runner.step(torch.randint(0, 90, (n,), generator=g), ar, ar, torch.tensor(0),
                    torch.ones(n, n, dtype=torch.bool).tril(), eager=True)
    toks = torch.randint(0, 90, (T,), generator=g)
    parents = [-1, 0, 0, 1, 3, 2]                     # a small tree under the root
    anc = torch.eye(T, dtype=torch.bool)
    for i, p in enumerate(parents):
        while p >= 0:
            anc[i, p], p = True, parents[p]
    depth = anc.sum(1) - 1
    slots, pos = n + torch.arange(T), n + depth
    with torch.no_grad():  # rewrites the same K/V at the same slots each time: same cache state
        full = [t.clone() for t in runner.step(toks, pos, slots, torch.tensor(n), anc, kv_len=CAP)]
        for kv in (runner.bucket(n + T), 64):
            part = runner.step(toks, pos, slots, torch.tensor(n), anc, kv_len=kv)
            torch.testing.assert_close(part[0], full[0], rtol=0, atol=1e-5)
            torch.testing.assert_close(part[1], full[1], rtol=0, atol=1e-5)
    assert runner.bucket(n + T) == 32


def _spy(runner, used):
    """Record every target step's kv_len and check that all the slots it writes, attends or compacts
    (a compaction follows its verify step) lie below it. Host reads: fine off the graph path."""
    step, inner, compact = runner.step, runner.inner_step, runner.cache.compact

    def check(slots, kv_len):
        kv_len = kv_len or runner.capacity
        assert int(slots.max()) < kv_len <= runner.capacity
        used.append(kv_len)

    def spy_step(tokens, positions, slots, ctx_len, anc, *, kv_len=None, eager=False, last_only=False, causal=False):
        check(slots, kv_len)
        assert int(ctx_len) <= int(slots.min())
        assert not causal or (int(ctx_len) == 0 and int(slots.min()) == 0)   # causal: a chunk from slot 0 only
        return step(tokens, positions, slots, ctx_len, anc, kv_len=kv_len, eager=eager, last_only=last_only,
                    causal=causal)

    def spy_inner(tokens, positions, slots, ctx_len, anc, kv_len=None):
        check(slots, kv_len)
        return inner(tokens, positions, slots, ctx_len, anc, kv_len)

    def spy_compact(src, dst):
        assert max(int(src.max()), int(dst.max())) < used[-1]
        compact(src, dst)
    runner.step, runner.inner_step, runner.cache.compact = spy_step, spy_inner, spy_compact


@pytest.fixture(scope="module")
def trained():
    model = tiny_llama(seed=3)
    return (model,) + train_draft(model, steps=100)  # partly accepted: compaction moves entries


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label())
def test_decode_across_buckets_is_lossless(trained, spec):
    model, draft, target = trained
    aux = draft.config.aux_layer_ids
    full = TargetRunner(model, target.layout, aux, CAP, min_bucket=CAP)      # one bucket: the capacity
    runner = TargetRunner(model, target.layout, aux, CAP, min_bucket=16)
    used = []
    _spy(runner, used)
    for prompt in prompts(2, seed=7):
        n = 70   # prompt + 70 tokens + a tree: contexts from < 16 to > 64 slots
        hf = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
        ref = hf[0, len(prompt):].tolist()
        assert ar_generate(full, prompt, n)[0] == ref
        assert ar_generate(runner, prompt, n)[0] == ref
        assert HostSpecDecoder(runner, EagleProposer(draft, spec, CAP)).generate(prompt, n)[0] == ref
        dec = SpecDecoder(runner, EagleProposer(draft, spec, CAP), graphs=True)  # eager off the GPU
        assert dec.generate(prompt, n)[0] == ref
    assert {32, 64, 160} <= set(used), sorted(set(used))


def test_bucket_warm_up_restores_the_round_state(trained, monkeypatch):
    """The first use of a bucket mid-generation warms it up (runs the round, then restores the state);
    forcing that before every round, and warming every bucket ahead, leaves the tokens unchanged."""
    model, draft, target = trained
    runner = TargetRunner(model, target.layout, draft.config.aux_layer_ids, CAP, min_bucket=16)
    prompt = prompts(1, seed=9)[0]
    ref, _ = ar_generate(runner, prompt, 60)
    warm_ar(runner)  # writes uncommitted slots only
    assert ar_generate(runner, prompt, 60)[0] == ref
    spec = SPECS[1]
    dec = SpecDecoder(runner, EagleProposer(draft, spec, CAP), temperature=0.0)
    dec.warm(prompt)
    orig = dec._round

    def round_after_warm_up(kv_len):
        dec._warm(kv_len)
        return orig(kv_len)
    monkeypatch.setattr(dec, "_round", round_after_warm_up)
    out, st = dec.generate(prompt, 60)
    assert out == ref and st.steps > 5 and st.tau > 1
