"""GPU paths: compiled FlexAttention TTT (forward and gradients) equals the dense path; a bf16-autocast run
learns. Run on a CUDA machine: `python -m pytest -q -m gpu tests/train/test_train_gpu.py`."""

import json

import pytest
import torch

from eyas.draft.model import Eagle3Draft, compile_flex_attention, draft_config_from_target
from eyas.train import TrainConfig, train
from eyas.train.ttt import TTTUnroll
from tests.train.fakes import AUX, FakePrepared, FakeStore, make_rows, tiny_target, vocab_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_compiled_flex_equals_dense_with_gradients():
    compile_flex_attention()
    target = tiny_target(hidden=64)   # compiled flex needs head_dim >= 16
    cfg = draft_config_from_target(target.config, aux_layer_ids=AUX)
    draft = Eagle3Draft(cfg).cuda()
    B, T = 2, 256
    ids = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
    pos = torch.cat([torch.arange(100), torch.arange(156)]).expand(B, T).contiguous().cuda()
    aux = torch.randn(B, T, 3, cfg.target_hidden_size, device="cuda")
    probs = torch.softmax(torch.randn(B, T, cfg.draft_vocab_size, device="cuda"), -1)
    ok = torch.ones(B, T, dtype=torch.bool, device="cuda")
    out = {}
    for kind in ("dense", "flex"):
        draft.zero_grad()
        loss, stats = TTTUnroll(draft, 4, attention=kind)(ids, pos, ok, aux, probs, ok, probs.argmax(-1))
        loss.backward()
        out[kind] = (loss.detach(), stats, draft.layers[0].self_attn.q_proj.weight.grad.clone())
    torch.testing.assert_close(out["dense"][0], out["flex"][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["dense"][2], out["flex"][2], rtol=1e-3, atol=1e-5)


def test_bf16_flex_training_learns(tmp_path):
    target = tiny_target(hidden=64)
    rows = make_rows(16, length=64, docs=3)
    store = FakeStore(rows, target)
    prepared = FakePrepared(rows, *vocab_for(rows, 64))
    cfg = TrainConfig(target="tiny-llama", out=tmp_path / "run", store=tmp_path / "s", ttt_steps=3, batch_size=4,
                      steps=60, lr=3e-3, eval_fraction=0.25, eval_every=20, log_every=10, progress=False,
                      tensorboard=False, device="cuda", seed=0)
    s = train(cfg, target=target, store=store, dataset=prepared)
    m = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    tr = [x for x in m if x["split"] == "train"]
    assert tr[-1]["loss"] < 0.8 * tr[0]["loss"] and tr[-1]["acc"][0] > tr[0]["acc"][0]
    assert s["best_tau"] >= 1.0 and s["mode"] == "offline"


@pytest.mark.parametrize("kind", ["eagle3", "p-eagle", "dflash"])
def test_compiled_online_training_equals_eager_on_cuda(tmp_path, kind):
    """The GPU default (--compile: the target's layers, its head and the loss chunks compiled; the parallel kinds'
    rows padded to one shape) trains the same run as eager, in fp32 (autocast off) so the only difference is the
    fused kernels' summation order."""
    target = tiny_target(hidden=64)
    target.model.cuda()
    rows = make_rows(16, length=64, docs=3)
    prepared = FakePrepared(rows, *vocab_for(rows, 64))
    runs = {}
    for compiled in (False, True):
        cfg = TrainConfig(target="tiny-llama", out=tmp_path / str(compiled), data=tmp_path / "p", online=True,
                          ttt_steps=3, batch_size=4, steps=6, lr=1e-3, eval_fraction=0.25, eval_every=3,
                          log_every=1, progress=False, tensorboard=False, device="cuda", seed=0, dtype="fp32",
                          target_dtype="fp32", compile=compiled, draft_kind=kind,
                          **({} if kind == "eagle3" else {"draft_layers": 2, "mask_token_id": 95, "anchors": 16}))
        train(cfg, target=target, dataset=prepared)
        runs[compiled] = [json.loads(x) for x in (tmp_path / str(compiled) / "metrics.jsonl").read_text().splitlines()]
    assert [m["split"] for m in runs[False]] == [m["split"] for m in runs[True]]
    for a, b in zip(runs[False], runs[True]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3), (a, b)
    assert all(getattr(layer, "_eyas_eager_forward", None) is None for layer in target.layout.layers)
