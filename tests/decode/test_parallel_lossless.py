"""Speculative decoding with the parallel drafters (P-EAGLE, DFlash) keeps the target's output: greedy equals
the AR baseline token for token for random and trained drafts, chains and trees, on both decoders; the trees a
trained draft proposes (after acceptances, KV compaction and catch-up) are the rollouts run from scratch."""

import pytest
import torch
from conftest import V, tiny_llama, tiny_moe

from eyas.decode.speculative import HostSpecDecoder, SpecDecoder, ar_generate
from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import TreeSpec
from eyas.draft.io import load_draft
from eyas.draft.kinds import build_draft, draft_config, get_kind
from eyas.target import default_aux_layer_ids, target_states, wrap_model
from tests.draft.test_eagle3_pin import train_on_greedy_text

KINDS = ["p-eagle", "dflash"]
SPECS = [TreeSpec.chain(3), TreeSpec(total=10, depth=4, topk=3)]
CAP = 160


def random_parallel(model, kind, seed=1):
    torch.manual_seed(seed)
    target = wrap_model(model)
    dc = draft_config(model.config, kind, aux_layer_ids=default_aux_layer_ids(target.layout.num_layers),
                      num_layers=2, parallel_tokens=4, mask_token_id=V - 1)
    d = build_draft(dc)
    d.init_from_target(target.layout.embed.weight, target.layout.lm_head.weight)
    return d.eval(), target


def prompts(n=2, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V - 4, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("make", [tiny_llama, tiny_moe], ids=["llama", "qwen3moe"])
def test_random_parallel_draft_is_lossless(make, kind):
    model = make()
    draft, target = random_parallel(model, kind)
    runner = TargetRunner(model, target.layout, draft.config.aux_layer_ids, CAP)
    for prompt in prompts(1 if make is tiny_moe else 2):
        ref, _ = ar_generate(runner, prompt, 24)
        for spec in SPECS:
            for dec in (SpecDecoder, HostSpecDecoder):
                out, st = dec(runner, get_kind(kind).proposer(draft, spec, CAP)).generate(prompt, 24)
                assert out == ref, (dec.__name__, spec.label())
                assert st.emitted >= st.steps


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A P-EAGLE and a DFlash draft trained for a few dozen steps on the target's own greedy text."""
    root = tmp_path_factory.mktemp("parallel")
    target = train_on_greedy_text(root, {k: {"draft_kind": k, "draft_layers": 2, "ttt_steps": 4, "steps": 60}
                                         for k in KINDS})
    return target, {k: load_draft(root / k)[0] for k in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_trained_parallel_draft_is_lossless_and_accepts(trained, kind):
    target, drafts = trained
    draft = drafts[kind]
    runner = TargetRunner(target.model, target.layout, draft.config.aux_layer_ids, CAP)
    g = torch.Generator().manual_seed(11)
    for spec in SPECS:
        emitted = steps = partial = 0
        for n in (5, 9, 13):
            prompt = torch.randint(0, 96, (n,), generator=g).tolist()
            ref, _ = ar_generate(runner, prompt, 40)
            out, st = SpecDecoder(runner, get_kind(kind).proposer(draft, spec, CAP)).generate(prompt, 40)
            assert out == ref, spec.label()
            emitted, steps = emitted + st.emitted, steps + st.steps
            partial += any(0 < a < 1 for a in st.accept_per_position())
        assert partial and emitted / steps > 1.05, (spec.label(), emitted / steps)   # a random draft: 1.0


@pytest.mark.parametrize("kind", KINDS)
def test_proposed_chains_are_rollouts_from_scratch(trained, kind):
    """Every chain the proposer drafts mid-generation equals the draft run from scratch over the committed
    sequence with fresh target states: catch-up after partial acceptance leaves nothing stale."""
    target, drafts = trained
    draft = drafts[kind]
    runner = TargetRunner(target.model, target.layout, draft.config.aux_layer_ids, CAP)
    prop = get_kind(kind).proposer(draft, TreeSpec.chain(4), CAP)
    seen, orig = [], prop.propose

    def spy():
        tree = orig()
        seen.append((list(prop.seq), tree.tokens))
        return tree
    prop.propose = spy
    HostSpecDecoder(runner, prop).generate([3, 17, 40, 8, 21], 36)
    assert len(seen) >= 4
    K = 4
    for seq, chain in seen:
        ids = torch.tensor([seq])
        aux, _, _ = target_states(target.model, target.layout, ids, draft.config.aux_layer_ids)
        n = len(seq) - 1                                   # verified positions 0..n-1, seq[n] the bonus
        with torch.no_grad():
            if kind == "p-eagle":
                mask = torch.full((K - 1,), draft.config.mask_token_id)
                toks = torch.cat([ids[0, 1:], mask])[None]
                hid = torch.cat([draft.combine(aux[0, :n]), draft.mask_state().expand(K - 1, -1)])[None]
                pre = draft(toks, hid, torch.arange(n + K - 1)[None])[0][0, n - 1:]
            else:
                blk = torch.cat([ids[0, n:], torch.full((K,), draft.config.mask_token_id)])[None]
                full = torch.ones(1, 1, K + 1, n + K + 1, dtype=torch.bool)
                pre = draft(blk, (n + torch.arange(K + 1))[None], context=draft.context(aux[:, :n]),
                            context_positions=torch.arange(n)[None], mask=full)[0, 1:]
            want = draft.to_target_ids(draft.logits(pre).argmax(-1)).tolist()
        assert chain == want


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_runs_and_is_reproducible(trained, kind):
    target, drafts = trained
    draft = drafts[kind]
    runner = TargetRunner(target.model, target.layout, draft.config.aux_layer_ids, CAP)
    dec = SpecDecoder(runner, get_kind(kind).proposer(draft, SPECS[1], CAP), temperature=0.8)
    a, _ = dec.generate([3, 17, 40], 24, generator=torch.Generator().manual_seed(0))
    b, _ = dec.generate([3, 17, 40], 24, generator=torch.Generator().manual_seed(0))
    assert a == b and len(a) == 24 and all(0 <= t < 96 for t in a)
