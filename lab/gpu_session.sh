#!/usr/bin/env bash
# One GPU session for issues 14, 16, 13 (and 12's rest) on an nvidia-h200-x2, planned so the GPUs never idle:
# two lanes of jobs (one per GPU) run in the background (setsid), and each device call only carries the next
# carry part, looks at progress and brings the results so far back. Order and expected minutes: lab/GPU.md.
#
#   (call 1, carry .carry/p0)  bash lab/gpu_carry.sh recv
#   (optional, carry .carry/draft: a draft brought back earlier, restored instead of trained)  bash lab/gpu_session.sh take
#   (call 2, carry .carry/p1)  bash lab/gpu_carry.sh recv && bash lab/gpu_session.sh start
#   (each later call, carrying the next part if any)  bash lab/gpu_session.sh watch SECONDS
#        waits until every lane has finished or SECONDS have passed, then packs $RES into $OUT/results.tgz
#
# Lane 0 (GPU 0): 8B-shape extraction, load, training (issue 16), then, once the draft exists and the 2-GPU stage
#   is over, the decoder (issue 14): decode T=0 and T=1, profile new and old, 8B cost model.
# Lane 1 (GPU 1): the SmolLM2 draft (gpu_vllm.sh's run9k recipe), the native generator (issue 13), then the
#   2-GPU stage (multi_gpu.sh, both GPUs: lane 0 waits), regenerate kill/resume and self:N, then vLLM (issue 12)
#   when its parts have arrived, then the GPU demo if time is left.
# DEADLINE_S (default 1500): jobs marked optional are skipped once the session is older than this.
# LANE2=best_draft: lane 2 (one GPU) runs `eyas run best-draft` (BD_SET: its KEY=VALUE params) until done or the
#   deadline (BD_BUDGET_S per call) instead of the scaling points (`eyas run scaling`: SCALE_KINDS, SCALE_SIZES,
#   SCALE_SET, SCALE_BUDGET_S: one call, its points merged into bench/results/scaling.json's by bench/scaling.py);
#   LANE2=scaling_all: the scaling points call after call until all are done or the deadline (a session of its own);
#   SCALE_PARALLEL=1: one scaling recipe per kind side by side, merged at the end. LANE2="scaling_all best_draft":
#   one after the other. Rows generated in an earlier session (.carry/regen, .carry/self) seed both.
#   LANE2_AFTER=FLAG: lane 2 waits for lane 0's FLAG (LANE0=demo_vllm LANES="0 2" LANE2_AFTER=demo_done: the scaling
#   points after the timed demo).
# LANE0=demo_vllm (one GPU): the GPU demo alone first (issue 13), then vLLM with the demo's draft: the speedup sweep
#   and the regenerate throughput (issue 12); lane 1 runs the regenerate's HF half (untimed) once vLLM has arrived.
# LANE0=best_vllm LANE2=best_draft (one GPU): issue 13's draft, then vLLM's K sweep with it (engines start during
#   its evals, time after them).
# LANES="N ...": start only these lanes (default 0 1, one GPU 0 1 2); `watch` waits until the started lanes are done.
# SKIP="job ...": jobs not to run. TINY=1: the same lanes with CPU-sized arguments (a dry run of this script; numbers meaningless).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
W=${W:-/tmp/w}; RES="${RES:-$W/results}"; FL="$W/flags"; mkdir -p "$W" "$RES" "$FL"
T=${T:-/tmp/smol-hf}; SG=${SG:-/tmp/sharegpt.json}; DRAFT="$W/run9k"   # LANE0=demo_vllm: the demo's draft
# one GPU only (nvidia-h200): the *_one lanes (no 2-GPU stage, no vLLM)
if [ -z "${G1:-}" ]; then G1=1; [ "$(nvidia-smi -L 2>/dev/null | wc -l)" = 1 ] && G1=0; fi
DEADLINE_S=${DEADLINE_S:-1500}; TINY=${TINY:-}; OLD=${OLD:-/tmp/old}; SCALE_KINDS=${SCALE_KINDS:-self,raw}

log() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - $(cat "$W/t0" 2>/dev/null || date +%s) ))s] $*" | tee -a "$RES/lanes.log"; }
late() { [ $(( $(date +%s) - $(cat "$W/t0") + ${1:-0} )) -gt "$DEADLINE_S" ]; }
flag() { touch "$FL/$1"; log "flag $1"; }
await() { for f in "$@"; do while [ ! -e "$FL/$f" ]; do sleep 2; done; done; }
job() {  # job [-o SECS] NAME CMD...: run once (skipped if NAME.ok exists); -o: optional, expected to take SECS,
        # skipped when it would end past the deadline
  local opt=; [ "$1" = -o ] && { opt=$2; shift 2; }
  local name=$1; shift
  [ -e "$RES/$name.ok" ] && return 0
  case " ${SKIP:-} " in *" $name "*) log "skip $name (SKIP)"; return 1 ;; esac
  if [ -n "$opt" ] && late "$opt"; then log "skip $name (past the deadline)"; echo "{\"job\": \"$name\", \"skipped\": true}" >> "$RES/times.jsonl"; return 1; fi
  log "start $name"; echo "$name" > "$W/lane${LANE:-x}.current"   # what `restart` waits for
  local t0; t0=$(date +%s.%N)
  "$@" > "$RES/$name.log" 2>&1; local rc=$?; rm -f "$W/lane${LANE:-x}.current"
  local s; s=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  echo "{\"job\": \"$name\", \"seconds\": $s, \"rc\": $rc, \"gpu\": \"${CUDA_VISIBLE_DEVICES:-all}\"}" >> "$RES/times.jsonl"
  log "end $name rc=$rc ${s}s"; [ $rc = 0 ] && touch "$RES/$name.ok"
  return $rc
}

