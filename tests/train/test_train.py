import json

import pytest
import torch

from eyas.config import ConfigError, build_config
from eyas.draft.io import load_draft
from eyas.train import TrainConfig, train
from eyas.train.loop import latest_checkpoint
from tests.train.fakes import FakePrepared, FakeStore, make_rows, tiny_target, vocab_for


@pytest.fixture(scope="module")
def world():
    target = tiny_target()
    rows = make_rows(12, length=24)
    d2t, t2d = vocab_for(rows, 64)
    return target, rows, FakePrepared(rows, d2t, t2d), FakeStore(rows, target)


def cfg(tmp_path, name="run", **kw):
    base = dict(target="tiny-llama", out=tmp_path / name, store=tmp_path / "store", ttt_steps=3, batch_size=2,
                steps=6, lr=1e-3, eval_fraction=0.2, eval_every=3, save_every=3, log_every=1, seed=1,
                progress=False, tensorboard=False, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_overfit_reaches_step0_accuracy(tmp_path, world):
    target, rows, prepared, store = world
    few = FakeStore(rows[:2], target)
    c = cfg(tmp_path, steps=100, lr=1e-2, eval_fraction=0, batch_size=2, ttt_steps=2, log_every=10,
            save_every=1000, warmup_steps=5)
    summary = train(c, target=target, store=few, dataset=FakePrepared(rows[:2], *prepared.vocab()))
    last = metrics(c.out)[-1]
    assert last["split"] == "train" and last["acc"][0] >= 0.95, last
    assert summary["steps"] == 100


def test_eval_every_epoch_adds_an_eval_at_each_epoch_end(tmp_path, world):
    target, rows, prepared, store = world
    c = cfg(tmp_path, steps=None, epochs=2, eval_every=10_000, eval_every_epoch=True)
    summary = train(c, target=target, store=store, dataset=prepared)
    per_epoch = summary["steps"] // 2
    assert per_epoch >= 2 and summary["steps"] == 2 * per_epoch
    assert [m["step"] for m in metrics(c.out) if m["split"] == "eval"] == [per_epoch, 2 * per_epoch]


def test_offline_equals_online(tmp_path, world):
    target, rows, prepared, store = world
    off = train(cfg(tmp_path, "off"), target=target, store=store, dataset=prepared)
    # Online also pads every batch to 32 tokens: padding must change nothing.
    on = train(cfg(tmp_path, "on", online=True, store=None, data=tmp_path / "prep", pad_to=32), target=target,
               dataset=prepared)
    assert off["mode"] == "offline" and on["mode"] == "online"
    assert_same_run(tmp_path / "off", tmp_path / "on")


def assert_same_run(a_dir, b_dir):
    """Two runs logged the same losses and accuracies and wrote the same draft (fp32 tolerance)."""
    m_a, m_b = metrics(a_dir), metrics(b_dir)
    assert [m["split"] for m in m_a] == [m["split"] for m in m_b]
    for a, b in zip(m_a, m_b):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-5), (a, b)
        assert a["acc"] == b["acc"]
    wa, _ = load_draft(a_dir)
    wb, _ = load_draft(b_dir)
    for k, v in wa.state_dict().items():
        torch.testing.assert_close(v, wb.state_dict()[k], rtol=1e-4, atol=1e-5)


def test_compiled_online_equals_eager(tmp_path, world, monkeypatch):
    """--compile (GPU default) compiles the target's layers, its head, the draft's decoder layer and the loss
    chunks: the same run's losses, accuracies and weights as eager (fp32; fused kernels sum in another order), the
    saved draft's names are the eager ones (load_draft below reads them), and the injected target's layers are eager
    again afterwards (the caller may use the target for decoding next). Held-out evals reuse the training step's
    compiled graphs: none is compiled for them (a no_grad forward compiled 4, ~30 s on an H200)."""
    import torch._dynamo.utils as dynamo_utils

    from eyas.train.loop import Trainer

    target, rows, prepared, store = world
    # 3 held-out rows at batch size 2: a full batch and a short one (filled up, uncounted, when compiled)
    kw = dict(online=True, store=None, data=tmp_path / "prep", pad_to=32, steps=4, eval_every=2, save_every=4,
              eval_fraction=0.25)
    train(cfg(tmp_path, "eager", compile=False, **kw), target=target, dataset=prepared)
    evaluate, compiled_at_eval = Trainer.evaluate, []

    def counted(self):
        before = dynamo_utils.counters["stats"]["unique_graphs"]
        out = evaluate(self)
        compiled_at_eval.append(dynamo_utils.counters["stats"]["unique_graphs"] - before)
        return out

    monkeypatch.setattr(Trainer, "evaluate", counted)
    train(cfg(tmp_path, "compiled", compile=True, **kw), target=target, dataset=prepared)
    assert len(compiled_at_eval) >= 2 and compiled_at_eval == [0] * len(compiled_at_eval)
    assert all(getattr(layer, "_eyas_eager_forward", None) is None for layer in target.layout.layers)
    assert_same_run(tmp_path / "eager", tmp_path / "compiled")


