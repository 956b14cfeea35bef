#!/usr/bin/env bash
# Create (once) and activate .venv with eyas and its test deps. Sourced by demo.sh and test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EYAS_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
if ! python -c "import eyas, torch, transformers, pytest, hypothesis" >/dev/null 2>&1 \
   || [ "$ROOT/pyproject.toml" -nt "$VENV/.eyas-installed" ]; then
  python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  # torch first: the CPU build pinned here is the one this machine keeps on disk (no CUDA download).
  python -c "import torch" >/dev/null 2>&1 || python -m pip install -q --disable-pip-version-check "torch==2.13.0"
  python -m pip install -q --disable-pip-version-check -e "$ROOT[test]"
  touch "$VENV/.eyas-installed"
fi
