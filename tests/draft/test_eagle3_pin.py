"""EAGLE-3 pinned end to end: a fixed seed trains a tiny draft (logged losses), decodes with it (chain and tree τ,
3 decimals) and exports it (bytes). The drafter registry moved EAGLE-3 behind a lookup; these numbers were
recorded before it did and must not move: any change to the math, the data order or the export shows here."""

import hashlib
import json

import pytest
import torch

from eyas.decode.speculative import SpecDecoder, ar_generate
from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import TreeSpec
from eyas.draft.io import load_draft
from eyas.draft.kinds import get_kind
from eyas.export import export_vllm, read_export
from eyas.train import TrainConfig, train
from tests.train.fakes import VOCAB, FakePrepared, FakeStore, save_tiny_target, tiny_target, vocab_for

LOSSES = [15.1805, 13.0323, 11.7267, 10.6622, 10.3862, 9.8548, 9.8719, 9.6913]
TAU = {"chain-3": 1.300, "tree(total=12,depth=4,topk=3)": 1.603}
WEIGHTS_SHA = "dd1f9ef5af57be002afb875ad791a7dd50903fdd810bce4270413212add28b83"
CONFIG_SHA = "95ada3a57ba63843d50ef3f41a4811ea71f2b553a7f49e7b0618d0add2a1de66"


def greedy_rows(target, n=16, prompt=4, new=28, seed=3):
    """The target's own greedy text (low entropy): a few dozen steps give a draft that is often accepted."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = target.model.generate(torch.randint(0, VOCAB, (1, prompt), generator=g), max_new_tokens=new,
                                     min_new_tokens=new, do_sample=False)[0]
        T = prompt + new
        rows.append({"input_ids": ids, "loss_mask": torch.arange(T) >= prompt, "position_ids": torch.arange(T)})
    return rows


def train_on_greedy_text(root, runs: dict[str, dict]):
    """Train one run per name (TrainConfig overrides) on the tiny target's greedy text, 40 steps by default.
    Returns the target."""
    target = tiny_target()
    rows = greedy_rows(target)
    d2t, t2d = vocab_for(rows, 64)
    store, prepared = FakeStore(rows, target), FakePrepared(rows, d2t, t2d)
    for name, over in runs.items():
        cfg = TrainConfig(**{**dict(target="tiny-llama", out=root / name, store=root / "store", ttt_steps=3,
                                    batch_size=2, steps=40, lr=3e-3, eval_fraction=0.0, log_every=5, save_every=100,
                                    seed=7, progress=False, tensorboard=False, device="cpu"), **over})
        train(cfg, target=target, store=store, dataset=prepared)
    return target


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pin")
    return root, train_on_greedy_text(root, {"run": {}})


def test_losses_are_pinned(run):
    root, _ = run
    logged = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [round(m["loss"], 4) for m in logged if m["split"] == "train"] == LOSSES


def test_tau_is_pinned(run):
    root, target = run
    draft, _ = load_draft(root / "run")
    assert draft.config.kind == "eagle3"
    kind = get_kind(draft.config)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 9, 13)]
    runner = TargetRunner(target.model, target.layout, draft.config.aux_layer_ids, 160)
    for spec in (TreeSpec.chain(3), TreeSpec(total=12, depth=4, topk=3)):
        emitted = steps = 0
        for p in prompts:
            ref, _ = ar_generate(runner, p, 40)
            out, st = SpecDecoder(runner, kind.proposer(draft, spec, 160)).generate(p, 40)
            assert out == ref
            emitted, steps = emitted + st.emitted, steps + st.steps
        assert round(emitted / steps, 3) == TAU[spec.label()], spec.label()


def test_export_bytes_are_pinned(run):
    root, _ = run
    tdir = save_tiny_target(root / "target")
    out = export_vllm(root / "run", root / "export", verifier=str(tdir))
    config, _ = read_export(out)
    config.pop("eyas")                                  # provenance: paths and the eyas version
    config["speculators_config"]["verifier"].pop("name_or_path")
    assert hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest() == WEIGHTS_SHA
    assert hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest() == CONFIG_SHA