def test_run_dir_layout_and_best_checkpoint(tmp_path, world):
    target, rows, prepared, store = world
    c = cfg(tmp_path, tensorboard=True)
    s = train(c, target=target, store=store, dataset=prepared)
    out = c.out
    assert (out / "train_config.yaml").is_file() and (out / "tb").is_dir()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3", "step-6"]
    model, meta = load_draft(out)
    assert meta["aux_layer_ids"] == [0, 2, 3] and meta["train"]["ttt_steps"] == 3
    assert meta["target"]["name"] == "tiny-llama" and meta["target"]["hidden_size"] == 32
    evals = [m for m in metrics(out) if m["split"] == "eval"]
    best = max(evals, key=lambda m: m["tau"])
    assert meta["metrics"]["best_step"] == best["step"] == s["best_step"]
    assert meta["metrics"]["tau"] == pytest.approx(best["tau"])
    assert torch.equal(model.d2t, prepared.vocab()[0]) and torch.equal(model.t2d, prepared.vocab()[1])
    # embeddings are the target's, frozen
    assert torch.equal(model.embed_tokens.weight, target.layout.embed.weight)


def test_a_draft_for_sglang_keeps_the_residual_before_hidden_norm(tmp_path, world):
    """--no-norm-before-residual trains the layer SGLang implements: the SGLang export no longer refuses the draft
    for its norm (this 4-layer toy target's aux id 0 still has no SGLang spelling)."""
    from eyas.export import ContractError, export_sglang

    target, rows, prepared, store = world
    refusals = []
    for nbr in (True, False):
        c = cfg(tmp_path, name=f"run-{nbr}", steps=1, eval_every=1, save_every=1, norm_before_residual=nbr)
        train(c, target=target, store=store, dataset=prepared)
        assert load_draft(c.out)[0].config.norm_before_residual is nbr
        with pytest.raises(ContractError) as e:
            export_sglang(c.out, tmp_path / f"export-{nbr}", verifier=str(tmp_path))
        refusals.append(str(e.value))
    assert "norm_before_residual: true" in refusals[0] and "norm_before_residual" not in refusals[1]


