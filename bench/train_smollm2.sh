#!/usr/bin/env bash
# The real SmolLM2-135M draft run on one GPU, every stage timed:
#   regenerate ShareGPT answers with the target -> prepare -> extract bf16 + fp8 stores -> train a draft on each
#   -> held-out learning curves (simulated tau per eval) and delta tau bf16 - fp8 on the same rows and seed.
# Sized for one H200 in about 8 minutes; every knob is an environment variable:
#   N (source rows, default 1200)  REGEN (1: target re-answers, 0: raw ShareGPT)  NEW_TOKENS (256)  GEN_BATCH (128)
#   MAXLEN (1024)  VOCAB (draft vocab, 8192)  TTT (7)  EPOCHS (3)  BATCH (8)  LR (3e-4)  EVAL_EVERY (25)
#   TARGET (smollm2-135m)  DATA (sharegpt)  DEVICE (cuda if available)  PYTHON (python)  OUT_JSON
#   TRAIN_ARGS (extra `eyas train` flags, e.g. "--no-init-head")
#   STAGES (run only these, e.g. "regenerate prepare extract_bf16 extract_fp8 train_bf16", to split the run
#   over several calls; the summary is written once both training runs exist)
# Usage:  bash bench/train_smollm2.sh [WORK_DIR]          (default runs/train_smollm2)
#         SMOKE=1 bash bench/train_smollm2.sh /tmp/w       (CPU-sized check of the script itself)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
W="${1:-$ROOT/runs/train_smollm2}"
PY="${PYTHON:-python}"
if [ "${SMOKE:-0}" = 1 ]; then
  : "${N:=24}" "${NEW_TOKENS:=8}" "${GEN_BATCH:=8}" "${MAXLEN:=256}" "${VOCAB:=2048}" "${TTT:=2}" "${EPOCHS:=1}"
  : "${BATCH:=2}" "${EVAL_EVERY:=2}" "${DEVICE:=cpu}"
fi
N="${N:-1200}"; REGEN="${REGEN:-1}"; NEW_TOKENS="${NEW_TOKENS:-256}"; GEN_BATCH="${GEN_BATCH:-128}"
MAXLEN="${MAXLEN:-1024}"; VOCAB="${VOCAB:-8192}"; TTT="${TTT:-7}"; EPOCHS="${EPOCHS:-3}"; BATCH="${BATCH:-8}"
LR="${LR:-3e-4}"; EVAL_EVERY="${EVAL_EVERY:-25}"; TARGET="${TARGET:-smollm2-135m}"; DATA="${DATA:-sharegpt}"
DEVICE="${DEVICE:-$($PY -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
OUT_JSON="${OUT_JSON:-$ROOT/bench/results/train_smollm2$([ "${SMOKE:-0}" = 1 ] && echo _smoke || true).json}"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
EYAS=("$PY" -m eyas.cli)
mkdir -p "$W"
TIMES="$W/timings.jsonl"; [ -n "${STAGES:-}" ] || : > "$TIMES"

wanted() {  # wanted NAME: true unless STAGES is set and does not name it
  [ -z "${STAGES:-}" ] || [[ " $STAGES " == *" $1 "* ]]
}

stage() {  # stage NAME CMD...: run, time, record (skipped when not wanted)
  local name=$1; shift
  wanted "$name" || return 0
  echo "== $name: $*" >&2
  local t0; t0=$(date +%s%N)
  "$@"
  echo "{\"stage\": \"$name\", \"seconds\": $(( ($(date +%s%N) - t0) / 1000000 ))e-3}" >> "$TIMES"
}

SRC="$DATA"; SRC_ARGS=(--max-samples "$N")
if [ "$REGEN" = 1 ]; then
  stage regenerate "${EYAS[@]}" regenerate --target "$TARGET" --data "$DATA" --max-samples "$N" \
    --out "$W/regen.jsonl" --max-new-tokens "$NEW_TOKENS" --batch-size "$GEN_BATCH" --device "$DEVICE" --json
  SRC="$W/regen.jsonl"; SRC_ARGS=()
fi
stage prepare "${EYAS[@]}" prepare --target "$TARGET" --data "$SRC" "${SRC_ARGS[@]}" --out "$W/prep" \
  --max-length "$MAXLEN" --draft-vocab-size "$VOCAB" --workers 0 --overwrite --json
for dt in bf16 fp8; do
  stage "extract_$dt" "${EYAS[@]}" extract --target "$TARGET" --data "$W/prep" --out "$W/store-$dt" --store-dtype "$dt" \
    --device "$DEVICE" --overwrite
done
for dt in bf16 fp8; do
  wanted "train_$dt" || continue
  rm -rf "$W/run-$dt"
  # shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags
  stage "train_$dt" "${EYAS[@]}" train --target "$TARGET" --store "$W/store-$dt" --data "$W/prep" --out "$W/run-$dt" \
    --ttt-steps "$TTT" --epochs "$EPOCHS" --batch-size "$BATCH" --lr "$LR" --eval-every "$EVAL_EVERY" \
    --save-every 1000000 --eval-fraction 0.05 --seed 0 --device "$DEVICE" --no-progress ${TRAIN_ARGS:-}
done
[ -f "$W/run-bf16/metrics.jsonl" ] && [ -f "$W/run-fp8/metrics.jsonl" ] || { echo "summary skipped: a training run is missing" >&2; exit 0; }

"$PY" - "$W" "$OUT_JSON" <<'PYEOF'
import json, sys, platform
from pathlib import Path
w, out = Path(sys.argv[1]), Path(sys.argv[2])
times = [json.loads(l) for l in (w / "timings.jsonl").read_text().splitlines()]
res = {"work_dir": str(w), "stages": {t["stage"]: t["seconds"] for t in times},
       "total_seconds": round(sum(t["seconds"] for t in times), 1), "host": platform.node()}
prep = json.loads((w / "prep" / "manifest.json").read_text())
res["prepared"] = {k: prep.get("summary", {}).get(k) for k in ("rows_in", "rows_out", "packed_rows", "tokens",
                                                                "masked_tokens", "coverage")}
for dt in ("bf16", "fp8"):
    m = [json.loads(l) for l in (w / f"run-{dt}" / "metrics.jsonl").read_text().splitlines()]
    ev = [x for x in m if x["split"] == "eval"]
    tr = [x for x in m if x["split"] == "train"]
    best = max(ev, key=lambda x: x["tau"])
    res[dt] = {"curve": [{"step": x["step"], "loss": round(x["loss"], 4), "tau": round(x["tau"], 4),
                          "acc": [round(a, 4) for a in x["acc"]]} for x in ev],
               "best_tau": best["tau"], "best_step": best["step"], "final_tau": ev[-1]["tau"],
               "final_acc": ev[-1]["acc"], "train_tokens_per_s": round(sum(x["tokens_per_s"] for x in tr) / len(tr), 1),
               "heldout_positions": ev[-1]["positions"]}
res["delta_tau_bf16_minus_fp8"] = {"best": res["bf16"]["best_tau"] - res["fp8"]["best_tau"],
                                   "final": res["bf16"]["final_tau"] - res["fp8"]["final_tau"]}
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(res, indent=2))
print(json.dumps({k: v for k, v in res.items() if k not in ("bf16", "fp8")}, indent=2))
for dt in ("bf16", "fp8"):
    print(dt, "curve (step: tau):", ", ".join(f"{c['step']}: {c['tau']:.3f}" for c in res[dt]["curve"]))
PYEOF
