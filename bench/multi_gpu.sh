#!/usr/bin/env bash
# Two GPUs (issue 16): DDP and FSDP2 draft training at the 8B shape vs 1 GPU at the same global batch, a kill -9 +
# resume of the real trainer on 2 processes, and extraction split over 2 ranks vs 1. JSON into $OUT.
#   bash bench/multi_gpu.sh [OUT=bench/results/mgpu]          (GPU machine with 2 GPUs; PYTHONPATH=src is set here)
#   TINY=1 NPROC=2 bash bench/multi_gpu.sh /tmp/mgpu          (CPU smoke run: gloo, tiny shapes)
# STAGES="train resume extract" picks parts (default); STAGES=online TARGET=T PREPARED=P: the real trainer online
# on a real target, 1 process vs NPROC (ONLINE_STEPS, ONLINE_BATCH rows per process, ONLINE_ARGS more flags).
# Needs: torch with torchrun; eyas from src/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/mgpu}
STAGES=${STAGES:-train resume extract}
NPROC=${NPROC:-2}
TINY_FLAG=${TINY:+--tiny}
PY=${PYTHON:-python}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
RUN="$PY -m torch.distributed.run --standalone --nproc-per-node"
WORK=${WORK:-/tmp/eyas-mgpu}
rm -rf "$WORK"; mkdir -p "$WORK"
t0=$SECONDS
stamp() { echo "[multi_gpu.sh +$((SECONDS - t0))s] $*"; }

if [[ " $STAGES " == *" train "* ]]; then
  TR="--global-batch $NPROC --variants fused --long-seq 0 --steps ${STEPS:-6} --warmup 2 --no-profile $TINY_FLAG"
  stamp "train: 1 process, global batch $NPROC"
  $PY bench/train.py $TR --out "$OUT/train-1.json" > "$WORK/train-1.log" 2>&1 || { tail -30 "$WORK/train-1.log"; exit 1; }
  for how in ddp fsdp; do
    stamp "train: $NPROC processes, $how"
    $RUN "$NPROC" bench/train.py $TR --parallel $how --out "$OUT/train-$how.json" > "$WORK/train-$how.log" 2>&1 \
      || { tail -30 "$WORK/train-$how.log"; exit 1; }
  done
  $PY - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
r = {k: json.load(open(f"{out}/train-{k}.json")) for k in ("1", "ddp", "fsdp")}
one = r["1"]["variants"][0]
summary = {"bench": "multi_gpu_train", "global_batch": r["1"]["global_batch"], "one_gpu_tokens_per_s": one["tokens_per_s"],
           "losses_1": one["losses"]}
for k in ("ddp", "fsdp"):
    v = r[k]["variants"][0]
    summary[k] = {"world": r[k]["world"], "tokens_per_s": v["tokens_per_s"], "speedup": round(v["tokens_per_s"] / one["tokens_per_s"], 3),
                  "mfu": v["mfu"], "peak_memory_gib": v["peak_memory_gib"], "losses": v["losses"],
                  "max_rel_loss_diff_vs_1": max(abs(a - b) / abs(b) for a, b in zip(v["losses"], one["losses"]))}
