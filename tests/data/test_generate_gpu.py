"""GPU: the native generator's FlexAttention decode step under a CUDA graph and under graph="compile", on a
SmolLM2-shaped random Llama (9 heads, 3 KV heads: g = 3, head_dim 64): the same fp32 tokens as the SDPA step,
with rows crossing 128-column blocks, the block tables following pos in place; and the step time of both
attentions in bf16 at batch 256, L 1024, rows at mixed lengths (printed).
Run: python -m pytest -q -s -m gpu tests/data/test_generate_gpu.py"""

from __future__ import annotations

import time

import pytest
import torch

from eyas.data.generate import Generator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def smollm2_shaped(dtype, layers=30):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).to("cuda", dtype).eval()


def test_flex_step_captured_and_compiled_equals_sdpa():
    model = smollm2_shaped(torch.float32, layers=4)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 49000, (n,), generator=g).tolist() for n in (20, 120, 64, 127, 3, 90, 128, 40, 77)]
    ref = Generator(model, batch_size=4, capacity=320, eos=[-1]).generate(prompts, 150)
    for graph in ("cudagraph", "compile"):
        gen = Generator(model, batch_size=4, capacity=320, eos=[-1], graph=graph, decode_attention="flex")
        assert gen.mode == graph and gen.flex.block == 64  # 320: a multiple of 64, not of 128
        ptrs = [t.data_ptr() for t in gen.flex.tensors()]
        assert gen.generate(prompts, 150) == ref
        assert [t.data_ptr() for t in gen.flex.tensors()] == ptrs
        gen.pos.copy_(torch.tensor([0, 63, 64, 319], device="cuda"))
        with torch.inference_mode():  # as in Generator.run
            gen._step()  # the replayed / compiled step rewrites the tables from pos
        assert gen.flex.full_kv_num_blocks.flatten().tolist() == [0, 0, 1, 4]
        assert gen.flex.kv_indices[:, 0, 0, 0].tolist() == [0, 0, 1, 4]


@pytest.mark.parametrize("attn", ["sdpa", "flex"])
@torch.inference_mode()
def test_step_time_bf16_b256_l1024(attn):
    model = smollm2_shaped(torch.bfloat16)
    gen = Generator(model, batch_size=256, capacity=1024, eos=[-1], decode_attention=attn)
    assert gen.mode == "cudagraph"
    gen.pos.copy_(torch.randint(0, 700, (256,), generator=torch.Generator().manual_seed(0)).cuda())  # mean ~350
    for _ in range(3):
        gen._step()
    torch.cuda.synchronize()
    t, n = time.perf_counter(), 50
    for _ in range(n):
        gen._step()
    torch.cuda.synchronize()
    print(f"\n{attn}: {1000 * (time.perf_counter() - t) / n:.2f} ms per decode step (B 256, L 1024, mean pos ~350)")
