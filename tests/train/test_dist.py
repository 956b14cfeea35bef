"""Two gloo processes on CPU through torchrun: DDP and FSDP2 train the same run to the same numbers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eyas.draft.io import load_draft

WORKER = Path(__file__).with_name("dist_worker.py")


def _torchrun(out: Path, *modes: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(WORKER.parents[2] / "src"))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(WORKER), str(out), *modes], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_ddp_and_fsdp2_agree(tmp_path):
    _torchrun(tmp_path, "ddp", "fsdp")
    runs = {how: [json.loads(x) for x in (tmp_path / how / "metrics.jsonl").read_text().splitlines()]
            for how in ("ddp", "fsdp")}
    assert [m["step"] for m in runs["ddp"]] == [m["step"] for m in runs["fsdp"]] and len(runs["ddp"]) >= 4
    for a, b in zip(runs["ddp"], runs["fsdp"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), (a, b)
    wa, _ = load_draft(tmp_path / "ddp")
    wb, _ = load_draft(tmp_path / "fsdp")
    for k, v in wa.state_dict().items():
        torch.testing.assert_close(v, wb.state_dict()[k], rtol=1e-4, atol=1e-6)
    assert (tmp_path / "fsdp" / "checkpoints" / "step-2" / "state.pt").is_file()
