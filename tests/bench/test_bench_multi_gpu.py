"""bench/multi_gpu.sh on CPU (gloo, tiny): a real kill -9 of rank 0 mid-run, then --resume, gives the
uninterrupted run's losses; extraction over 2 ranks makes one store that the validating reader opens."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_multi_gpu_script_resume_and_extract_on_cpu(tmp_path):
    env = dict(os.environ, TINY="1", STAGES="resume extract", TOKENS="1024", PYTHON=sys.executable,
               WORK=str(tmp_path / "work"), OMP_NUM_THREADS="1")
    r = subprocess.run(["bash", str(ROOT / "bench" / "multi_gpu.sh"), str(tmp_path / "out")], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "resume.json").read_text())
    after_kill = (tmp_path / "out" / "resume-checkpoints-after-kill.txt").read_text().split()
    assert after_kill == ["step-2", "step-4"]          # killed after step 5: step-6 never written
    assert res["complete"] and res["max_rel_diff"] < 1e-5 and len(res["steps"]) == 8
    ex = json.loads((tmp_path / "out" / "extract-summary.json").read_text())
    assert ex["store_valid"] and ex["world"] == 2