def test_resume_continues_exactly(tmp_path, world):
    target, rows, prepared, store = world
    full = cfg(tmp_path, "full", steps=8, save_every=4, eval_every=4)
    train(full, target=target, store=store, dataset=prepared)
    part = cfg(tmp_path, "part", steps=8, save_every=4, eval_every=4)
    t = train(part.model_copy(update={"steps": 8}), target=target, store=store, dataset=prepared)
    # Simulate a crash after step 4: drop the later checkpoint and log lines, then resume.
    import shutil
    shutil.rmtree(part.out / "checkpoints" / "step-8")
    assert latest_checkpoint(part.out).name == "step-4"
    lines = [m for m in metrics(part.out) if m["step"] <= 4]
    (part.out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    train(part.model_copy(update={"resume": True}), target=target, store=store, dataset=prepared)
    a, b = metrics(full.out), metrics(part.out)
    assert [(m["split"], m["step"]) for m in a] == [(m["split"], m["step"]) for m in b]
    for x, y in zip(a, b):
        assert x["loss"] == y["loss"], (x, y)
    assert t["steps"] == 8


def test_a_run_from_before_a_setting_existed_resumes_with_its_default(tmp_path, world):
    """A run whose record and checkpoint lack a setting added since (the drafter kind, ...) held its default then,
    and its step_decay was the number EAGLE-3's recipe resolves to: a resume that leaves them out is no change."""
    target, rows, prepared, store = world
    c = cfg(tmp_path, steps=4, save_every=2, eval_every=2)
    train(c, target=target, store=store, dataset=prepared)
    new = ("draft_kind", "draft_layers", "mask_token_id", "anchors")
    rec = c.out / "eyas-output.json"
    doc = json.loads(rec.read_text())
    assert doc["settings"]["step_decay"] == 0.8 and doc["settings"]["draft_kind"] == "eagle3"
    doc["settings"] = {k: v for k, v in doc["settings"].items() if k not in new}
    rec.write_text(json.dumps(doc))
    import shutil
    shutil.rmtree(c.out / "checkpoints" / "step-4")                # stopped after step 2
    ck = latest_checkpoint(c.out) / "state.pt"
    state = torch.load(ck, weights_only=True)
    state["config"] = {k: v for k, v in state["config"].items() if k not in new} | {"step_decay": 0.8}
    torch.save(state, ck)
    with pytest.raises(ConfigError, match="--step-decay 0.8"):   # a value given is compared as it is
        train(c.model_copy(update={"resume": True, "step_decay": 0.5}), target=target, store=store, dataset=prepared)
    train(c.model_copy(update={"resume": True}), target=target, store=store, dataset=prepared)
    assert latest_checkpoint(c.out).name == "step-4"


def test_resume_refuses_a_different_data_order(tmp_path, world):
    target, rows, prepared, store = world
    c = cfg(tmp_path, steps=3)
    train(c, target=target, store=store, dataset=prepared)
    with pytest.raises(ConfigError, match="seed"):
        train(c.model_copy(update={"resume": True, "seed": 7, "steps": 6}), target=target, store=store, dataset=prepared)


def test_store_shape_mismatch_is_a_clear_error(tmp_path, world):
    target, rows, prepared, store = world
    with pytest.raises(ValueError, match="aux"):
        train(cfg(tmp_path, aux_layer_ids=[1, 2, 3]), target=target, store=store, dataset=prepared)


def test_yaml_keys_are_flag_names_and_cli_overrides(tmp_path):
    y = tmp_path / "t.yaml"
    y.write_text("target: t\nout: o\nstore: s\nttt-steps: 3\nlr: 0.001\n")
    c = build_config(TrainConfig, {"lr": 0.002}, yaml_path=y)
    assert c.ttt_steps == 3 and c.lr == 0.002 and str(c.store) == "s"
    y.write_text("target: t\nout: o\nttt_stepz: 3\n")
    with pytest.raises(ConfigError, match="ttt_stepz"):
        build_config(TrainConfig, {}, yaml_path=y)


@pytest.mark.parametrize("batch, accum, says, never", [(1, 1, "add data", "--batch-size"),
                                                        (4, 1, "lower --batch-size (now 4)", "--grad-accum"),
                                                        (1, 3, "lower --grad-accum (now 3)", "--batch-size")])
def test_too_few_rows_suggests_only_fixes_that_apply(batch, accum, says, never):
    """"lower --batch-size" is no advice when it is already 1 (issue 18)."""
    from eyas.train.data import Plan

    with pytest.raises(ValueError) as e:
        Plan(n_rows=2, batch_size=batch, grad_accum=accum, eval_fraction=0.9)   # both rows held out
    msg = str(e.value)
    assert says in msg and never not in msg and "lower --eval-fraction (now 0.9, 2 rows held out)" in msg


def test_init_from_continues_a_draft_with_its_own_vocabulary(tmp_path, world):
    """--init-from: a draft continued on other rows starts from its weights and keeps its draft vocabulary (its head
    rows mean the tokens they were trained on), whatever vocabulary the new data would have built."""
    target, rows, prepared, store = world
    first = cfg(tmp_path, "first")
    train(first, target=target, store=store, dataset=prepared)
    other = FakePrepared(rows[6:], *vocab_for(rows[6:], 64))
    assert not torch.equal(other.vocab()[0], prepared.vocab()[0])        # the new data alone would map otherwise
    more = cfg(tmp_path, "more", init_from=first.out, lr=1e-12, steps=1, eval_every=100, save_every=100)
    train(more, target=target, store=FakeStore(rows[6:], target), dataset=other)
    a, _ = load_draft(first.out)
    b, _ = load_draft(more.out)
    for k, v in a.state_dict().items():    # one step at lr 1e-12: the weights it started from
        torch.testing.assert_close(b.state_dict()[k], v, rtol=0, atol=1e-6)
    fresh = cfg(tmp_path, "fresh", lr=1e-12, steps=1, eval_every=100, save_every=100)
    train(fresh, target=target, store=FakeStore(rows[6:], target), dataset=other)
    c, _ = load_draft(fresh.out)
    assert not torch.allclose(c.state_dict()["fc.weight"], a.state_dict()["fc.weight"])
    assert torch.equal(c.d2t, other.vocab()[0])


def test_init_from_another_shape_is_one_line_naming_it(tmp_path, world):
    target, rows, prepared, store = world
    first = cfg(tmp_path, "first")
    train(first, target=target, store=store, dataset=prepared)
    with pytest.raises(ValueError, match=r"--init-from .*first: its norm_before_residual is True, this run's False$"):
        train(cfg(tmp_path, "other", init_from=first.out, norm_before_residual=False), target=target, store=store,
              dataset=prepared)
    with pytest.raises(ValueError, match=r"its draft vocabulary has \d+ tokens, --draft-vocab-size asks for 32$"):
        train(cfg(tmp_path, "small", init_from=first.out, draft_vocab_size=32), target=target, store=store,
              dataset=prepared)
