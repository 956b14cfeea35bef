"""The prefill in padded chunks (what the GPU replays as CUDA graphs; run eagerly here) equals the prefill at the
prompt's own length: last-row logits, every row's aux states, the KV slots of the prompt, and what decoding
after it generates."""

import pytest
import torch

from eyas.decode.prefill import GraphedPrefill, chunks, prefill
from eyas.decode.speculative import ar_generate
from eyas.decode.target_step import TargetRunner
from eyas.target import wrap_model

from conftest import tiny_llama

WIDTHS = (4, 8, 16)


def test_chunks_pad_the_last_one_to_the_next_width_and_fall_back_near_the_capacity():
    assert chunks(3, 64, WIDTHS) == [(0, 3, 4)]
    assert chunks(16, 64, WIDTHS) == [(0, 16, 16)]
    assert chunks(37, 64, WIDTHS) == [(0, 16, 16), (16, 16, 16), (32, 5, 8)]
    assert chunks(37, 38, WIDTHS) == [(0, 16, 16), (16, 16, 16), (32, 5, None)]   # 32 + 8 > 38: eager, 5 rows
    assert chunks(0, 64, WIDTHS) == []


def runners(capacity=64):
    model = tiny_llama(seed=4).requires_grad_(False)
    target = wrap_model(model)
    make = lambda: TargetRunner(model, target.layout, [1, 2], capacity, min_bucket=16)   # noqa: E731
    exact, padded = make(), make()
    padded.graph_prefill = True
    padded.attached(GraphedPrefill).widths = WIDTHS
    return exact, padded


@pytest.mark.parametrize("n", [1, 5, 16, 37, 62])
def test_padded_chunks_equal_the_prefill_at_the_prompts_length(n):
    exact, padded = runners()
    assert not exact.graph_prefill   # the CPU default
    prompt = torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    logits, aux = prefill(exact, prompt)
    p_logits, p_aux = prefill(padded, prompt)
    V, H = exact.layout.vocab_size, exact.layout.lm_head.weight.shape[1]
    assert p_logits.shape == logits.shape == (1, V) and p_aux.shape == aux.shape == (n, 2, H)
    torch.testing.assert_close(p_logits, logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(p_aux, aux, rtol=1e-4, atol=1e-5)
    kv, p_kv = exact.cache.kv, padded.cache.kv
    torch.testing.assert_close(p_kv[..., :n, :], kv[..., :n, :], rtol=1e-4, atol=1e-5)


def test_decoding_after_a_padded_prefill_is_the_same():
    exact, padded = runners()
    prompt = torch.randint(0, 64, (21,), generator=torch.Generator().manual_seed(7)).tolist()
    out, _ = ar_generate(exact, prompt, 20, graphs=False)
    p_out, _ = ar_generate(padded, prompt, 20, graphs=False)
    assert p_out == out


def test_a_prompt_past_the_capacity_is_refused():
    exact, padded = runners(capacity=16)
    with pytest.raises(ValueError, match="does not fit the KV capacity 16"):
        prefill(padded, list(range(16)))


def test_a_forward_that_cannot_be_captured_turns_the_graphs_off_and_prefills_eagerly(monkeypatch):
    exact, padded = runners()
    gp = padded.attached(GraphedPrefill)

    def refuses(*a, **k):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")
    monkeypatch.setattr(gp, "run", refuses)
    prompt = list(range(1, 30))
    with pytest.warns(RuntimeWarning, match="prefills run eagerly from now on"):
        logits, aux = prefill(padded, prompt)
    assert not padded.graph_prefill and padded.prefill_graph_error.startswith("RuntimeError: operation not permitted")
    e_logits, e_aux = prefill(exact, prompt)
    torch.testing.assert_close(logits, e_logits)
    torch.testing.assert_close(aux, e_aux)


def test_a_turns_first_chunk_attends_causally_without_the_mask_and_the_same(monkeypatch):
    """Slots from 0 with no context: SDPA's causal flag over the chunk's own keys (flash-eligible), later chunks
    keep the mask; the result equals the masked prefill, and the model is on sdpa again afterwards."""
    _, padded = runners()
    masked = runners()[1]
    masked._causal_ok = False
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        calls.append((q.shape[2], k.shape[2], attn_mask is None, is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    prompt = torch.randint(0, 64, (37,), generator=torch.Generator().manual_seed(3)).tolist()
    logits, aux = prefill(masked, prompt)
    assert calls and all(not c[2] for c in calls)
    calls.clear()
    p_logits, p_aux = prefill(padded, prompt)   # chunks (0, 16), (16, 16), (32, 5 -> 8)
    layers = len(padded.layout.layers)
    assert calls[:layers] == [(16, 16, True, True)] * layers
    assert all(not c[2] and not c[3] for c in calls[layers:]) and len(calls) == 3 * layers
    torch.testing.assert_close(p_logits, logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(p_aux, aux, rtol=1e-4, atol=1e-5)
    assert padded.model.config._attn_implementation == "sdpa"


def test_the_eager_prefill_of_a_fresh_turn_is_causal_too_and_eager_attention_models_keep_the_mask(monkeypatch):
    exact, _ = runners()
    assert exact.causal_from_start(16)
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None, is_causal=False, **kw:
                        seen.append((is_causal, q.shape[2], k.shape[2]))
                        or sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw))
    prefill(exact, list(range(1, 12)))   # 11 rows in a KV bucket of 16: the keys past them are not attended
    assert seen and all(c == (True, 11, 11) for c in seen)
    model = tiny_llama(seed=4).requires_grad_(False)
    model.config._attn_implementation = "eager"
    runner = TargetRunner(model, wrap_model(model).layout, [1, 2], 64, min_bucket=16)
    assert not runner.causal_from_start(16)


def test_the_causal_attention_keeps_the_mask_where_it_would_not_be_the_same():
    """A layer that is not causal (an encoder's), a one-row query, or a kwarg sdpa treats specially: the mask is
    used as given."""
    from eyas.decode.target_step import causal_chunk_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))
    k, v = (torch.cat([t, torch.randn(1, 2, 4, 8, generator=g)], 2) for t in (k, v))   # 4 keys past the chunk
    full = torch.zeros(1, 1, 4, 8)          # sees every key, the 4 past the chunk too
    causal = torch.full((4, 8), float("-inf")).triu(1)[None, None]
    causal[..., 4:] = float("-inf")
    layer = torch.nn.Module()
    out, _ = causal_chunk_attention(layer, q, k, v, full)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal)
    torch.testing.assert_close(out, ref.transpose(1, 2))
    layer.is_causal = False
    out, _ = causal_chunk_attention(layer, q, k, v, full)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=full)
                               .transpose(1, 2))
    one, _ = causal_chunk_attention(torch.nn.Module(), q[:, :, :1], k, v, full[:, :, :1])
    torch.testing.assert_close(one, torch.nn.functional.scaled_dot_product_attention(q[:, :, :1], k, v)
                               .transpose(1, 2))