# CPU-sized arguments for TINY=1 (same code paths)
if [ -n "$TINY" ]; then
  TRAIN_ARGS=(--steps 4 --eval-every 2 --eval-batches 1 --batch-size 2); PREP_ROWS=(--max-samples 40)
  DEC=(--tiny); DEC1=(--tiny); COSTS_SMOL=(--shape tiny --device cpu --iters 2 --context 64 --capacity 300); PROF=(--device cpu --tokens 8); B8=(--tiny); COSTS=(--device cpu --shape tiny --iters 2)
  REGEN=(--rows 6 --batch 4 --max-new 8 --hf-sample 4 --hf-batch 2 --sweep batch=2 sdpa=no-cudnn graph=compile attn=flex); RR=(--max-samples 12 --max-new-tokens 8 --batch-size 4)
  DEMO=(--device cpu --max-samples 16 --regen-max-new-tokens 16 --regen-batch-size 8 --max-length 256 --epochs 1
        --draft-vocab-size 512 --eval-per-category 1 --eval-max-new-tokens 16 --tree total=6,depth=3,topk=2 --online
        --regen-backend native --regen-attention flex --self-prompts 2 --eval-min-bucket 1000000 --eval-warm-background --train-warm-background)
  REGEN512=(--rows 6 --batch 4 --max-new 8 --hf-sample 0 --sweep graph=eager)
  SELF=(--data self:12 --max-new-tokens 8 --batch-size 4); MG=(TINY=1 STEPS=2 TOKENS=2048); KILL_ROWS=4; SCALE=(tests/recipes/files/scaling-tiny.yaml --budget 200s); SCALE_PARAMS=(${SCALE_SET:-}); RFULL=(--max-samples 16 --max-new-tokens 8 --batch-size 4); LONG_SEQ=${LONG_SEQ:-256}
else
  TRAIN_ARGS=(--steps 1000 --eval-every 200 --eval-batches 16 --batch-size 8); PREP_ROWS=()
  DEC=(--per-category 2 --max-new-tokens 512); DEC1=(--per-category 1 --max-new-tokens 512)
  COSTS_SMOL=(--shape smollm2-135m --inner compiled --context 1200 --capacity 2600 --widths 4 16 61); PROF=(); B8=()
  DEMO=(--device cuda --profile gpu)
  REGEN512=(--rows 2048 --batch 512 --max-new 256 --hf-sample 0 --sweep graph=compile attn=flex attn=flex,graph=compile)
  COSTS=(); REGEN=(--rows 2048 --batch 256 --max-new 256 --hf-sample 64 --sweep batch=512 attn=flex); RR=(--max-samples 2000 --max-new-tokens 256 --batch-size 256)
  SELF=(--data self:2000 --max-new-tokens 256 --batch-size 256); MG=(); KILL_ROWS=300
  SCALE=(scaling --budget ${SCALE_BUDGET_S:-450}s); SCALE_PARAMS=(sizes=${SCALE_SIZES:-1e6,3e6} ${SCALE_SET:-})
  RFULL=(--max-new-tokens 512 --batch-size 256)
fi

lane0() {  # ~25 min
  export CUDA_VISIBLE_DEVICES=0
  job extract8b python3 bench/extract.py "${B8[@]}" --out "$RES/extract-h200-v2.json"                   # 2.5 min
  job load8b python3 bench/load.py "${B8[@]}" --dir /tmp/eyas-bench-load --out "$RES/load-h200.json"     # 2 min
  job train8b python3 bench/train.py "${B8[@]}" --long-seq "${LONG_SEQ:-16384}" --out "$RES/train-h200-v2.json"  # 3 min
  flag lane0_phase1; await draft_ready mgpu_done                                                          # 5 min
  smol_costs                                                                                             # 1 min
  job decode_t0 python3 bench/decode.py --target $T --draft $DRAFT "${DEC[@]}" --temperatures 0 \
    --out "$RES/decode-h200-v2.json" --plots "$RES/plots-decode-v2"                                       # 4 min
  job profile_new python3 bench/profile_decode.py --target $T --draft $DRAFT "${PROF[@]}" --out "$RES/profile-new.json"
  job costs8b python3 bench/decode_costs.py "${COSTS[@]}" --accept-from "$RES/decode-h200-v2.json" \
    --out "$RES/decode-costs-8b.json"                                                                     # 1 min
  job -o 180 decode_t1 python3 bench/decode.py --target $T --draft $DRAFT "${DEC1[@]}" --temperatures 1 \
    --out "$RES/decode-h200-v2-t1.json"
  [ -d $OLD/src ] && job -o 100 profile_old env PYTHONPATH=$OLD/src:/tmp/site \
    python3 bench/profile_decode.py --target $T --draft $DRAFT "${PROF[@]}" --out "$RES/profile-old.json"
  job -o 100 regen_resume regen_resume
  job -o 90 costs8b_compiled python3 bench/decode_costs.py "${COSTS[@]}" --inner compiled \
    --accept-from "$RES/decode-h200-v2.json" --out "$RES/decode-costs-8b-compiled.json"
  job -o 150 regen_self python3 -m eyas.cli regenerate --backend native --target $T "${SELF[@]}" \
    --out $W/rg-self.jsonl --json
  flag lane0_done
}

