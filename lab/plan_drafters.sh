#!/usr/bin/env bash
# One H200 session (lab/GPU.md "Next sessions" C): P-EAGLE and DFlash beside EAGLE-3 on SmolLM2 at equal data, each
# on Spec-Bench natively and served by vLLM 0.26 (issue 39 items 3, 4). Jobs run as lanes (lab/lanes.sh); results
# under /tmp/res come back in $OUT/lanes.tgz with every call.
#   bash lab/plan_drafters.sh JOB    JOB: prep drafters prep15 drafters15 (or tick, below)
# Carry (lab/gpu_carry.sh pack, ITEMS="eyas-deps model sharegpt vllm-deps vllm", 48 MiB parts); on every call,
# carrying the next part:   bash lab/plan_drafters.sh tick [WAIT_S]
# tick receives the parts, snapshots the tree once, starts `prep` when eyas's deps, SmolLM2 and ShareGPT are in and
# `drafters` once `prep` succeeded and vLLM is in; then waits up to WAIT_S (default 20) and packs logs and results.
# `drafters` is the package's recipe (eyas run drafters): rerunning it continues where the budget cut it, so a
# tick after it ended with steps left (rc 3) starts it again while budget is left. Knobs: DR_BUDGET (s per start,
# default 1200), DR_ROWS (ShareGPT rows re-answered, default 6000), DR_SET (extra --set items).
# C15, the same on Qwen2.5-Coder-1.5B (ITEMS="eyas-deps q15draft qwen15", no vLLM: native only): the rows and the
# EAGLE-3 draft a session brought back (plan_q15_draft.sh back) are the equal data and the reference — `prep15`
# prepares exactly what that draft trained on and seeds the recipe with it as its eagle3:data run (trained there,
# 2 epochs, 450 s on an H100), `drafters15` trains DR15_KINDS (default p-eagle) on the same rows and evaluates
# every kind in one process (eagle3 included: one AR baseline); rerun with DR15_KINDS=p-eagle,dflash to add one.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = tick ]; then
  PLAN=lab/plan_drafters.sh; . lab/tick.sh
  if carried q15draft; then   # C15
    have eyas-deps q15draft qwen15 && lane prep15
    ok prep15 && lane drafters15
    [ "$(cat "$L/drafters15.rc" 2>/dev/null)" = 3 ] && lane drafters15b drafters15
    bash lab/lanes.sh wait "${2:-20}"
    exit 0
  fi
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
  prep15)    # the rows and the EAGLE-3 draft of .carry/q15back: the prep that draft trained on (scaling's prep of its
             # first 36,554 rows), and the recipe's OUT seeded with the draft as eagle3's equal-data run
    T=qwen2.5-coder-1.5b W15=/tmp/w/drafters-q15
    python3 -c "from eyas.target.builtins import builtin_target_dir as d
d('$T')" || exit 2
    mkdir -p /tmp/w/q15r && bash lab/rows_of.sh /tmp/q15draft | tar xz -C /tmp/w/q15r || exit 2
    # DR15_ROWS: the rows the brought-back draft's prep took (B2's 8.5 M point: 36,554; its scaling.log says)
    [ -f /tmp/w/prep-q15/manifest.json ] || $E prepare --target $T --data /tmp/w/q15r/self.jsonl \
        --max-samples "${DR15_ROWS:-36554}" \
        --out /tmp/w/prep-q15 --max-length 2048 --draft-vocab-size 32000 --workers 0 --json > $R/prepare_q15.json ||
        exit 1
    if [ ! -f $W15/state.json ]; then
      python3 lab/restore_draft.py --parts /tmp/q15draft --target /tmp/ec/models/$T --out $W15/run-eagle3-data &&
      python3 -c "import json, sys; json.dump({'done': {'train:eagle3:data': float(sys.argv[2])}}, open(sys.argv[1], 'w'))" \
          $W15/state.json "${DR15_EAGLE3_S:-450.4}" || exit 1
    fi ;;
  drafters15) # p-eagle (and dflash) beside the seeded eagle3 at equal data, native Spec-Bench evals in one process
    W15=/tmp/w/drafters-q15
    $E run drafters --out $W15 --budget "${DR_BUDGET:-1500}s" --set target=qwen2.5-coder-1.5b \
        prepared=/tmp/w/prep-q15 device=cuda kinds=eagle3,${DR15_KINDS:-p-eagle} regimes=data serve=false \
        eval_per_category=2 ${DR_SET:-}; rc=$?
    cp $W15/result.json $R/drafters-q15.json 2>/dev/null; cp $W15/eval-*.json $R/ 2>/dev/null
    exit $rc ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
