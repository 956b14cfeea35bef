"""T > 0: recursive rejection sampling over the tree keeps the target's distribution exactly.

Chi-square goodness of fit of the second generated token (the first one produced by a verification
round) against its exact marginal under the target, over many seeds. The same test must reject a
deliberately broken acceptance rule (on rejection, redraw from the unmodified target distribution),
so it has the power to catch a wrong rule.
"""

import torch
from conftest import random_draft, tiny_llama

from eyas.decode.proposer import EagleProposer, OracleProposer
from eyas.decode.speculative import SpecDecoder
from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import Tree, TreeSpec, sample_accept

VS, TEMP, N = 12, 0.8, 400
# chi-square critical values at p = 0.001 by degrees of freedom (no scipy in the environment)
CRIT = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59, 11: 31.26}


def exact_second_token(model, prompt):
    with torch.no_grad():
        p1 = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].double() / TEMP, -1)
        ids = torch.tensor([prompt + [i] for i in range(VS)])
        p2 = torch.softmax(model(input_ids=ids).logits[:, -1].double() / TEMP, -1)
    return p1 @ p2


def chi2(counts, expected):
    # pool bins with expected count < 5 into one (the usual validity rule)
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]]) if small.any() else counts
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return stat, int(keep.sum()) - 1


def second_tokens(runner, proposer, prompt, residual):
    dec = SpecDecoder(runner, proposer, temperature=TEMP, residual=residual)
    counts = torch.zeros(VS, dtype=torch.float64)
    for seed in range(N):
        out, _ = dec.generate(prompt, 2, generator=torch.Generator().manual_seed(seed))
        counts[out[1]] += 1
    return counts


def test_rejection_sampling_matches_target_and_broken_rule_fails():
    model = tiny_llama(seed=7, vocab=VS, layers=2)
    with torch.no_grad():  # sharpen the random model: its argmax then carries about half the mass
        model.lm_head.weight.mul_(20)
    _, target = random_draft(model)
    runner = TargetRunner(model, target.layout, [0, 1], 64)
    prompt = [1, 5, 3, 7]
    expected = exact_second_token(model, prompt) * N
    # The oracle drafts the target's argmax, the token with the most mass: a wrong rule shows clearly.
    good = chi2(second_tokens(runner, OracleProposer(model, 2), prompt, True), expected)
    bad = chi2(second_tokens(runner, OracleProposer(model, 2), prompt, False), expected)
    assert good[0] < CRIT[good[1]], good
    assert bad[0] > CRIT[bad[1]], bad


def test_tree_rejection_sampling_unit():
    """Many candidates per level: exact output distribution of one round equals the target's."""
    # root has children tokens 0, 1 (drafted top-2); p(root) over 4 tokens.
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    tree = Tree([0, 1], [-1, -1])
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    n = 6000
    for _ in range(n):
        path, bonus = sample_accept(tree, lambda i: p, g)
        first = tree.tokens[path[0] - 1] if path else bonus
        counts[first] += 1
    assert torch.allclose(counts / n, p.float(), atol=0.02), counts / n


def test_sampling_with_eagle_tree_runs_and_is_reproducible():
    model = tiny_llama(seed=7, vocab=VS, layers=2)
    draft, target = random_draft(model)
    runner = TargetRunner(model, target.layout, draft.config.aux_layer_ids, 64)
    dec = SpecDecoder(runner, EagleProposer(draft, TreeSpec(total=6, depth=3, topk=2), 64), temperature=TEMP)
    a, _ = dec.generate([1, 2, 3], 20, generator=torch.Generator().manual_seed(3))
    b, _ = dec.generate([1, 2, 3], 20, generator=torch.Generator().manual_seed(3))
    assert a == b and len(a) == 20


def test_ar_baseline_samples_on_the_device_from_the_softmax():
    """The AR baseline's T > 0 draw (device-side exponential race, like SpecDecoder's) follows softmax(l / T)
    and is reproducible from the caller's generator."""
    from eyas.decode.speculative import _device_sampler

    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    draw = _device_sampler(0.7, torch.Generator().manual_seed(3), torch.device("cpu"))
    n = 4000
    counts = torch.bincount(torch.tensor([draw(logits) for _ in range(n)]), minlength=5).double()
    expected = torch.softmax(logits[0] / 0.7, -1).double() * n
    stat, dof = chi2(counts, expected)
    assert stat < CRIT[dof], (stat, counts.tolist(), expected.tolist())
    again = _device_sampler(0.7, torch.Generator().manual_seed(3), torch.device("cpu"))
    first = _device_sampler(0.7, torch.Generator().manual_seed(3), torch.device("cpu"))
    assert [again(logits) for _ in range(20)] == [first(logits) for _ in range(20)]
    assert _device_sampler(0.0, None, torch.device("cpu"))(logits) == 0


def test_a_turns_first_token_is_drawn_from_the_softmax_where_the_logits_are():
    """The prefill's token at T > 0 (no host copy of the distribution): the softmax's frequencies, and the same
    draw again from the same generator state."""
    from eyas.decode.speculative import _first_token
    logits = torch.randn(VS, generator=torch.Generator().manual_seed(3)) * 2
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(VS)
    for _ in range(N * 4):
        counts[_first_token(logits, TEMP, gen)] += 1
    expected = torch.softmax(logits.double() / TEMP, -1) * N * 4
    stat, dof = chi2(counts, expected)
    assert stat < CRIT[dof]
    a, b = (_first_token(logits, TEMP, torch.Generator().manual_seed(5)) for _ in range(2))
    assert a == b and _first_token(logits, 0.0, None) == int(logits.argmax())
