#!/usr/bin/env bash
# One H200 session (lab/GPU.md "Next sessions" B): the best EAGLE-3 draft for Qwen2.5-Coder-1.5B and what vLLM
# makes of it (issue 37 items 2, 3). Jobs run as lanes (lab/lanes.sh); results under /tmp/res come back in
# $OUT/lanes.tgz with every call.
#   bash lab/plan_q15_draft.sh JOB    JOB: scaling served kimi_ar back demo (or tick, below)
# Carry (lab/gpu_carry.sh pack, ITEMS="eyas-deps qwen15 vllm-deps vllm", 48 MiB parts: the 1.5B first, so the
# recipe starts while vLLM arrives); on every call, carrying the next part:   bash lab/plan_q15_draft.sh tick [WAIT_S]
# tick receives the parts, snapshots the tree once, starts `scaling` when eyas's deps and the 1.5B are in,
# `served` (timed) once vLLM is in and `scaling` ended, `kimi_ar` (a short vLLM check on the Kimi toy) after it,
# then waits up to WAIT_S (default 20) and packs logs and results; the ticks after `served` ends (or `scaling`, in a
# pack without vLLM) run `back` alone, 4 parts a call (the self-written rows and the best draft, kept as
# .carry/q15back). Sessions after it carry them back as items: `q15back` (the rows alone: `scaling` waits for them
# and resumes past them, so larger SCALE_SIZES cost only the new rows) or `q15draft` (the draft: no `scaling`;
# `served` serves it, restored by lab/restore_draft.py). Knobs: SCALE_BUDGET (s, default 1000), SCALE_SIZES
# (default 1e6,2e6,4e6), SCALE_SET; SERVED_ENGINES (vLLM engines starting side by side in the sweep, default 6),
# PACE=0 (no AR pace), PROFILE=0 (no round profile), AUTO_TREE=0 (no cost-model tree), KIMI_AR=0 (no Kimi lane), KIMI_BI=0 (its AR control
# only). SCALE_WARM=1 with item q15draft (B4w): `scaling` continues the brought-back draft (`train --init-from`) on
# its rows plus more, instead of `served`. Knobs reach a lane from the tick that starts it.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = tick ]; then
  PLAN=lab/plan_q15_draft.sh; . lab/tick.sh
  # B2: rows an earlier session brought back (item q15back) -> the recipe starts once they are in and resumes from
  # them. B3: a draft brought back (item q15draft) -> no recipe; `served` serves that draft.
  if carried sharegpt && ! carried q15back && ! carried q15draft; then   # E: the demo on the 1.5B, alone
    have eyas-deps qwen15 sharegpt && lane demo
  elif ! carried q15draft; then
    have eyas-deps qwen15 && { ! carried q15back || have q15back; } && lane scaling
  elif [ "${SCALE_WARM:-0}" = 1 ]; then   # B4w: the brought-back draft continued on more rows
    have eyas-deps q15draft qwen15 && lane scaling
  fi
  # `served` once the draft is there (the recipe's, or one brought back and not continued); vLLM's parts only in
  # a pack that carries vLLM (without it: the evals alone, so B4/B4w's draft gets its timed speedups too)
  { ! carried vllm || have vllm-deps vllm; } && have eyas-deps qwen15 &&
      { ended scaling || { have q15draft && [ "${SCALE_WARM:-0}" != 1 ]; }; } && lane served
  # issue 38's control, a few GPU-minutes once the timed lane ended (while `back` calls run), so that it neither
  # disturbs the sweep's timings nor takes the recipe's GPU memory (KIMI_AR=0: not this session)
  [ "${KIMI_AR:-1}" = 1 ] && ended served && lane kimi_ar
  # the rows and the draft come home once the recipe's work is over (after `served`, or at once without vLLM)
  if { ! carried q15draft || [ "${SCALE_WARM:-0}" = 1 ]; } && { ended served || { ended scaling && ! carried vllm; }; } &&
      [ -n "${OUT:-}" ] &&
      [ ! -e /tmp/back.sent ]; then
    bash lab/plan_q15_draft.sh back; exit 0      # alone in its call, until every part has gone
  fi
  bash lab/lanes.sh wait "${2:-20}"
  exit 0
