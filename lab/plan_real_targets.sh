#!/usr/bin/env bash
# One H200 session: the Kimi-K2.5 toy through vLLM (issue 38), SGLang tree serving beside vLLM's chain (issue 40),
# the 1.5B target's conversion and the AR pace of eyas vs vLLM (issue 37). Jobs run as lanes (lab/lanes.sh) and
# write JSON under /tmp/res, which every `lanes.sh wait` call brings back in $OUT/lanes.tgz.
#   bash lab/plan_real_targets.sh JOB    JOB: gputests kimi sgl_train sgl_check convert timed back (or tick, below)
# A draft brought back by `back` in an earlier session: carry .carry/draft, then `cp -r .carry/draft /tmp/draft-parts`
# before sgl_train (it restores instead of training).
# Carry order (lab/gpu_carry.sh pack with ITEMS="eyas-deps vllm-deps vllm model sharegpt sglang qwen15", 48 MiB parts):
# eyas deps in p0, vLLM's deps by p1, vLLM by p4, SmolLM2 + ShareGPT by p6, SGLang by p10, the 1.5B's wheels by p32 (33 parts, restaged 2026-12-05).
# Or, on every call of session A (lab/GPU.md), carrying the next part:   bash lab/plan_real_targets.sh tick [WAIT_S]
# tick receives the parts, snapshots the tree once, starts each lane whose inputs have arrived and whose lanes before
# it are done (gputests, sgl_train, convert, kimi; timed alone once the first three ended, kimi stopped meanwhile and
# resumed after it; KIMI_FIRST=1: timed after kimi; sgl_check after sgl_train with SGL_CHECK=1), waits up to WAIT_S
# (default 20) and packs every log and result into $OUT/lanes.tgz; the first tick after timed brings the SmolLM2
# draft back instead (`back`, nothing else in that call): keep its draft.tar.NN as .carry/draft.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = tick ]; then
  PLAN=lab/plan_real_targets.sh; . lab/tick.sh
  # a draft an earlier session brought back (.carry/draft): sgl_train restores it instead of training
  [ -d .carry/draft ] && [ ! -d /tmp/draft-parts ] && cp -r .carry/draft /tmp/draft-parts
  # SKIP="kimi gputests ...": lanes a short session leaves out (a skipped lane counts as ended for those after it)
  want() { case " ${SKIP:-} " in *" $1 "*) return 1 ;; esac; }
  done_or_skipped() { for n in "$@"; do if want "$n" && ! ended "$n"; then return 1; fi; done; }
  want gputests && have eyas-deps && lane gputests
  have eyas-deps model sharegpt && lane sgl_train
  want convert && have eyas-deps qwen15 && lane convert
  # SGLang's served tree τ is measured (2026-12-04b and -05: 2.212 vs native 2.179); SGL_CHECK=1 measures it again
  sgl_check_asked() { [ "${SGL_CHECK:-0}" = 1 ]; }
  sgl_check_asked && have sglang && ok sgl_train && lane sgl_check
  # timed runs alone (its timings share the GPU and the host with nothing), once a trained draft is there (its
  # speedup runs serve it). By default it comes before the end of kimi: kimi starts with vLLM's parts, is stopped
  # when timed can start and resumes after it (its first results close issue 40; kimi, ≈ 12 min, is what a short
  # session can lose); KIMI_FIRST=1 lets kimi finish first, as on 2026-12-05.
  # NO_Q15=1: a session that carries p0-p10 only (no 1.5B): timed then skips the 1.5B's AR pace
  q15_ready() { [ "${NO_Q15:-0}" = 1 ] || { have qwen15 && ended convert; }; }
  timed_ready() { have vllm sglang && q15_ready && ok sgl_train && done_or_skipped gputests && \
                    { ! sgl_check_asked || ended sgl_check; }; }
  if [ "${KIMI_FIRST:-0}" = 1 ]; then
    want kimi && have eyas-deps vllm-deps vllm && lane kimi
    timed_ready && done_or_skipped kimi && lane timed
  else
    if timed_ready && ! ended timed; then
      running kimi && bash lab/lanes.sh stop kimi   # timed alone; kimi resumes after it from its state.json
      lane timed
    fi
    # kimi uses the minutes before timed can start (the carry), and runs again once timed ended or cannot run
    want kimi && have eyas-deps vllm-deps vllm && { ! timed_ready || ended timed; } && lane kimi
  fi
  if ended timed && ok sgl_train && [ -n "${OUT:-}" ] && [ ! -e /tmp/back.sent ]; then
    # alone in its call: the draft's parts (~47 MiB) and lanes.tgz together could pass the 64 MiB that come back
    bash lab/plan_real_targets.sh back && touch /tmp/back.sent && exit 0
  fi
  # the Kimi lane's step and engine logs come back with every call, not only when the lane ends
  PACK_EXTRA=/tmp/kimi bash lab/lanes.sh wait "${2:-20}"
  exit 0
fi
. /tmp/eyas-env.sh
export PYTHONUNBUFFERED=1 EYAS_CACHE=/tmp/ec
R=/tmp/res
E="python3 -m eyas.cli"
mkdir -p $R

