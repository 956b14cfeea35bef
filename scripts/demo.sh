#!/usr/bin/env bash
# The main job: the end-to-end demo on the built-in model (smollm2-135m) and dataset (sharegpt).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/venv.sh"
cd "$ROOT"
exec eyas demo "$@"