json.dump(summary, open(f"{out}/train-summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY
fi

if [[ " $STAGES " == *" resume "* ]]; then
  stamp "resume: uninterrupted $NPROC-process run"
  $RUN "$NPROC" bench/multi_gpu.py train $TINY_FLAG --run-dir "$WORK/ref" > "$WORK/ref.log" 2>&1 || { tail -30 "$WORK/ref.log"; exit 1; }
  stamp "resume: the same run, rank 0 SIGKILLs itself after step 5"
  if EYAS_BENCH_KILL_AT=5 $RUN "$NPROC" bench/multi_gpu.py train $TINY_FLAG --run-dir "$WORK/killed" > "$WORK/killed.log" 2>&1; then
    echo "the killed run exited 0: the kill did not happen"; exit 1
  fi
  grep -h "SIGKILL" "$WORK/killed.log" || true
  ls "$WORK/killed/checkpoints" > "$OUT/resume-checkpoints-after-kill.txt"
  stamp "resume: --resume from $(tail -1 "$OUT/resume-checkpoints-after-kill.txt")"
  $RUN "$NPROC" bench/multi_gpu.py train $TINY_FLAG --run-dir "$WORK/killed" --resume > "$WORK/resumed.log" 2>&1 \
    || { tail -30 "$WORK/resumed.log"; exit 1; }
  $PY bench/multi_gpu.py compare --ref "$WORK/ref" --run-dir "$WORK/killed" --out "$OUT/resume.json"
fi

if [[ " $STAGES " == *" extract "* ]]; then
  for n in 1 "$NPROC"; do
    stamp "extract: $n process(es)"
    $RUN "$n" bench/multi_gpu.py extract $TINY_FLAG ${TOKENS:+--tokens $TOKENS} --store "$WORK/store" \
      --out "$OUT/extract-$n.json" > "$WORK/extract-$n.log" 2>&1 || { tail -30 "$WORK/extract-$n.log"; exit 1; }
  done
  $PY - "$OUT" "$NPROC" <<'PY'
import json, sys
out, n = sys.argv[1], sys.argv[2]
a, b = json.load(open(f"{out}/extract-1.json")), json.load(open(f"{out}/extract-{n}.json"))
s = {"bench": "multi_gpu_extract", "one": a["tokens_per_s"], "many": b["tokens_per_s"], "world": b["world"],
     "speedup": round(b["tokens_per_s"] / a["tokens_per_s"], 3), "store_valid": b["store_valid"] and a["store_valid"]}
json.dump(s, open(f"{out}/extract-summary.json", "w"), indent=2)
print(json.dumps(s, indent=2))
PY
fi
if [[ " $STAGES " == *" online "* ]]; then
  # The real trainer, online, on a real target (TARGET: HF dir or built-in name; PREPARED: an `eyas prepare` dir):
  # 1 process vs NPROC at the same rows per process, tokens/s of every rank together (metrics.jsonl), the first
  # logged window (compile, warm-up) left out.
  : "${TARGET:?the online stage needs TARGET=...}" "${PREPARED:?the online stage needs PREPARED=...}"
  for n in 1 "$NPROC"; do
    stamp "online: $n process(es), ${ONLINE_STEPS:-60} steps, $TARGET"
    $RUN "$n" -m eyas.cli train --target "$TARGET" --data "$PREPARED" --online --steps "${ONLINE_STEPS:-60}" \
      --batch-size "${ONLINE_BATCH:-4}" --log-every "${ONLINE_LOG_EVERY:-10}" --eval-every 1000000 --eval-batches 1 \
      --save-every 1000000 --no-progress --overwrite --out "$WORK/online-$n" ${ONLINE_ARGS:-} \
      > "$WORK/online-$n.log" 2>&1 || { tail -30 "$WORK/online-$n.log"; exit 1; }
  done
  $PY - "$OUT" "$WORK" "$NPROC" "$TARGET" <<'PY'
import json, statistics, sys
out, work, n, target = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def rate(k):
    recs = [json.loads(x) for x in open(f"{work}/online-{k}/metrics.jsonl") if x.strip()]
    tps = [r["tokens_per_s"] for r in recs if r["split"] == "train"][1:]
    return {"tokens_per_s": round(statistics.median(tps), 1), "windows": len(tps),
            "last_loss": [r["loss"] for r in recs if r["split"] == "train"][-1]}
a, b = rate("1"), rate(n)
s = {"bench": "multi_gpu_online", "target": target, "world": int(n), "one": a, "many": b,
     "speedup": round(b["tokens_per_s"] / a["tokens_per_s"], 3)}
json.dump(s, open(f"{out}/online-summary.json", "w"), indent=2)
print(json.dumps(s, indent=2))
PY
fi
stamp "done: $OUT"
