#!/usr/bin/env bash
# Where the eval's tree warm-up goes once inductor's cache is warm (GPU demo of 2026-12-03, second session: chain-3
# 62.6 -> 14.0 s with the background warm-up, the tree only 44.5 -> 35.3 s). Three `eyas eval --warm-only` of a
# random SmolLM2 draft in the demo's eval setting: fresh, then cached without CUDA graphs, then cached with them.
# Run after `bash lab/gpu_carry.sh recv` of parts 0 and 1; JSON to $OUT (or /tmp/warm_probe).
set -euo pipefail
OUT=${OUT:-/tmp/warm_probe}; mkdir -p "$OUT"
export PYTHONPATH=src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
$PY bench/random_draft.py --target /tmp/smol-hf --out /tmp/rd
W=(--target /tmp/smol-hf --draft /tmp/rd --per-category 3 --max-new-tokens 128 --tree total=60,depth=7,topk=10
   --min-bucket 1000000 --compile --warm-only --json)
for run in fresh:1 cached_nographs:0 cached:1; do
  name=${run%%:*}; t=$(date +%s.%N)
  EYAS_DECODE_GRAPHS=${run##*:} $PY -m eyas.cli eval "${W[@]}" --out "$OUT/warm-tree-$name.json" > "$OUT/warm-tree-$name.log" 2>&1
  echo "$name: $(python3 -c "import json;print(json.load(open('$OUT/warm-tree-$name.json'))['seconds'])") warm, $(python3 -c "print(round($(date +%s.%N)-$t,1))") s wall"
done
