"""FlexAttention decode step (decode_attention="flex"): the same greedy tokens as the SDPA step and HF `generate`
across retirement/refill and block boundaries; block tables that follow pos in place (same addresses: the CUDA
graph requirement); the attention function equal to SDPA with the additive mask, eager and compiled (the compiled
CPU kernel reads the block tables: corrupting them changes its output); graph="compile" equal to eager."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from transformers.integrations.sdpa_attention import repeat_kv

import eyas.data.flex_decode as fd
from eyas.data.flex_decode import DecodeBlockMask, flex_decode_attention, kv_block_size
from eyas.data.generate import Generator
from tests.data.test_generate import BUDGETS, hf_greedy, prompts, tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture(scope="module")
def model():
    return tiny_llama(64)  # 16-wide heads: flex's kernels need head_dim >= 16


@pytest.fixture
def flex_calls(monkeypatch):
    """Counts flex_attention calls, so a test cannot pass by every step falling back to SDPA."""
    calls = []
    real = fd._flex

    def counted(device):
        f = real(device)
        return lambda *a, **kw: calls.append(a[0].shape) or f(*a, **kw)

    monkeypatch.setattr(fd, "_flex", counted)
    return calls


def small_blocks(monkeypatch, block):
    if block is not None:  # rows then cross several block boundaries within the tiny budgets
        monkeypatch.setattr(fd, "kv_block_size", lambda capacity: block)


@pytest.mark.parametrize("capacity,block", [(64, None), (100, None), (64, 16), (40, 16)])
@pytest.mark.parametrize("batch", [1, 3])
def test_flex_matches_sdpa_and_hf_greedy(model, monkeypatch, flex_calls, batch, capacity, block):
    ps = prompts()
    eos = hf_greedy(model, ps[0], BUDGETS[0], -1)[0][4]  # a token the model emits: some rows stop early
    budgets = [3 * n for n in BUDGETS]  # some rows end by the cache (answer <= capacity - prompt)
    ref = [hf_greedy(model, p, min(n, capacity - len(p)), eos) for p, n in zip(ps, budgets)]
    assert {r for _, r in ref} == {"stop", "length"}
    assert Generator(model, batch_size=batch, capacity=capacity, eos=[eos]).generate(ps, budgets) == ref
    small_blocks(monkeypatch, block)
    gen = Generator(model, batch_size=batch, capacity=capacity, eos=[eos], decode_attention="flex")
    assert gen.flex.block == (block or kv_block_size(capacity))
    assert gen.generate(ps, budgets) == ref
    assert max(len(p) + len(t) for p, (t, _) in zip(ps, ref)) > 2 * gen.flex.block or block is None
    assert flex_calls and all(s[2] == 2 for s in flex_calls)  # g = 2 query heads per KV head, packed as rows
    assert gen.stats["steps"] > 0 and model.config._attn_implementation == "sdpa"


def test_block_sizes():
    assert [kv_block_size(L) for L in (1024, 1088, 64, 100, 40)] == [128, 64, 64, 128, 128]


def test_block_tables_follow_pos_in_place(model, monkeypatch):
    """During a real run (refills, rows crossing 16-column blocks): after every refresh each row has one partial
    block (the one holding pos) and pos // 16 full blocks before it, ceil((pos + 1) / 16) in all, in tensors
    that keep their addresses; the visited blocks are create_block_mask's for the same mask_mod."""
    small_blocks(monkeypatch, 16)
    gen = Generator(model, batch_size=3, capacity=64, eos=[-1], decode_attention="flex")
    m = gen.flex
    ptrs = [t.data_ptr() for t in m.tensors()]
    bm = m.block_mask(2)
    seen, real = [], m.refresh

    def spy():
        real()
        seen.append((m.pos.clone(), m.kv_num_blocks.clone(), m.kv_indices[..., 0].clone(),
                     m.full_kv_num_blocks.clone(), bm.to_dense()[:, 0, 0].clone()))

    monkeypatch.setattr(m, "refresh", spy)
    gen.generate(prompts(), [30] * 8)
    assert len(seen) == gen.stats["steps"] and [t.data_ptr() for t in m.tensors()] == ptrs
    assert m.block_mask(2) is bm and bm.kv_num_blocks is m.kv_num_blocks
    assert m.full_kv_indices[..., :4].flatten().tolist() == [0, 1, 2, 3] * 3
    crossed = set()
    for pos, num, part, full, dense in seen:
        assert num.flatten().tolist() == [1, 1, 1]
        assert part.flatten().tolist() == (pos // 16).tolist() == full.flatten().tolist()
        assert (num + full).flatten().tolist() == [-(-(p + 1) // 16) for p in pos.tolist()]
        ref = create_block_mask(lambda b, h, q, kv: kv <= pos[b], 3, 1, 2, 64, device="cpu", BLOCK_SIZE=(128, 16))
        assert torch.equal(dense, ref.to_dense()[:, 0, 0])
        crossed |= set((pos // 16).tolist())
    assert crossed == {0, 1, 2, 3}  # every block of the cache was some row's partial block


def attention_inputs(B, hkv, g, L, pos, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, T, d, generator=gen) for n, T in ((hkv * g, 1), (hkv, L), (hkv, L)))
    neg = torch.finfo(torch.float32).min
    mask = torch.zeros(B, L).masked_fill(torch.arange(L)[None] > pos[:, None], neg)[:, None, None, :]
    return q, k, v, mask


@pytest.mark.parametrize("g", [1, 3])
@pytest.mark.parametrize("L,block", [(64, 16), (40, 16), (100, None)])
def test_attention_equals_sdpa_with_additive_mask(monkeypatch, flex_calls, g, L, block):
    pos = torch.tensor([0, 15, 16, L - 1, 31, 7])  # first column, block edges, the last column
    q, k, v, mask = attention_inputs(6, 2, g, L, pos)
    m = DecodeBlockMask(pos, L, block)
    monkeypatch.setattr(fd, "_active", m)
    ref = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, g), repeat_kv(v, g), attn_mask=mask,
                                                           scale=0.3).transpose(1, 2)
    out, weights = flex_decode_attention(torch.nn.Module(), q, k, v, mask, scaling=0.3)
    assert weights is None and out.shape == (6, 1, 2 * g, 16) and out.is_contiguous() and len(flex_calls) == 1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # the additive mask is not read: the block mask alone says what each row sees
    torch.testing.assert_close(flex_decode_attention(torch.nn.Module(), q, k, v, None, scaling=0.3)[0], ref,
                               rtol=1e-5, atol=1e-5)


def test_compiled_kernel_reads_the_tables_as_they_change():
    """torch.compile(flex_attention) on CPU runs a block-sparse kernel (eager flex ignores the tables): equal to
    SDPA for new pos values written in place (no recompile needed), and wrong when the tables are wrong."""
    B, hkv, g, L = 5, 2, 3, 40
    pos = torch.tensor([0, 15, 16, 31, 39])
    m = DecodeBlockMask(pos, L, 16)
    flex = torch.compile(flex_attention, dynamic=False)
    for p in ([0, 15, 16, 31, 39], [39, 0, 17, 20, 33]):
        pos.copy_(torch.tensor(p))
        m.refresh()
        q, k, v, mask = attention_inputs(B, hkv, g, L, pos)
        q = q.reshape(B, hkv, g, 16)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        torch.testing.assert_close(flex(q, k, v, block_mask=m.block_mask(g), scale=0.3), ref, rtol=1e-5, atol=1e-5)
    m.full_kv_num_blocks.zero_()  # rows then skip the blocks below their own
    assert not torch.allclose(flex(q, k, v, block_mask=m.block_mask(g), scale=0.3), ref, atol=1e-3)


@pytest.mark.parametrize("case", ["prefill", "dropout", "softcap", "sliding_window", "narrow_heads", "inactive",
                                  "other_cache"])
def test_unsupported_cases_go_to_grouped_sdpa(monkeypatch, flex_calls, case):
    calls = []
    monkeypatch.setattr(fd, "grouped_decode_attention", lambda *a, **kw: calls.append((a, kw)) or ("grouped", None))
    pos = torch.tensor([3, 9])
    q, k, v, mask = attention_inputs(2, 2, 3, 32, pos)
    if case != "inactive":
        monkeypatch.setattr(fd, "_active", DecodeBlockMask(pos, 48 if case == "other_cache" else 32))
    kw = {"dropout": {"dropout": 0.1}, "softcap": {"softcap": 30.0},
          "sliding_window": {"sliding_window": 8}}.get(case, {})
    if case == "prefill":
        q = torch.randn(2, 6, 4, 16)
    if case == "narrow_heads":
        q, k, v = q[..., :8], k[..., :8], v[..., :8]
    assert flex_decode_attention(torch.nn.Module(), q, k, v, mask, **kw)[0] == "grouped"
    assert len(calls) == 1 and calls[0][0][1] is q and calls[0][0][4] is mask and not flex_calls


def test_rejects_unknown_decode_attention(model):
    with pytest.raises(ValueError, match="'sdpa' or 'flex'"):
        Generator(model, batch_size=1, capacity=32, eos=[-1], decode_attention="flash")


def test_compiled_flex_step_equals_eager(model, monkeypatch):
    """graph="compile" with flex (inductor's CPU flex kernel, which reads the block tables) gives the eager
    SDPA answers, with 16-column blocks that the rows cross."""
    small_blocks(monkeypatch, 16)
    eos = 96
    ref = Generator(model, batch_size=3, capacity=64, eos=[eos], graph="eager").generate(prompts()[:4], 30)
    gen = Generator(model, batch_size=3, capacity=64, eos=[eos], graph="compile", decode_attention="flex")
    assert gen.mode == "compile" and gen.generate(prompts()[:4], 30) == ref
    assert max(len(p) + len(t) for p, (t, _) in zip(prompts(), ref)) > 32


def test_regenerate_attention_flex_gives_the_sdpa_answers(tmp_path, flex_calls):
    """`eyas regenerate --backend native --attention flex`: the flag reaches the generator (flex runs) and the
    conversations written are the SDPA step's (fp32: token-identical)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from eyas.data.regenerate import RegenerateConfig, regenerate
    from tests.data.templates import make_tokenizer
    from tests.data.test_generate import conversations

    tok = make_tokenizer("smollm2")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)).save_pretrained(tmp_path / "t")
    tok.save_pretrained(tmp_path / "t")
    data, rows = conversations(tmp_path), {}
    for attn in ("sdpa", "flex"):
        before = len(flex_calls)
        out = tmp_path / f"{attn}.jsonl"
        r = regenerate(RegenerateConfig(target=str(tmp_path / "t"), data=str(data), out=out, backend="native",
                                        attention=attn, max_new_tokens=6, max_prompt_tokens=200, batch_size=3,
                                        device="cpu"))
        assert r["written"] >= 4 and (len(flex_calls) > before) == (attn == "flex")
        rows[attn] = out.read_text()
    assert rows["flex"] == rows["sdpa"]