fi
. /tmp/eyas-env.sh
export PYTHONUNBUFFERED=1 EYAS_CACHE=/tmp/ec
R=/tmp/res W=/tmp/w/q15 T=qwen2.5-coder-1.5b
E="python3 -m eyas.cli"
mkdir -p $R /tmp/w

best() {  # the run dir of the largest trained point (its Spec-Bench eval may have been cut by the budget)
  python3 -c "import json, sys
p = max(json.load(open(sys.argv[1]))['points'], key=lambda p: p['tokens'])
print(f\"{sys.argv[2]}/run-{p['kind']}-{p['size']}\")" $W/result.json $W
}

case "${1:-}" in
  scaling)   # issue 37 item 2: three curve points of target-written data; the largest is the best draft
    INIT=()
    if [ -d /tmp/q15draft ]; then   # B4w: the draft (and its rows) an earlier session brought back, continued
      I=/tmp/w/q15-init
      [ -f $I/model.safetensors ] || { python3 -c "from eyas.target.builtins import builtin_target_dir as d
d('$T')" && python3 lab/restore_draft.py --parts /tmp/q15draft --target /tmp/ec/models/$T --out $I; } || exit 2
      [ -f /tmp/q15back/rows.tgz ] || { mkdir -p /tmp/q15back &&
        bash lab/rows_of.sh /tmp/q15draft > /tmp/q15back/rows.tgz; } || exit 2
      INIT=("train_args=--init-from $I")
    fi
    if [ -f /tmp/q15back/rows.tgz ] && [ ! -d $W ]; then   # an earlier session's rows: `regenerate` resumes past them
      mkdir -p $W && tar xzf /tmp/q15back/rows.tgz -C $W || exit 1
      echo '{"done": {}}' > $W/state.json   # an empty recipe state: the runner adopts the dir, gen resumes
    fi
    $E run scaling --out $W --budget "${SCALE_BUDGET:-1000}s" --set target=$T device=cuda kinds=self \
        sizes=${SCALE_SIZES:-1e6,2e6,4e6} epochs=${SCALE_EPOCHS:-2} eval_per_category=2 ${SCALE_SET:-} ${INIT[@]+"${INIT[@]}"}; rc=$?
    cp $W/result.json $R/scaling-q15.json 2>/dev/null; cp $W/result.png $R/scaling-q15.png 2>/dev/null
    cp $W/eval-*.json $R/ 2>/dev/null
    [ $rc = 0 ] || [ $rc = 3 ]; exit $? ;;      # 3: steps left (the budget ran out); what is done still serves
  served)    # issue 37 items 2-4, most wanted first: T=0 alone (speedups over eyas's and vLLM's AR), vLLM's K = 1..5
             # against vLLM's AR, served tau vs native, T=1, eyas's AR vs vLLM's and the 1k-token prefill
    if [ -f $W/result.json ]; then   # this session's recipe trained it (B, B2, B4, B4w)
      B=$(best) || { echo "no trained point in $W/result.json" >&2; exit 2; }
    elif [ -d /tmp/q15draft ]; then   # B3: the draft a session brought back (its embedding is the target's)
      B=$W/restored
      [ -f $B/model.safetensors ] || { python3 -c "from eyas.target.builtins import builtin_target_dir as d
d('$T')" && python3 lab/restore_draft.py --parts /tmp/q15draft --target /tmp/ec/models/$T --out $B; } || exit 2
    else
      echo "no draft: neither $W/result.json nor /tmp/q15draft" >&2; exit 2
    fi
    echo "best draft: $B"
    ev() { $E eval --draft $B --target $T --per-category 2 --max-new-tokens 256 --chain 3 \
        --tree total=60,depth=7,topk=10 --device cuda --temperature $1 --out $R/eval-q15-t$1.json \
        --baseline-cache /tmp/w/bcache-q15; }   # one AR baseline per temperature, shared with the auto eval
    [ -f $R/eval-q15-t0.json ] || ev 0
    # where a round's time goes (kernels vs gaps, top kernels of AR, chain-3 and tree): B3 measured a 4-token verify
    # at 3.26 ms against 2.66 ms for an AR step (≈ 1.5 min; PROFILE=0 leaves it out)
    [ "${PROFILE:-1}" = 0 ] || [ -f $R/profile-q15.json ] || python3 bench/profile_decode.py --target $T --draft $B \
        --out $R/profile-q15.json
    auto() {   # the tree eyas's cost model picks for this target's round costs (60/7/10 is SmolLM2's choice), T=0
      [ "${AUTO_TREE:-1}" = 0 ] || [ -f $R/eval-q15-auto.json ] || $E eval --draft $B --target $T --per-category 2 \
          --max-new-tokens 256 --tree auto --device cuda --out $R/eval-q15-auto.json --baseline-cache /tmp/w/bcache-q15; }
    grouped() {   # the same profile with the decoder's steps attending grouped (EYAS_GROUPED_STEPS=1): the A/B
      [ "${PROFILE:-1}" = 0 ] || [ -f $R/profile-q15-grouped.json ] || EYAS_GROUPED_STEPS=1 python3 \
          bench/profile_decode.py --target $T --draft $B --out $R/profile-q15-grouped.json; }
    prefill_ab() {   # the 1k-token prefill (goal <= 10 ms) as the decoders run it, and two A/Bs of it: PyTorch's own
      # SDPA choice (cuDNN included), and compiled chunks (their AR tok/s pays the compiles: read prefill_ms only)
      [ "${PACE:-1}" = 0 ] && return
      [ -e /tmp/vpy ] || [ -f $R/ar_pace_q15.json ] || python3 bench/ar_pace.py --target $T --device cuda \
          --per-category 2 --max-new-tokens 256 --out $R/ar_pace_q15.json
      [ -f $R/ar_pace_q15_sdpa_any.json ] || EYAS_PREFILL_SDPA=any python3 bench/ar_pace.py \
          --target $T --device cuda --per-category 2 --max-new-tokens 256 --out $R/ar_pace_q15_sdpa_any.json
      [ -f $R/ar_pace_q15_prefill_compiled.json ] || EYAS_PREFILL_INNER=compiled python3 bench/ar_pace.py \
          --target $T --device cuda --per-category 2 --max-new-tokens 256 --out $R/ar_pace_q15_prefill_compiled.json; }
    if [ ! -e /tmp/vpy ]; then auto; grouped; [ -f $R/eval-q15-t1.json ] || ev 1; prefill_ab; exit 0; fi   # no vLLM
    for k in 1 2 3 4 5; do $E export --draft $B --format vllm --chain $k --out /tmp/x-q15-k$k || exit 1; done
    python3 bench/vllm_speedup.py --engine vllm --target /tmp/ec/models/$T --export '/tmp/x-q15-k{k}' \
        --python /tmp/vpy --chains 1 2 3 4 5 --batch-sizes 1 8 32 --per-category 2 --max-new-tokens 256 \
        --engines-per-gpu ${SERVED_ENGINES:-6} --out $R/speedup_vllm_q15.json
    [ -f $R/serve_check_q15_k3.json ] || $E serve-check --draft /tmp/x-q15-k3 --engine vllm --python /tmp/vpy \
        --per-category 2 --max-new-tokens 128 --dtype bf16 --gpu-memory-utilization 0.3 --out $R/serve_check_q15_k3.json
    [ -f $R/eval-q15-t1.json ] || ev 1
    [ "${PACE:-1}" = 0 ] || [ -f $R/ar_pace_q15.json ] || python3 bench/ar_pace.py --target $T --device cuda \
        --per-category 2 --max-new-tokens 256 --vllm-python /tmp/vpy --out $R/ar_pace_q15.json
    prefill_ab; auto; grouped ;;
  kimi_ar)   # issue 38 item 3: the Kimi toy end to end with every vLLM engine batch-invariant (VLLM_BATCH_INVARIANT=1:
             # MLA, fused MoE and matmuls reduce in one order whatever the batch's shape), so served output = vLLM's
             # AR asks for the draft alone; ≈ 8 min. KIMI_BI=0: only the batched-vs-alone AR control (≈ 4 min)
    if [ "${KIMI_BI:-1}" = 1 ]; then
      python3 bench/kimi_toy.py --python /tmp/vpy --work /tmp/kimi-bi --out $R/kimi_bi.json --toys kimi-k2.5 \
          --batch-invariant; rc=$?; d=/tmp/kimi-bi
    else
      python3 bench/kimi_toy.py --python /tmp/vpy --work /tmp/kimi --out $R/kimi_ar.json --toys kimi-k2.5 \
          --steps build vllm_start ar_batch; rc=$?; d=/tmp/kimi
    fi
    (cd $d && find . -name '*.log' | tar czf $R/kimi-ar-logs.tgz -T -); exit $rc ;;
  demo)      # issue 37 item 5: `eyas demo` on the 1.5B as a user runs it (its gpu profile), goal <= 20 min, tree tau >= 4
    # (ShareGPT from the carried item: the built-in name would fetch it with pip, which cannot reach an index here)
    mkdir -p /tmp/w && S=$(date +%s)
    $E demo --device cuda --target $T --data /tmp/sharegpt.json --out /tmp/w/demo-q15; rc=$?
    echo "{\"wall_s\": $(( $(date +%s) - S )), \"rc\": $rc}" > $R/demo-q15-wall.json
    (cd /tmp/w/demo-q15 && cp summary.json $R/demo-q15-summary.json; cp report.md $R/demo-q15-report.md
     cp eval/*.json $R/ 2>/dev/null) 2>/dev/null
    exit $rc ;;
  back)      # in a call (not a lane): the self-written rows (gz) and the best draft (bf16, no embedding: the
             # target's; restore_draft.py's layout) split into 15 MB parts once, then 4 parts into $OUT per call,
             # the rows first (rows.tgz.NN): small, and what git keeps when the checkout goes (lab/GPU.md)
    [ -n "${OUT:-}" ] && [ -f $W/result.json ] || { echo "no OUT or no $W/result.json" >&2; exit 2; }
    if [ ! -d /tmp/back-parts ]; then
      mkdir -p /tmp/back/run9k /tmp/back-parts &&
        tar czf /tmp/back-rows.tgz -C $W self.jsonl self.jsonl.eyas-output.json self.jsonl.self-prompts.jsonl &&
        split -b 15M -d /tmp/back-rows.tgz /tmp/back-parts/rows.tgz. || exit 1
      if B=$(best 2> /dev/null); then   # (none after a data-only call, skip_train: the rows alone come home)
        python3 -c "import sys, torch; from safetensors.torch import load_file, save_file
sd = load_file(sys.argv[1]); save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v
for k, v in sd.items() if k != 'embed_tokens.weight'}, sys.argv[2])" $B/model.safetensors /tmp/back/draft-bf16.safetensors \
          && cp $B/config.json $B/metrics.jsonl /tmp/back/run9k/ &&
          tar cf - -C /tmp/back . | split -b 15M -d - /tmp/back-parts/draft.tar. || exit 1
      fi
    fi
    for f in $( (ls /tmp/back-parts | grep '^rows'; ls /tmp/back-parts | grep -v '^rows') | head -4); do
      mv /tmp/back-parts/$f "$OUT/"; done
    [ -n "$(ls /tmp/back-parts)" ] || touch /tmp/back.sent
    echo "parts left: $(ls /tmp/back-parts | wc -l)"; ls -la "$OUT" ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac
