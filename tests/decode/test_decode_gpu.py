"""GPU: the compiled path on a SmolLM2-shaped random Llama: the compiled AR baseline (reduce-overhead) and
the static-buffer decoder (manually captured round graphs around compiled steps) are token-identical
in fp32, a round syncs the device at most once (set_sync_debug_mode), and step times print.
Run: python -m pytest -q -s -m gpu tests/decode/test_decode_gpu.py"""

import time

import pytest
import torch

from eyas.decode.proposer import EagleProposer
from eyas.decode.speculative import SpecDecoder, ar_generate
from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import TreeSpec
from eyas.draft.model import Eagle3Draft, draft_config_from_target
from eyas.target import wrap_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def smollm2_shaped(dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).to("cuda", dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_spec_decoding(dtype):
    model = smollm2_shaped(dtype)
    target = wrap_model(model)
    draft = Eagle3Draft(draft_config_from_target(model.config, aux_layer_ids=[2, 15, 27])).to("cuda", dtype).eval()
    draft.init_from_target(target.layout.embed.weight, target.layout.lm_head.weight, target.layout.norm.weight)
    cap = 512
    # buckets 128/256/512: the prompt's rounds start in 128 and cross into 256, so the bucket switch (its own
    # compiled step and round graphs) is inside the fp32 identity check
    runner = TargetRunner(model, target.layout, draft.config.aux_layer_ids, cap, min_bucket=128)
    runner.compile()
    runner.compile_inner()
    prompt = torch.randint(0, 49000, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    n = 128
    for _ in range(2):  # warm-up: compile + graph capture
        ref, _ = ar_generate(runner, prompt, n)
    t0 = time.perf_counter()
    ref, st = ar_generate(runner, prompt, n)
    ar_s = (st.t_total - st.t_prefill) / (n - 1)
    print(f"\n{dtype}: compiled AR {1 / ar_s:.0f} tok/s ({ar_s * 1e3:.2f} ms/token)")
    eager_out, est = ar_generate(TargetRunner(model, target.layout, [2, 15, 27], cap), prompt, 32)
    print(f"{dtype}: eager AR {(32 - 1) / (est.t_total - est.t_prefill):.0f} tok/s")
    for spec in (TreeSpec.chain(3), TreeSpec(total=60, depth=7, topk=10)):
        check_compiled_rounds(runner, EagleProposer(draft, spec, cap), prompt, n, ref if dtype == torch.float32
                              else None, f"{dtype} {spec.label()}", ar_s)


def check_compiled_rounds(runner, prop, prompt, n, ref, label, ar_s):
    """The static-buffer decoder with `prop` compiled: round graphs captured, at most one sync a round, the output
    equal to `ref` (the AR baseline's; None: not compared), per-round times printed."""
    import warnings

    prop.compile_inner()
    dec = SpecDecoder(runner, prop)
    for _ in range(2):
        out, sst = dec.generate(prompt, n)
    assert dec._graphs, "round graphs were not captured"
    # a turn's start: the first tree and the prompt's catch-up (a 40-token prompt: one padded chunk) replay graphs
    assert dec._first_tree is not None and list(prop._prompt_graphs) == [64]
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, st2 = dec.generate(prompt, n)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    # prefill (first token, tensor uploads) has a few; the rounds at most one each
    assert len(syncs) <= st2.steps + 8, (len(syncs), st2.steps, [str(w.message)[:80] for w in syncs[:5]])
    if ref is not None:
        assert out == ref, label
    print(f"{label}: tau {sst.tau:.2f}, per round: draft {sst.t_draft / sst.steps * 1e3:.2f} ms, "
          f"verify {sst.t_verify / sst.steps * 1e3:.2f} ms, other "
          f"{(sst.t_total - sst.t_prefill - sst.t_draft - sst.t_verify) / sst.steps * 1e3:.2f} ms "
          f"(AR token {ar_s * 1e3:.2f} ms); a turn's start {sst.t_prefill * 1e3:.1f} ms (target prefill "
          f"{sst.t_prefill_target * 1e3:.1f}, catch-up {sst.t_prefill_catchup * 1e3:.1f}, first tree "
          f"{sst.t_prefill_tree * 1e3:.1f})")


def test_step_costs():
    """Per-call cost of the compiled draft level and verify steps in isolation (prints only)."""
    model = smollm2_shaped(torch.bfloat16)
    target = wrap_model(model)
    draft = Eagle3Draft(draft_config_from_target(model.config, aux_layer_ids=[2, 15, 27])).to("cuda", torch.bfloat16)
    prop = EagleProposer(draft.eval(), TreeSpec(total=60, depth=7, topk=10), 512)
    prop.compile()
    aux = torch.randn(41, 3, 576, device="cuda", dtype=torch.bfloat16)
    seq = list(range(100, 142))
    prop.observe(seq, aux, 0)
    for name, fn in (("observe(pad)", lambda: prop.observe(seq, aux[:8], 33)), ("propose", prop.propose)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        print(f"{name}: {(time.perf_counter() - t0) / 20 * 1e3:.2f} ms")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graphed_ar_equals_eager(temperature):
    """The graphed, one-step-ahead AR baseline (decode/autoregressive.py) generates what the eager loop does:
    greedy, and sampled from the same seed, in fp32, across a KV bucket switch and up to EOS."""
    model = smollm2_shaped(torch.float32)
    target = wrap_model(model)
    cap, n = 512, 200
    runner = TargetRunner(model, target.layout, [2, 15, 27], cap, min_bucket=128)
    runner.compile_inner()
    prompt = torch.randint(0, 49000, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    gen = lambda: torch.Generator().manual_seed(11)  # noqa: E731
    eager, _ = ar_generate(runner, prompt, n, temperature=temperature, generator=gen(), graphs=False)
    graphed, st = ar_generate(runner, prompt, n, temperature=temperature, generator=gen())
    assert graphed == eager
    stop = {eager[n // 2]}  # EOS mid-way: both stop at its first occurrence, the graphed loop one step ahead
    e2, _ = ar_generate(runner, prompt, n, temperature=temperature, generator=gen(), graphs=False, eos_ids=stop)
    g2, _ = ar_generate(runner, prompt, n, temperature=temperature, generator=gen(), eos_ids=stop)
    assert g2 == e2 and e2[-1] in stop
    graphed, st = ar_generate(runner, prompt, n, temperature=temperature, generator=gen())
    print(f"\nT={temperature}: graphed AR {(n - 1) / (st.t_total - st.t_prefill):.0f} tok/s")


def test_graphed_prefill_equals_eager():
    """Prefill as CUDA graphs of padded chunks (decode/prefill.py) against the eager prefill at the prompt's own
    length, fp32: the same last-row logits and aux states, one chunk or three (2,048 + 2,048 + a padded 64), and
    the same greedy continuation; the two prefills' times of a 1,024-token prompt print."""
    from eyas.decode.prefill import GraphedPrefill, prefill

    model = smollm2_shaped(torch.float32)
    target = wrap_model(model)
    runner = TargetRunner(model, target.layout, [2, 15, 27], 4300, min_bucket=1024)
    assert runner.graph_prefill
    GraphedPrefill.for_runner(runner).warm()
    for n in (40, 1024, 4150):
        prompt = torch.randint(0, 49000, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        g_logits, g_aux = prefill(runner, prompt)
        runner.graph_prefill = False
        e_logits, e_aux = prefill(runner, prompt)
        runner.graph_prefill = True
        torch.testing.assert_close(g_logits, e_logits, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(g_aux, e_aux, rtol=1e-3, atol=1e-3)
    prompt = torch.randint(0, 49000, (300,), generator=torch.Generator().manual_seed(5)).tolist()
    graphed, _ = ar_generate(runner, prompt, 64)
    runner.graph_prefill = False
    eager, _ = ar_generate(runner, prompt, 64)
    assert graphed == eager
    long = torch.randint(0, 49000, (1024,), generator=torch.Generator().manual_seed(9)).tolist()
    for mode in (True, False):
        runner.graph_prefill = mode
        prefill(runner, long)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            prefill(runner, long)
        torch.cuda.synchronize()
        print(f"\nprefill of 1,024 tokens, {'graphed' if mode else 'eager'}: {(time.perf_counter() - t0) / 5 * 1e3:.1f} ms")
