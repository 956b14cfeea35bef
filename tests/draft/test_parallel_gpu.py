"""GPU: the parallel drafters on the compiled paths. Decoding: on a SmolLM2-shaped random Llama, the static-buffer
decoder (captured round graphs around compiled draft and target steps) is token-identical to the compiled AR
baseline in fp32 for chains and trees, a round syncs at most once, per-round draft/verify times print. Training:
compiled (flex masks, compiled layers and loss, one shape per step) trains the run eager dense training trains.
Run: python -m pytest -q -s -m gpu tests/draft/test_parallel_gpu.py"""

import json
import time
import warnings

import pytest
import torch

from eyas.decode.speculative import SpecDecoder, ar_generate
from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import TreeSpec
from eyas.draft.kinds import build_draft, draft_config, get_kind
from eyas.target import wrap_model
from eyas.train import TrainConfig, train
from tests.decode.test_decode_gpu import smollm2_shaped
from tests.train.fakes import FakePrepared, make_rows, tiny_target, vocab_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
KINDS = ["p-eagle", "dflash"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_parallel_decoding(kind, dtype):
    model = smollm2_shaped(dtype)
    target = wrap_model(model)
    dc = draft_config(model.config, kind, aux_layer_ids=[2, 15, 27], parallel_tokens=7,
                      mask_token_id=target.layout.vocab_size - 1)
    draft = build_draft(dc).to("cuda", dtype).eval()
    draft.init_from_target(target.layout.embed.weight, target.layout.lm_head.weight, target.layout.norm.weight)
    cap = 512
    runner = TargetRunner(model, target.layout, dc.aux_layer_ids, cap, min_bucket=128)
    runner.compile()
    runner.compile_inner()
    prompt = torch.randint(0, 49000, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    n = 128
    for _ in range(2):
        ref, st = ar_generate(runner, prompt, n)
    ar_s = (st.t_total - st.t_prefill) / (n - 1)
    for spec in (TreeSpec.chain(7), TreeSpec(total=60, depth=7, topk=10)):
        prop = get_kind(kind).proposer(draft, spec, cap)
        prop.compile_inner()
        dec = SpecDecoder(runner, prop)
        for _ in range(2):
            out, sst = dec.generate(prompt, n)
        assert dec._graphs, "round graphs were not captured"
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _, st2 = dec.generate(prompt, n)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
        assert len(syncs) <= st2.steps + 8, (len(syncs), st2.steps, [str(w.message)[:80] for w in syncs[:5]])
        if dtype == torch.float32:
            assert out == ref, spec.label()
        print(f"{kind} {dtype} {spec.label()}: tau {sst.tau:.2f}, per round: draft {sst.t_draft / sst.steps * 1e3:.2f} "
              f"ms, verify {sst.t_verify / sst.steps * 1e3:.2f} ms (AR token {ar_s * 1e3:.2f} ms)")


@pytest.mark.parametrize("kind", KINDS)
def test_compiled_training_equals_eager(tmp_path, kind):
    """fp32 (autocast off): compiled flex training with padded static shapes logs the eager dense run's losses."""
    target = tiny_target(hidden=64)
    target.model.cuda()
    rows = make_rows(16, length=64, docs=3)
    prepared = FakePrepared(rows, *vocab_for(rows, 64))
    runs = {}
    for compiled in (False, True):
        cfg = TrainConfig(target="tiny-llama", out=tmp_path / str(compiled), data=tmp_path / "p", online=True,
                          draft_kind=kind, draft_layers=2, ttt_steps=3, batch_size=4, steps=6, lr=1e-3,
                          eval_fraction=0.25, eval_every=3, log_every=1, progress=False, tensorboard=False,
                          device="cuda", seed=0, dtype="fp32", target_dtype="fp32", compile=compiled, pad_to=64,
                          attention="flex" if compiled else "dense", mask_token_id=95, anchors=16)
        t = time.perf_counter()
        train(cfg, target=target, dataset=prepared)
        print(f"{kind} compiled={compiled}: {time.perf_counter() - t:.1f} s")
        runs[compiled] = [json.loads(x) for x in (tmp_path / str(compiled) / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(runs[False], runs[True], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=2e-3), (a, b)
