"""The draft's catch-up over a prompt in padded chunks of static widths (what the GPU replays as one CUDA graph per
width) leaves the same draft KV and root as the eager catch-up at the prompt's own length, and decoding after it
is the same, token for token and round for round."""

import pytest
import torch
from conftest import V, tiny_llama
from test_lossless import CAP, train_draft
from test_static_path import SPECS

from eyas.decode.prefill import prefill
from eyas.decode.proposer import EagleProposer
from eyas.decode.speculative import SpecDecoder, ar_generate
from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import TreeSpec

WIDTHS = (8, 16, 32)   # small, so that a 50-token prompt takes two chunks and a pad


@pytest.fixture(scope="module")
def trained():
    model = tiny_llama(seed=3)
    draft, target = train_draft(model, steps=100)
    return model, draft, TargetRunner(model, target.layout, draft.config.aux_layer_ids, CAP, min_bucket=16)


def _prompt(n, seed=7):
    return torch.randint(0, V - 4, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PCAP = 150   # the proposer's capacity: a 149-token prompt's last chunk (21 rows, width 32) would pass it


def _proposer(draft, padded: bool) -> EagleProposer:
    p = EagleProposer(draft, TreeSpec(total=12, depth=4, topk=3), PCAP)
    p.graph_prompt, p.widths = padded, WIDTHS
    return p


@pytest.mark.parametrize("n", [5, 12, 32, 50, 149])   # (5: a round's own path), padded, exact, two chunks, eager tail
def test_padded_chunks_leave_the_same_kv_and_root(trained, n):
    model, draft, runner = trained
    prompt = _prompt(n)
    _, aux = prefill(runner, prompt)
    seq = prompt + [1]
    eager, padded = _proposer(draft, False), _proposer(draft, True)
    eager.observe(seq, aux, 0)
    padded.observe(seq, aux, 0)
    assert (padded.ctx, padded.p) == (eager.ctx, eager.p) == (n, n - 1)
    for a, b in ((eager.kbuf, padded.kbuf), (eager.vbuf, padded.vbuf)):
        torch.testing.assert_close(b[:, :, :n], a[:, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded.pre0, eager.pre0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded.lp0, eager.lp0, atol=1e-5, rtol=1e-5)
    assert torch.equal(padded.id0, eager.id0)
    # the pad rows wrote slots after the prompt only: the junk and scratch regions are untouched
    assert not padded.kbuf[:, :, PCAP:].any()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label())
def test_decoding_after_a_padded_catchup_is_the_same(trained, spec):
    model, draft, runner = trained
    for n in (3, 21, 40):
        prompt = _prompt(n, seed=n)
        ref, _ = ar_generate(runner, prompt, 30)
        outs = []
        for padded in (False, True):
            p = EagleProposer(draft, spec, CAP)
            p.graph_prompt, p.widths = padded, WIDTHS
            out, st = SpecDecoder(runner, p).generate(prompt, 30)
            outs.append((out, st.steps, st.accepted_at))
        assert outs[0] == outs[1] and outs[0][0] == ref


def test_warm_up_runs_every_width_and_the_next_generation_is_unaffected(trained):
    model, draft, runner = trained
    p = _proposer(draft, True)
    dec = SpecDecoder(runner, p)
    prompt = _prompt(40, seed=3)
    before = dec.generate(prompt, 24)[0]
    calls = []
    orig = p._prompt_run
    p._prompt_run = lambda w: (calls.append(w), orig(w))[1]
    p.warm_prompt()
    assert calls == list(WIDTHS)
    assert dec.generate(prompt, 24)[0] == before
