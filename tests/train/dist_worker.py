"""torchrun worker for test_dist.py: python -m torch.distributed.run --nproc_per_node 2 dist_worker.py OUT ddp fsdp

One launch trains a run per strategy (process start-up and imports dominate the cost)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from eyas.train import TrainConfig, train  # noqa: E402
from eyas.train.dist import unwrap  # noqa: E402,F401
from tests.train.fakes import FakePrepared, FakeStore, make_rows, tiny_target, vocab_for  # noqa: E402

torch.set_num_threads(1)
root, modes = Path(sys.argv[1]), sys.argv[2:]
target = tiny_target()
rows = make_rows(10, length=20)
store = FakeStore(rows, target)
prepared = FakePrepared(rows, *vocab_for(rows, 64))
for how in modes:
    out = root / how
    cfg = TrainConfig(target="tiny-llama", out=out, store=out / "store", ttt_steps=2, batch_size=2, steps=3, lr=1e-3,
                      eval_fraction=0.2, eval_every=3, save_every=2, log_every=1, parallel=how, progress=False,
                      tensorboard=False, device="cpu", seed=3)
    train(cfg, target=target, store=store, dataset=prepared)
