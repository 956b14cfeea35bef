#!/usr/bin/env bash
# One session on two GPUs (kind nvidia-h200-x2 or nvidia-h100-x2; lab/GPU.md "Next sessions" D): DDP training of
# a draft for the real 1.5B target against one GPU (issue 37 item 6) and the Kimi-K2.5 toy through vLLM with tensor
# and expert parallel 2 (issue 38 item 4). Jobs run as lanes (lab/lanes.sh), one after another (each wants both
# GPUs); results under /tmp/res come back in $OUT/lanes.tgz with every call.
#   bash lab/plan_two_gpus.sh JOB    JOB: mgpu8b online kimi2 (or tick, below)
# Carry (lab/gpu_carry.sh pack, ITEMS="eyas-deps sharegpt qwen15 vllm-deps vllm", 48 MiB parts); on every call,
# carrying the next part:   bash lab/plan_two_gpus.sh tick [WAIT_S]
# tick receives the parts, snapshots the tree once, and starts: mgpu8b with eyas's deps (bench/multi_gpu.sh at the
# 8B shape: DDP and FSDP2 vs one GPU, a kill -9 + resume on 2 processes, extraction over 2 ranks) while the rest
# arrives; online once the 1.5B and ShareGPT are in and mgpu8b ended (the real trainer online on the 1.5B, 1 GPU
# vs 2); kimi2 once vLLM is in and online ended (bench/kimi_toy.py --tp 2: both toys, experts split over the GPUs;
# KIMI_EP=0: tensor parallel alone). Then waits up to WAIT_S (default 20) and packs logs and results.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = tick ]; then
  PLAN=lab/plan_two_gpus.sh; . lab/tick.sh
  have eyas-deps && lane mgpu8b
  have eyas-deps sharegpt qwen15 && ended mgpu8b && lane online
  have eyas-deps vllm-deps vllm && ended mgpu8b online && lane kimi2
  PACK_EXTRA=/tmp/kimi2 bash lab/lanes.sh wait "${2:-20}"
  exit 0
fi
. /tmp/eyas-env.sh
export PYTHONUNBUFFERED=1 EYAS_CACHE=/tmp/ec PYTHON=python3
R=/tmp/res
E="python3 -m eyas.cli"
mkdir -p $R

case "${1:-}" in
  mgpu8b)   # the draft's training step at the 8B shape (random inputs): 1 GPU vs DDP / FSDP2 on 2, resume, extract
    WORK=/tmp/mgpu8b bash bench/multi_gpu.sh $R/mgpu ;;
  online)   # issue 37 item 6: `eyas train --online` on the 1.5B, ShareGPT rows, 1 GPU vs 2 (goal >= 1.8x)
    $E prepare --target qwen2.5-coder-1.5b --data /tmp/sharegpt.json --out /tmp/prep-q15 --max-samples 4000 \
        --max-length 2048 --json > $R/prepare_q15.json || exit 1
    STAGES=online TARGET=qwen2.5-coder-1.5b PREPARED=/tmp/prep-q15 ONLINE_STEPS=${ONLINE_STEPS:-80} \
        ONLINE_BATCH=${ONLINE_BATCH:-4} WORK=/tmp/mgpu-online bash bench/multi_gpu.sh $R/mgpu ;;
  kimi2)    # issue 38 item 4: both toys' steps with every vLLM engine over 2 GPUs (resumable: rerun continues)
    [ "${KIMI_EP:-1}" = 1 ] && ep=--ep || ep=--no-ep
    python3 bench/kimi_toy.py --python /tmp/vpy --work /tmp/kimi2 --out $R/kimi_toy_tp2.json --tp 2 $ep; rc=$?
    (cd /tmp/kimi2 && find . -name '*.log' | tar czf $R/kimi2-logs.tgz -T -); exit $rc ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