def test_warm_up_captures_every_chunk_a_prompt_can_meet_and_none_past_the_capacity(monkeypatch):
    """What `warm` would capture on a GPU (the capture itself stubbed): each (width, bucket) of a chunk that fits,
    the first chunk's as causal ones; a width that would pass the capacity is skipped, not asked for."""
    _, padded = runners(capacity=40)
    gp = padded.attached(GraphedPrefill)
    gp.capture, keys = True, []
    monkeypatch.setattr(gp, "_graph", lambda w, kv_len, causal: keys.append((w, kv_len, causal)))
    gp.warm()
    assert padded.graph_prefill   # nothing went wrong on the way
    b = padded.bucket
    assert keys == [(4, b(4), True), (8, b(8), True), (16, b(16), True),
                    (4, b(20), False), (8, b(24), False), (16, b(32), False),
                    (4, b(36), False), (8, b(40), False)]


@pytest.mark.parametrize("choice, portable", [("portable", True), ("any", False)])
def test_graphed_chunks_attend_with_the_eager_kernels_unless_told_otherwise(monkeypatch, choice, portable):
    """EYAS_PREFILL_SDPA=any lets a graphed chunk take PyTorch's own SDPA choice (cuDNN on the GPU); by default it
    keeps the eager prefill's (no cuDNN), so both agree. The same tokens either way here (the CPU has one choice)."""
    from eyas.decode import prefill as pf
    entered, real = [], pf.varying_shape_attention

    def recording():
        entered.append(1)
        return real()
    monkeypatch.setattr(pf, "varying_shape_attention", recording)
    monkeypatch.setenv("EYAS_PREFILL_SDPA", choice)
    exact, padded = runners()
    prompt = torch.randint(0, 64, (21,), generator=torch.Generator().manual_seed(7)).tolist()
    entered.clear()
    p_logits, _ = prefill(padded, prompt)
    assert bool(entered) == portable
    torch.testing.assert_close(p_logits, prefill(exact, prompt)[0], rtol=1e-4, atol=1e-5)


def test_compiled_chunks_equal_the_eager_prefill(monkeypatch):
    """EYAS_PREFILL_INNER=compiled: the padded chunks run a torch.compile'd step (what the GPU then captures);
    the same logits, aux states and KV slots as the prefill at the prompt's length."""
    monkeypatch.setenv("EYAS_PREFILL_INNER", "compiled")
    exact, padded = runners()
    assert padded.attached(GraphedPrefill).compiled
    prompt = torch.randint(0, 64, (21,), generator=torch.Generator().manual_seed(7)).tolist()
    logits, aux = prefill(exact, prompt)
    p_logits, p_aux = prefill(padded, prompt)
    torch.testing.assert_close(p_logits, logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(p_aux, aux, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(padded.cache.kv[..., :21, :], exact.cache.kv[..., :21, :], rtol=1e-4, atol=1e-5)
    gp, keys = padded.attached(GraphedPrefill), []   # warm-up compiles nothing: each shape on its first use
    gp.capture = True
    monkeypatch.setattr(gp, "_graph", lambda w, kv_len, causal: keys.append((w, kv_len, causal)))
    gp.warm()
    assert keys == []