# One GPU (nvidia-h200, when no 2-GPU machine is lent): three lanes. Lanes 1 and 2 do the work whose result is not a
# time (the draft, the vLLM exports, serve-check's tau and identity, a resumable data regeneration for issue 13's
# draft, capped at REGEN_FULL_S) beside lane 0's GPU tests; then lane 0 runs every timed job alone, most needed
# first, optional ones skipped when they would end past DEADLINE_S.
ACCEPT=${ACCEPT:-$ROOT/bench/results/gpu-h200-2026-12-01b/decode-h200-v3.json}  # SmolLM2's measured acceptance
lane0_one() {
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests                                                                                              # 2 min
  job -o 100 regen_resume regen_resume                                                                   # 1.5 min
  [ -x /tmp/vpy ] && job -o 150 vllm_regen_hf env GPU=0 RES="$RES" REGEN_ROWS=${REGEN_ROWS:-48} bash lab/gpu_vllm.sh regen_hf
  case " ${LANE2:-scaling} " in *" best_draft "*|*" scaling_all "*) await lane1_done ;; *) await lane1_done lane2_done ;; esac
  log "untimed work over: timed jobs alone from here"
  # SmolLM2 at T=0 and T=1 with the in-place draft attention (its speedups were measured before it landed); every
  # non-tie divergence is re-decoded alone in fp32 and bf16 (the recheck's verdict: numerics or decoder)
  job -o 220 decode_t01 python3 bench/decode.py --target $T --draft $DRAFT "${DEC1[@]}" --temperatures 0 1 \
    --out "$RES/decode-h200-v4.json" --plots "$RES/plots-decode-v4"
  [ -x /tmp/vpy ] && job -o 150 vllm_regen env GPU=0 RES="$RES" REGEN_ROWS=${REGEN_ROWS:-48} bash lab/gpu_vllm.sh regen
  vllm_jobs speedup                                                                                      # issue 12
  # the per-shape GEMM bound (is 85 % of the square-GEMM ceiling reachable at all?) beside the 262k-token run
  job -o 170 extract8b python3 bench/extract.py "${B8[@]}" --out "$RES/extract-h200-v4.json"
  job -o 240 regen_native python3 bench/regen.py --target $T --data $SG "${REGEN[@]}" --out "$RES/regen-h200.json"
  job -o 250 costs8b_compiled python3 bench/decode_costs.py "${COSTS[@]}" --inner compiled \
    --accept-from "$RES/decode-h200-v4.json" --out "$RES/decode-costs-8b-compiled.json"
  job -o 140 profile_new python3 bench/profile_decode.py --target $T --draft $DRAFT "${PROF[@]}" --out "$RES/profile-new.json"
  job -o 200 train8b python3 bench/train.py "${B8[@]}" --long-seq "${LONG_SEQ:-16384}" --out "$RES/train-h200-v2.json"
  smol_costs
  job -o 120 load8b python3 bench/load.py "${B8[@]}" --dir /tmp/eyas-bench-load --out "$RES/load-h200.json"
  job -o 600 demo_gpu python3 -m eyas.cli demo "${DEMO[@]}" --target $T --data $SG --out $W/demo --json
  flag lane0_done
}
# LANE0=demo_vllm: issue 13's GPU demo (<= 10 min, tree tau >= 3) alone on the GPU, then issue 16's per-shape GEMM
# bound (extract8b, alone), then issue 12 with the demo's draft: the K sweep's engines start while lane 1 runs the
# regenerate's HF half (untimed) and time after it; then vLLM's regenerate (ENGINE_REPLICAS / ENGINE_ASYNC). Each
# timed job runs alone.
vllm_arrived() { for _ in $(seq "${VLLM_WAIT_S:-600}"); do [ -x /tmp/vpy ] && [ -e /tmp/eyas-env.sh ] && return 0; sleep 1; done; return 1; }
lane0_demo_vllm() {
  export CUDA_VISIBLE_DEVICES=0
  job demo_gpu python3 -m eyas.cli demo "${DEMO[@]}" --target $T --data $SG --out $W/demo --json
  mkdir -p "$RES/demo"; cp $W/demo/summary.json $W/demo/report.md $W/demo/*.png $W/demo/eval/*.png "$RES/demo/" 2>/dev/null
  DRAFT=$W/demo/run
  # issue 16: the per-shape GEMM bound (is 85 % of the square-GEMM ceiling reachable at all?) and the sustained
  # ceiling (the square GEMM for 4 s, clocks and power sampled), 32 batches of 16k tokens (~250 s)
  job -o 260 extract8b python3 bench/extract.py "${B8[@]}" --out "$RES/extract-h200-v4.json"
  flag demo_done
  if vllm_arrived; then
    VLLM_START_AFTER="$FL/lane1_done" vllm_jobs speedup
    await lane1_done
    # expected: ~75 s of start-up per replica (built one after another), ~2 min of generation and comparison
    job -o $((120 + 75 * ${ENGINE_REPLICAS:-1})) vllm_regen env GPU=0 RES="$RES" REGEN_ROWS=${REGEN_ROWS:-48} bash lab/gpu_vllm.sh regen
  else log "no vLLM after ${VLLM_WAIT_S:-600} s: vllm jobs skipped"; fi
  # if time is left: the native generator at batch 512 with the compiled step and flex decode attention
  job -o 200 regen_native512 python3 bench/regen.py --target $T --data $SG "${REGEN512[@]}" --out "$RES/regen-h200-512.json"
  flag lane0_done
}
# LANE0=best_vllm with LANE2=best_draft (one GPU): issue 13's draft (lane 2), and as soon as it is trained, vLLM's
# K sweep with it (issue 12): the engines start while best_draft's tau evals run and time nothing before lane 2 is
# done (--start-after), so the sweep's start-up costs no session time.
lane0_best_vllm() {
  export CUDA_VISIBLE_DEVICES=0
  until [ -e "$FL/lane2_done" ] || python3 -c "import json, sys
sys.exit('train' not in json.load(open('$W/best_draft/state.json'))['done'])" 2> /dev/null; do sleep 5; done
  DRAFT=$W/best_draft/run
  if [ -e "$DRAFT/model.safetensors" ] && vllm_arrived; then
    VLLM_START_AFTER="$FL/lane2_done" vllm_jobs speedup
  else log "no trained best_draft or no vLLM: vllm jobs skipped"; fi
  # VLLM_REGEN=1: then vLLM's regenerate, alone on the GPU (ENGINE_REPLICAS / ENGINE_ASYNC pass to gpu_vllm.sh);
  # its HF half (the match sample) ran in lane 1 beside best_draft
  if [ -n "${VLLM_REGEN:-}" ] && [ -x /tmp/vpy ]; then
    await lane1_done
    # expected: ~75 s of start-up per replica (built one after another), ~2 min of generation and comparison
    job -o $((120 + 75 * ${ENGINE_REPLICAS:-1})) vllm_regen env GPU=0 RES="$RES" REGEN_ROWS=${REGEN_ROWS:-48} bash lab/gpu_vllm.sh regen
  fi
  flag lane0_done
}
lane1_best_vllm() {
  export CUDA_VISIBLE_DEVICES=0
  [ -n "${VLLM_REGEN:-}" ] && vllm_arrived && job vllm_regen_hf env GPU=0 RES="$RES" REGEN_ROWS=${REGEN_ROWS:-48} \
    bash lab/gpu_vllm.sh regen_hf
  flag lane1_done
}
lane1_demo_vllm() {
  export CUDA_VISIBLE_DEVICES=0
  await demo_done   # never beside the timed demo or extract8b
  vllm_arrived && job vllm_regen_hf env GPU=0 RES="$RES" REGEN_ROWS=${REGEN_ROWS:-48} bash lab/gpu_vllm.sh regen_hf
  flag lane1_done
}
lane1_one() {
  export CUDA_VISIBLE_DEVICES=0
  draft
  # the vLLM exports (one per K, ~10 s of CPU each)
  for k in 1 2 3 4 5; do [ -e $W/export-k$k/config.json ] || CUDA_VISIBLE_DEVICES= python3 -m eyas.cli export \
    --draft $DRAFT --format vllm --chain $k --out $W/export-k$k > "$RES/export_k$k.log" 2>&1; done
  # vLLM arrives with the parts carried on the first watch calls
  for _ in $(seq "${VLLM_WAIT_S:-0}"); do [ -x /tmp/vpy ] && break; sleep 1; done
  vllm_serve 0.3   # its tau and identity are not times: it shares the GPU with lane 2 (a 30 % memory share)
  flag lane1_done
}
lane2_one() {  # issue 13's scaling curve, a few points per session beside the untimed work (tau is not a time, so
             # sharing the GPU is fine): self-generated and raw data first (ShareGPT-regenerated rows of earlier
             # sessions are in .carry/regen); points of earlier sessions are merged from bench/results/scaling.json
  export CUDA_VISIBLE_DEVICES=0
  # LANE2_AFTER=FLAG: start only once lane 0 has set FLAG (e.g. demo_done: never beside the timed demo)
  [ -n "${LANE2_AFTER:-}" ] && { await "$LANE2_AFTER"; log "lane 2 starts after $LANE2_AFTER"; }
  # LANE2="scaling_all best_draft": one after the other (best_draft starts only if a step of it fits the time left)
  for prog in ${LANE2:-scaling}; do
    case $prog in
      best_draft) job best_draft best_draft_loop ;;
      scaling_all) job scaling scaling_loop ;;
      scaling) local merge=(); scaling_merge; job scaling scaling_py $W/scaling $SCALE_KINDS "$RES/scaling.json" ;;
      *) log "LANE2: no program $prog (best_draft, scaling_all, scaling)" ;;
    esac
  done
  flag lane2_done
}

until_done() {  # until_done NAME MAX_BUDGET CMD...: `CMD --budget Bs` call after call (B: at most MAX_BUDGET and
               # the time left before the deadline) until it prints "all steps done", says "no step fits" (calling
               # again with less time cannot help, and once 48 such calls idled the GPU 335 s), fails, or the
               # deadline is near; its output also in $W/NAME.last (exit 3: steps left, call again)
  local name=$1 max=$2; shift 2
  for _ in $(seq 50); do
    local left=$(( DEADLINE_S - $(date +%s) + $(cat "$W/t0") - 60 )) budget=$max
    [ "$left" -lt 120 ] && { echo "deadline near: stopping (the same command resumes)"; return 0; }
    [ "$left" -lt "$budget" ] && budget=$left
    "$@" --budget "${budget}s" 2>&1 | tee "$W/$name.last"
    local rc=${PIPESTATUS[0]}
    grep -q "all steps done" "$W/$name.last" && return 0
    grep -q "no step fits" "$W/$name.last" && { echo "no step fits the time left: stopping (the same command resumes)"; return 0; }
    [ "$rc" = 0 ] || [ "$rc" = 3 ] || return "$rc"
  done
}
seed_carried() {  # seed_carried DIR: rows an earlier session generated with scaling's and best_draft's generation
                 # flags, so gen:regen / gen:self resume after them (`eyas regenerate` skips rows already written):
                 # .carry/regen (regen.gz.NN: ShareGPT re-answered) as DIR/regen.jsonl, .carry/self (self.tgz.NN:
                 # self.jsonl + its self-prompts file) into DIR; not in a TINY dry run (another target)
  [ -z "$TINY" ] || return 0
  mkdir -p "$1"
  if [ -d /tmp/regen-parts ] && [ ! -e "$1/regen.jsonl" ]; then
    cat /tmp/regen-parts/regen.gz.* | gunzip > "$1/regen.jsonl.tmp" && mv "$1/regen.jsonl.tmp" "$1/regen.jsonl"
    log "seeded $1/regen.jsonl with $(wc -l < "$1/regen.jsonl") carried rows"
  fi
  if [ -d /tmp/self-parts ] && [ ! -e "$1/self.jsonl" ]; then
    cat /tmp/self-parts/self.tgz.* | tar xzf - -C "$1" self.jsonl self.jsonl.self-prompts.jsonl
    log "seeded $1/self.jsonl with $(wc -l < "$1/self.jsonl") carried rows"
  fi
}
best_draft_loop() {  # LANE2=best_draft: `eyas run best-draft` call after call until it is done or the session's
                   # deadline is near; lane 0's timed jobs do not wait for it (they share the GPU: use it in a
                   # session given to the draft, with the timed jobs in SKIP)
  local recipe=best-draft; [ -n "$TINY" ] && recipe=tests/recipes/files/best-draft-tiny.yaml
  seed_carried $W/best_draft
  # BD_SET: the recipe's own params, e.g. "self_prompts=40000 epochs=2 eval_per_category=2"
  until_done best_draft "${BD_BUDGET_S:-540}" best_draft_call $recipe
}
best_draft_call() {  # one call of the best-draft recipe, its result copied to $RES/best_draft.json
  local args=("${@:2}")   # until_done's --budget Bs, before the --set (whose values run to the end)
  python3 -m eyas.cli run "$1" "${args[@]}" --out $W/best_draft --set target=$(target_for_recipes) data=$SG ${BD_SET:-}
  local rc=$?; cp $W/best_draft/result.json "$RES/best_draft.json" 2> /dev/null; [ -e $W/best_draft/result.png ] \
    && cp $W/best_draft/result.png "$RES/best_draft.png"; return $rc
}
target_for_recipes() {  # the target, or in a TINY dry run the random 2-layer one with its tokenizer
  if [ -n "$TINY" ]; then python3 tests/recipes/tiny.py $W/tiny-target $T; else echo $T; fi
}

scaling_merge() {  # the committed points of earlier sessions (not in a TINY dry run: another recipe, refused);
                 # SCALE_MERGE: more JSONs, e.g. a committed best_draft run (its point)
  [ -z "$TINY" ] && [ -s "$ROOT/bench/results/scaling.json" ] && merge=("$ROOT/bench/results/scaling.json" ${SCALE_MERGE:-})
  return 0
}
scaling_py() {  # scaling_py WORK KINDS OUT [KEY=VALUE...]: one call of the scaling recipe with the session's SCALE
               # flags and SCALE_PARAMS (one --set: a second would replace the first), then OUT = its points merged
               # with the caller's merge=(...) (bench/scaling.py; a point this call measured comes first)
  local args=("${@:4}") budget=(); [ "${args[-2]:-}" = --budget ] && { budget=("${args[@]: -2}"); args=("${args[@]:0:${#args[@]}-2}"); }
  python3 -m eyas.cli run "${SCALE[@]}" "${budget[@]}" --out "$1" --set target=$(target_for_recipes) data=$SG kinds="$2" \
    "${SCALE_PARAMS[@]}" "${args[@]}"
  local rc=$?
  [ -e "$1/result.json" ] && python3 bench/scaling.py --merge "$1/result.json" "${merge[@]}" --out "$3" > /dev/null
  return $rc
}
scaling_loop() {  # LANE2=scaling_all: a session given to the scaling curve: the scaling recipe call after call (each
                # SCALE_BUDGET_S) until every point of SCALE_KINDS x SCALE_SIZES has its Spec-Bench tau or the
                # deadline is near; earlier sessions' points merged from bench/results/scaling.json
  # SCALE_PARALLEL=1: one process per kind side by side (the SmolLM2 draft's training leaves an H200 half idle),
  # each with its own work dir and JSON, merged into one at the end
  local merge=(); scaling_merge
  if [ -z "${SCALE_PARALLEL:-}" ]; then
    seed_carried $W/scaling
    until_done scaling "${SCALE_BUDGET_S:-540}" scaling_py $W/scaling $SCALE_KINDS "$RES/scaling.json"
    return
  fi
  # SCALE_SIZES_<kind> (e.g. SCALE_SIZES_raw=1e6,3e6,1e7,2e7): that kind's sizes, beyond SCALE_SIZES (which they
  # should contain: the final merge asks for SCALE_SIZES of every kind)
  local kind outs=()
  for kind in ${SCALE_KINDS//,/ }; do
    seed_carried $W/scaling-$kind; outs+=("$RES/scaling-$kind.json")
    local own="SCALE_SIZES_$kind" sizes=()
    [ -n "${!own:-}" ] && sizes=(sizes="${!own}")
    until_done scaling-$kind "${SCALE_BUDGET_S:-540}" scaling_py $W/scaling-$kind $kind "$RES/scaling-$kind.json" \
      "${sizes[@]}" > "$RES/scaling-$kind.log" 2>&1 &
  done
  wait
  python3 bench/scaling.py --merge "${outs[@]}" "${merge[@]}" --out "$RES/scaling.json" > /dev/null
}

draft() {  # the SmolLM2 draft: gpu_vllm.sh's run9k recipe (held-out tau 1.759 in 298 s on an H200), or the one an
         # earlier session brought back, when carried (.carry/draft: draft.tar.NN from a watch call)
  if [ -d /tmp/draft-parts ] && [ ! -e "$DRAFT/model.safetensors" ]; then
    job draft_restore python3 lab/restore_draft.py --parts /tmp/draft-parts --target $T --out $DRAFT
  fi
  [ -e "$RES/draft_restore.ok" ] || job draft_prepare python3 -m eyas.cli prepare --target $T --data $SG "${PREP_ROWS[@]}" --out $W/p9k --max-length 1024 \
    --draft-vocab-size 16384 --workers 8 --overwrite --json
  [ -e "$RES/draft_restore.ok" ] || job draft_train python3 -m eyas.cli train --target $T --data $W/p9k --online --out $DRAFT --ttt-steps 7 \
    "${TRAIN_ARGS[@]}" --lr 1e-3 --no-init-head --seed 0                                              # 5 min
  flag draft_ready
}

vllm_jobs() {  # issue 12's rest, when vLLM arrived with the later parts (gpu_carry.sh parts 2-4 on watch calls)
  [ -x /tmp/vpy ] || { log "no vLLM here (/tmp/vpy): vllm jobs skipped"; return 0; }
  local chains=(${VLLM_CHAINS:-1 2 3 4 5})
  case "${1:-all}" in speedup|all)
    # one GPU, lane1_one: lane 1 writes the exports after the draft (demo_vllm / best_vllm: lane 1 writes none,
    # and demo_vllm's engines start while lane 1 runs the regenerate's HF half, timing after it: --start-after)
    case "${LANE0:-}" in demo_vllm|best_vllm) ;; *) [ "$G1" = 0 ] && await lane1_done ;; esac
    for k in "${chains[@]}"; do [ -e $W/export-k$k/config.json ] || python3 -m eyas.cli export --draft $DRAFT --format vllm \
      --chain $k --out $W/export-k$k > "$RES/export_k$k.log" 2>&1; done
    # the engines start side by side (70-130 s each), then take turns timing; the JSON is rewritten after each
    job -o $((120 + 40 * ${#chains[@]})) vllm_speedup python3 bench/vllm_speedup.py --target $T --export "$W/export-k{k}" --python /tmp/vpy \
      --chains "${chains[@]}" --batch-sizes 1 8 32 --per-category 2 --max-new-tokens 256 --gpus $CUDA_VISIBLE_DEVICES \
      --engines-per-gpu $(( ${#chains[@]} + 1 )) ${VLLM_START_AFTER:+--start-after "$VLLM_START_AFTER"} \
      --out "$RES/vllm_speedup.json" ;;
  esac
  case "${1:-all}" in rest|all)
    job -o 240 vllm_regen env GPU=$CUDA_VISIBLE_DEVICES RES="$RES" REGEN_ROWS=${REGEN_ROWS:-48} bash lab/gpu_vllm.sh regen
    vllm_serve ;;
  esac
}

vllm_serve() {  # vllm_serve [GPU_MEMORY_SHARE]: serve-check of the K=3 export (divergences classified as ties)
  [ -x /tmp/vpy ] || { log "no vLLM here (/tmp/vpy): serve-check skipped"; return 0; }
  [ -e $W/export-k3/config.json ] || python3 -m eyas.cli export --draft $DRAFT --format vllm --chain 3 \
    --out $W/export-k3 > "$RES/export_k3.log" 2>&1
  job -o 400 vllm_serve python3 -m eyas.cli serve-check --draft $W/export-k3 --engine vllm --python /tmp/vpy \
    --per-category 2 --max-new-tokens 128 ${1:+--gpu-memory-utilization $1} --out "$RES/serve_check_gpu.json"
}

gpu_tests() {  # the CUDA-only tests (graph capture, compiled steps, flex attention): new code meets the GPU early
  # -p no:timeout: the image's pytest-timeout plugin needs a newer pytest than the carried 8.3.5
  job gpu_tests python3 -m pytest -p no:timeout -q -s -m gpu tests/data/test_generate_gpu.py tests/decode/test_decode_gpu.py tests/target/test_target_gpu.py \
    tests/train/test_train_gpu.py
}

smol_costs() {  # SmolLM2-shaped AR step, verify and draft level at the benchmark's KV capacity, with and without
              # the KV-length buckets (the verify's attention over the whole capacity was 1.5 ms of a 4 ms verify)
  job -o 60 costs_smol python3 bench/decode_costs.py "${COSTS_SMOL[@]}" --out "$RES/decode-costs-smol.json"
  job -o 60 costs_smol_nobuckets python3 bench/decode_costs.py "${COSTS_SMOL[@]}" --min-bucket 1000000 \
    --out "$RES/decode-costs-smol-nobuckets.json"
}

regen_resume() {  # a native regenerate SIGKILLed mid-run continues without redoing finished rows
  local o=$W/rg-resume.jsonl; rm -f $o $o.*
  local a=(python3 -m eyas.cli regenerate --backend native --target $T --data $SG "${RR[@]}" --out $o)
  "${a[@]}" & local pid=$!
  while kill -0 $pid 2>/dev/null && [ "$(cat $o 2>/dev/null | wc -l)" -lt "$KILL_ROWS" ]; do sleep 0.5; done
  kill -9 $pid 2>/dev/null; wait $pid; echo "killed run rc=$? rows written before the kill: $(wc -l < $o)"
  "${a[@]}" --json || return 1
  python3 - $o <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ids = [r["row"] for r in rows]
print(json.dumps({"rows": len(rows), "distinct": len(set(map(str, ids)))}))
PY
}

lane1() {  # ~25 min
  export CUDA_VISIBLE_DEVICES=$G1
  draft
  gpu_tests
  job regen_native python3 bench/regen.py --target $T --data $SG "${REGEN[@]}" --out "$RES/regen-h200.json"  # 2 min
  await lane0_phase1
  [ "$G1" = 1 ] && job mgpu env -u CUDA_VISIBLE_DEVICES "${MG[@]}" bash bench/multi_gpu.sh "$RES/mgpu"                    # 5 min, both GPUs
  flag mgpu_done
  vllm_jobs
  job -o 600 demo_gpu python3 -m eyas.cli demo "${DEMO[@]}" --target $T --data $SG --out $W/demo --json
  flag lane1_done
}

lane() {  # lane N: from a snapshot of the code, so a later call's tree never changes a running job
  export LANE=$1; local d="/tmp/eyas-snap/lane$1"; rm -rf "$d"; mkdir -p "$d"; cp -r "$ROOT/src" "$ROOT/bench" "$ROOT/tests" "$ROOT/pyproject.toml" "$d/"; cd "$d"
  export PYTHONPATH="$d/src:/tmp/site" VLLM_HOST_IP=127.0.0.1 EYAS_VLLM_PYTHON=/tmp/vpy
  # LANE0=NAME (one GPU): lanes with a function laneN_NAME run it, the others their laneN_one
  if [ "$G1" = 1 ]; then "lane$1"; elif [ -n "${LANE0:-}" ] && declare -F "lane$1_$LANE0" > /dev/null; then
    "lane$1_$LANE0"; else "lane$1_one"; fi
}

pack_results() {
  [ -n "${OUT:-}" ] || return 0
  # logs can be long: the last 200 kB of each; the draft (for a later session) in parts of < 15 MiB
  local p=/tmp/eyas-pack; rm -rf $p; mkdir -p $p; cp -r "$RES" $p/results
  find $p/results -name '*.log' -size +200k -exec sh -c 'tail -c 200000 "$1" > "$1.t" && mv "$1.t" "$1"' _ {} \;
  tar czf "$OUT/results.tgz" -C $p results
  # the draft once, after the 2-GPU stage (or at once on one GPU): a later session can carry it instead of training
  [ -e "$RES/draft_restore.ok" ] && touch "$W/draft.sent"   # a restored draft came from here
  if [ -e "$FL/draft_ready" ] && [ ! -e "$W/draft.sent" ] && { [ -e "$FL/mgpu_done" ] || [ "$G1" = 0 ]; }; then
    python3 - "$DRAFT" "$W/draft-bf16.safetensors" <<'PY'
import sys, torch
from safetensors.torch import load_file, save_file
sd = load_file(f"{sys.argv[1]}/model.safetensors")
save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items() if k != "embed_tokens.weight"}, sys.argv[2])
PY
    tar cf - -C $W draft-bf16.safetensors run9k/config.json run9k/metrics.jsonl | split -b 15M -d - "$OUT/draft.tar."
    touch "$W/draft.sent"
  fi
  # issue 13's regenerated rows once lane 2 is over (a later session carries them: lab/GPU.md section 5)
  if [ -e "$FL/lane2_done" ] && [ -s "$W/regen-full.jsonl" ] && [ ! -e "$W/regen.sent" ]; then
    gzip -c "$W/regen-full.jsonl" | split -b 15M -d - "$OUT/regen.gz."; touch "$W/regen.sent"
  fi
  ls -la "$OUT"
}

take_carried() {  # what calls carry besides the parts: the previous decoder's source, a trained draft
  [ -d "$ROOT/.carry/old/src" ] && [ ! -d $OLD/src ] && cp -r "$ROOT/.carry/old" $OLD && echo "old decoder at $OLD"
  [ -d "$ROOT/.carry/draft" ] && [ ! -d /tmp/draft-parts ] && cp -r "$ROOT/.carry/draft" /tmp/draft-parts && echo "draft parts at /tmp/draft-parts"
  [ -d "$ROOT/.carry/regen" ] && [ ! -d /tmp/regen-parts ] && cp -r "$ROOT/.carry/regen" /tmp/regen-parts && echo "regenerated rows at /tmp/regen-parts"
  [ -d "$ROOT/.carry/self" ] && [ ! -d /tmp/self-parts ] && cp -r "$ROOT/.carry/self" /tmp/self-parts && echo "self-written rows at /tmp/self-parts"
  return 0
}

case "${1:-}" in
  start)
    take_carried
    [ -e "$W/t0" ] || date +%s > "$W/t0"
    lanes="0 1"; [ "$G1" = 0 ] && [ "${LANE0:-}" != demo_vllm ] && lanes="0 1 2"   # one GPU: lane 2 too (best_vllm: best_draft)
    lanes=${LANES:-$lanes}   # LANES=2 with LANE2=best_draft: a session given to issue 13's draft alone
    echo "$lanes" > "$W/lanes"
    for n in $lanes; do setsid nohup bash "$ROOT/lab/gpu_session.sh" lane "$n" > "$W/lane$n.out" 2>&1 < /dev/null & done
    sleep 1; log "lanes started" ;;
  lane) lane "$2" ;;
  take) take_carried ;;   # a call that carries only .carry/draft or .carry/old, before `start`
  restart)  # restart lane N from the current tree (after a fix): its finished jobs are skipped; the running one is
            # waited for (up to 600 s) unless KILL=1; SKIP="job ..." leaves out jobs (e.g. one killed on purpose)
    # this lane's running job (not another lane's: the last "start" in lanes.log may be any lane's)
    if [ -z "${KILL:-}" ] && [ -e "$W/lane$2.current" ]; then
      for _ in $(seq 600); do [ -e "$W/lane$2.current" ] || break; sleep 1; done
    fi
    sid=$(pgrep -f "[g]pu_session.sh lane $2" | head -1); [ -n "$sid" ] && pkill -9 -s "$sid"; sleep 1
    rm -f "$FL/lane$2_done"
    setsid nohup bash "$ROOT/lab/gpu_session.sh" lane "$2" > "$W/lane$2.out" 2>&1 < /dev/null &
    sleep 1; log "lane $2 restarted" ;;
  watch)
    # carried parts: vLLM and its wheels (gpu_carry.sh), the previous decoder's source (.carry/old)
    ls -d "$ROOT"/.carry/p* > /dev/null 2>&1 && (cd "$ROOT" && bash lab/gpu_carry.sh recv | tail -3)
    take_carried
    # a device call ends at CALL_S (600): a watch that outlives its call never packs, and its results are lost
    # (`recv && start && watch 540` ran 606 s once). The call's shell ($PPID) started with the call, so its age is
    # what the call has used; an age above CALL_S is not a call's shell (a long-lived wrapper) and caps nothing.
    wait_s=${2:-60}; age=$(ps -o etimes= -p $PPID 2>/dev/null | tr -d ' '); call_s=${CALL_S:-600}
    if [ -n "$age" ] && [ "$age" -lt "$call_s" ] && [ $(( call_s - 30 - age )) -lt "$wait_s" ]; then
      wait_s=$(( call_s - 30 - age )); [ "$wait_s" -lt 0 ] && wait_s=0
      echo "watch: $wait_s s (the call has used ${age} s of its ${call_s})"
    fi
    end=$(( $(date +%s) + wait_s ))
    all_done() { for n in $(cat "$W/lanes" 2>/dev/null || echo 0 1); do [ -e "$FL/lane${n}_done" ] || return 1; done; }
    while [ "$(date +%s)" -lt $end ] && ! all_done; do sleep 5; done
    tail -n 40 "$RES/lanes.log"; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader 2>/dev/null
    pack_results ;;
  *) sed -n 2,20p "$0"; exit 2 ;;
esac