case "${1:-}" in
  gputests)   # the GPU paths first run on this machine: graphed AR baseline, CUDA dequantisation
    python3 -m pytest -p no:timeout -q -m gpu tests/decode/test_decode_gpu.py -k graphed --junitxml $R/gputests.xml
    python3 -m pytest -p no:timeout -q -m gpu tests/target/test_dequant.py tests/target/test_gguf_convert.py \
      --junitxml $R/gputests_dequant.xml ;;
  kimi)       # issue 38: both toys, every step (resumable: rerun continues); every step's and engine's log beside.
              # First (10 s): does this torch hang a child forked after OpenMP (why the toy's engines never came up
              # on 2026-12-05 with fork; eyas's vLLM workers spawn since)?
    [ -f $R/fork_omp_check.txt ] || OMP_NUM_THREADS=4 timeout 60 python3 lab/fork_omp_check.py > $R/fork_omp_check.txt 2>&1
    # KIMI_TOYS="kimi-k2.5": the Kimi toy alone (the Llava control's vLLM steps are measured, 2026-12-05)
    python3 bench/kimi_toy.py --python /tmp/vpy --work /tmp/kimi --out $R/kimi_toy.json \
        ${KIMI_TOYS:+--toys $KIMI_TOYS}; rc=$?
    (cd /tmp/kimi && find . -name '*.log' | tar czf $R/kimi-logs.tgz -T -); exit $rc ;;
  sgl_train)  # a SmolLM2 draft SGLang's layer can run (residual before norm), or the one a session brought back
    if [ -d /tmp/draft-parts ]; then
      python3 lab/restore_draft.py --parts /tmp/draft-parts --target /tmp/smol-hf --out /tmp/run-s; exit $?
    fi
    $E prepare --target /tmp/smol-hf --data /tmp/sharegpt.json --out /tmp/prep-s --max-samples 4000 --json \
        > $R/prepare_s.json &&
    $E train --target /tmp/smol-hf --data /tmp/prep-s --online --out /tmp/run-s --no-norm-before-residual \
        --epochs 2 --batch-size 8 --lr 1e-3 --ttt-steps 7 --max-length 2048 > $R/train_s.log 2>&1 ;;
  sgl_check)  # SGLang's environment, then its tree served vs eyas's native tree (bf16: sgl_kernel has no fp32
              # RMSNorm), at a 0.3 memory share so the Kimi lane's vLLM engines keep room beside it
    $E doctor --target /tmp/smol-hf --engine sglang --json > $R/doctor_sglang.json
    $E export --draft /tmp/run-s --format sglang --out /tmp/x-sgl &&
    $E serve-check --draft /tmp/x-sgl --engine sglang --tree total=60,depth=7,topk=10 --per-category 2 \
        --max-new-tokens 128 --dtype bf16 --gpu-memory-utilization 0.3 --out $R/serve_check_sglang_tree_bf16.json ;;
  back)       # in a call (not a lane): the SmolLM2 draft into $OUT as draft.tar.NN (bf16, no embedding: the
              # target's), so a later session carries it as .carry/draft instead of training it again
    [ -n "${OUT:-}" ] && [ -f /tmp/run-s/model.safetensors ] || { echo "no OUT or no /tmp/run-s" >&2; exit 2; }
    mkdir -p /tmp/back/run9k && cp /tmp/run-s/config.json /tmp/run-s/metrics.jsonl /tmp/back/run9k/ &&
    python3 -c "import sys, torch; from safetensors.torch import load_file, save_file
sd = load_file(sys.argv[1]); save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v
for k, v in sd.items() if k != 'embed_tokens.weight'}, sys.argv[2])" /tmp/run-s/model.safetensors \
        /tmp/back/draft-bf16.safetensors &&
    tar cf - -C /tmp/back draft-bf16.safetensors run9k | split -b 15M -d - "$OUT/draft.tar." && ls -la "$OUT" ;;
  convert)    # issue 37 item 1: the 1.5B's GGUF -> bf16 HF dir on the GPU (goal <= 60 s), then doctor on it (transformers
              # 5.17: the stop-tokens check must name <|im_end|>)
    python3 bench/convert.py --target qwen2.5-coder-1.5b --device cuda --out $R/convert-q15-h200.json
    $E doctor --target qwen2.5-coder-1.5b --json > $R/doctor-q15.json ;;
  timed)      # alone on the GPU, in order of need (what closes an issue first); TIMED="sglang ar_smol" runs a subset
              # of: sglang (SGLang tree + chain, its AR), vllm (vLLM's chain, its AR), ar_q15, ar_smol (AR pace + prefill)
    t() { case " ${TIMED:-sglang vllm ar_q15 ar_smol} " in *" $1 "*) return 0 ;; esac; return 1; }
    [ -d /tmp/x-sgl ] || $E export --draft /tmp/run-s --format sglang --out /tmp/x-sgl
    t vllm && $E export --draft /tmp/run-s --format vllm --chain 3 --out /tmp/x-vllm-k3
    t sglang && python3 bench/vllm_speedup.py --engine sglang --target /tmp/smol-hf --export /tmp/x-sgl \
        --python /tmp/spy --chains 3 --trees total=60,depth=7,topk=10 --batch-sizes 1 8 --per-category 2 \
        --max-new-tokens 256 --engines-per-gpu 3 --out $R/speedup_sglang.json
    t vllm && python3 bench/vllm_speedup.py --engine vllm --target /tmp/smol-hf --export '/tmp/x-vllm-k{k}' \
        --python /tmp/vpy --chains 3 --batch-sizes 1 8 --per-category 2 --max-new-tokens 256 --engines-per-gpu 2 \
        --out $R/speedup_vllm.json
    t ar_q15 && [ -e "${CARRY_DIR:-/tmp/eyas-carry}/installed.qwen15" ] &&
    python3 bench/ar_pace.py --target qwen2.5-coder-1.5b --device cuda --per-category 2 --max-new-tokens 256 \
        --vllm-python /tmp/vpy --out $R/ar_pace_q15.json
    t ar_smol && python3 bench/ar_pace.py --target /tmp/smol-hf --device cuda --per-category 2 --max-new-tokens 256 \
        --vllm-python /tmp/vpy --out $R/ar_pace_smol.json
    true ;;
  *) sed -n '2,8p' "$0"; exit 2 ;;
esac
