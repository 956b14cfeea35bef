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


@pytest.mark.slow
def test_multi_gpu_online_stage_times_the_real_trainer_on_one_and_two_processes(tmp_path):
    # the real `eyas train --online` under torchrun on a tiny target and prepared rows: both runs log windows,
    # the summary compares all ranks' tokens/s at the same rows per process
    import importlib.util

    from eyas.cli import main

    spec = importlib.util.spec_from_file_location("templates", ROOT / "tests" / "data" / "templates.py")
    templates = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(templates)
    target = templates.make_model_dir(tmp_path / "target")
    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"tell me about topic {i} please"},
                                              {"from": "gpt", "value": f"topic {i} is a fine topic indeed"}]}
             for i in range(64)]
    (tmp_path / "data.json").write_text(json.dumps(convs))
    assert main(["prepare", "--target", str(target), "--data", str(tmp_path / "data.json"), "--out",
                 str(tmp_path / "prep"), "--max-length", "512", "--draft-vocab-size", "64"]) == 0
    env = dict(os.environ, STAGES="online", TARGET=str(target), PREPARED=str(tmp_path / "prep"), ONLINE_STEPS="6",
               ONLINE_BATCH="2", ONLINE_LOG_EVERY="2", ONLINE_ARGS="--ttt-steps 2", PYTHON=sys.executable,
               WORK=str(tmp_path / "work"), OMP_NUM_THREADS="1")
    r = subprocess.run(["bash", str(ROOT / "bench" / "multi_gpu.sh"), str(tmp_path / "out")], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "out" / "online-summary.json").read_text())
    assert s["world"] == 2 and s["one"]["windows"] == s["many"]["windows"] == 2
    assert s["speedup"] == pytest.approx(s["many"]["tokens_per_s"] / s["one"]["tokens_per_s"], rel=1e-2)
