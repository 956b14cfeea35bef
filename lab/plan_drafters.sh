#!/usr/bin/env bash
# One H200 session (lab/GPU.md "Next sessions" C): P-EAGLE and DFlash beside EAGLE-3 on SmolLM2 at equal data, each
# on Spec-Bench natively and served by vLLM 0.26 (issue 39 items 3, 4). Jobs run as lanes (lab/lanes.sh); results
# under /tmp/res come back in $OUT/lanes.tgz with every call.
#   bash lab/plan_drafters.sh JOB    JOB: prep drafters (or tick, below)
# Carry (lab/gpu_carry.sh pack, ITEMS="eyas-deps model sharegpt vllm-deps vllm", 48 MiB parts); on every call,
# carrying the next part:   bash lab/plan_drafters.sh tick [WAIT_S]
# tick receives the parts, snapshots the tree once, starts `prep` when eyas's deps, SmolLM2 and ShareGPT are in and
# `drafters` once `prep` succeeded and vLLM is in; then waits up to WAIT_S (default 20) and packs logs and results.
# `drafters` is the package's recipe (eyas run drafters): rerunning it continues where the budget cut it, so a
# tick after it ended with steps left (rc 3) starts it again while budget is left. Knobs: DR_BUDGET (s per start,
# default 1200), DR_ROWS (ShareGPT rows re-answered, default 6000), DR_SET (extra --set items).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = tick ]; then
  PLAN=lab/plan_drafters.sh; . lab/tick.sh
  have eyas-deps model sharegpt && lane prep
  have vllm-deps vllm && ok prep && lane drafters
  # steps left after the first start (rc 3): one more start of the same recipe, which resumes
  have vllm-deps vllm && [ "$(cat "$L/drafters.rc" 2>/dev/null)" = 3 ] && lane drafters2 drafters
  bash lab/lanes.sh wait "${2:-20}"
  exit 0
fi
. /tmp/eyas-env.sh
export PYTHONUNBUFFERED=1 EYAS_CACHE=/tmp/ec
R=/tmp/res W=/tmp/w/drafters
E="python3 -m eyas.cli"
mkdir -p $R /tmp/w

case "${1:-}" in
  prep)      # equal data for every kind: ShareGPT re-answered by the target (target-written rows train best)
    $E regenerate --target /tmp/smol-hf --data /tmp/sharegpt.json --max-samples "${DR_ROWS:-6000}" \
        --out /tmp/w/regen-c.jsonl --backend native --batch-size 512 --max-new-tokens 512 --device cuda \
        --json > $R/regen_c.json &&
    $E prepare --target /tmp/smol-hf --data /tmp/w/regen-c.jsonl --out /tmp/w/prep-c --max-length 2048 \
        --json > $R/prepare_c.json ;;
  drafters)  # eagle3, p-eagle, dflash at equal data (then equal GPU-minutes), native evals, vLLM sweeps + checks
    $E run drafters --out $W --budget "${DR_BUDGET:-1200}s" --set target=/tmp/smol-hf prepared=/tmp/w/prep-c \
        device=cuda python=/tmp/vpy eval_per_category=2 ${DR_SET:-}; rc=$?
    cp $W/result.json $R/drafters.json 2>/dev/null; cp $W/eval-*.json $W/serve-*.json $W/check-*.json $R/ 2>/dev/null
    exit $rc ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
