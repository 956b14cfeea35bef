#!/usr/bin/env bash
# vLLM 0.26 on the H200(s): every eyas vLLM path on the real engine, stage by stage (issue 12).
# First bring vLLM, the model and data over with lab/gpu_carry.sh (5 calls), then, on the GPU machine:
#   bash lab/gpu_vllm.sh STAGE...        results (JSON) in $RES (default $OUT, else /tmp/w/results)
# Stages (W=/tmp/w; the target is /tmp/smol-hf, vLLM's python /tmp/vpy, ShareGPT rows /tmp/sharegpt.json):
#   train_bg    in the background on GPU $TRAIN_GPU (1): prepare the 9k rows, train the online 4M-token draft
#               (the "run9k" recipe of BENCHMARKS.md), export it for vLLM -> $W/run9k, $W/export, $W/train.done
#   doctor      eyas doctor --engine vllm against the carried vLLM
#   extract_eq  prepare $EQ_ROWS rows; extract with the hf and the vllm backends; compare state by state
#   regen       regenerate $REGEN_ROWS rows with hf and vllm (match rate), then $REGEN_BIG rows with vllm (tok/s)
#               (vllm: --engine-max-seqs $ENGINE_MAX_SEQS, default 2048; --engine-max-batched-tokens
#               $ENGINE_MAX_BATCHED_TOKENS only when set, else vLLM's own per-step token budget;
#               --engine-replicas $ENGINE_REPLICAS, default 1: engines sharing the GPU; ENGINE_ASYNC=1 adds
#               --engine-async-scheduling)
#   regen_hf    only regen's hf half (the match sample; regen then skips it)
#   tp2         extract with vllm --tensor-parallel-size 2 (both GPUs) and compare with the hf store; SmolLM2 has 9
#               attention heads, which no TP degree > 1 divides, so this stage builds a random 8-head Llama of the
#               same vocabulary and template (/tmp/rand8) and compares on it
#   serve       eyas serve-check of the trained export on the GPU
#   speedup     vLLM tok/s with and without the draft, K in $CHAINS, batch 1/8/32 (bench/vllm_speedup.py)
#   fetch_draft copy the trained draft to $RES in parts of < 16 MiB (to carry into a later session)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Results go to $RES, default /tmp/w/results: the device empties $OUT before every call, so copy what you need
# into $OUT at the end of the call that wants it back (at most 8 files of < 16 MiB come back).
W=/tmp/w; RES="${RES:-$W/results}"; mkdir -p "$W" "$RES"
source /tmp/eyas-env.sh
# Each stage runs from its own snapshot of the code, so a later call's newer tree never changes a running job.
snap() { local d="/tmp/eyas-snap/$1"; rm -rf "$d"; mkdir -p "$d"; cp -r "$ROOT/src" "$ROOT/bench" "$d/"; echo "$d"; }
T=/tmp/smol-hf; VPY=/tmp/vpy
EQ_ROWS="${EQ_ROWS:-400}"; REGEN_ROWS="${REGEN_ROWS:-64}"; REGEN_BIG="${REGEN_BIG:-2000}"
CHAINS="${CHAINS:-1 2 3 4 5}"; TRAIN_GPU="${TRAIN_GPU:-1}"; GPU="${GPU:-0}"
timed() {  # timed NAME CMD...: run, log to $RES/NAME.log, record seconds and rc in $RES/times.jsonl
  local name=$1; shift; local t0; t0=$(date +%s.%N)
  echo "== $name: $*"
  "$@" > "$RES/$name.log" 2>&1; local rc=$?
  local s; s=$(python3 -c "print(round($(date +%s.%N) - $t0, 2))")
  echo "{\"stage\": \"$name\", \"seconds\": $s, \"rc\": $rc}" | tee -a "$RES/times.jsonl"
  [ $rc = 0 ] || tail -25 "$RES/$name.log"
  return $rc
}

for stage in "$@"; do
  D=$(snap "$stage"); export PYTHONPATH="$D/src:/tmp/site"; EYAS=(python3 -m eyas.cli)
  case "$stage" in
    train_bg)
      cat > "$W/train.sh" <<SH
set -x
export PYTHONPATH=$PYTHONPATH CUDA_VISIBLE_DEVICES=$TRAIN_GPU
t0=\$(date +%s)
python3 -m eyas.cli prepare --target $T --data /tmp/sharegpt.json --out $W/p9k --max-length 1024 \
  --draft-vocab-size 16384 --workers 8 --overwrite --json || exit 1
python3 -m eyas.cli train --target $T --data $W/p9k --online --out $W/run9k --ttt-steps 7 --steps 1000 \
  --batch-size 8 --lr 1e-3 --eval-every 200 --eval-batches 16 --no-init-head --seed 0 || exit 1
python3 -m eyas.cli export --draft $W/run9k --format vllm --out $W/export || exit 1
echo "{\"train_total_s\": \$(( \$(date +%s) - t0 ))}" > $W/train.done
SH
      setsid nohup bash "$W/train.sh" > "$W/train.log" 2>&1 < /dev/null &
      echo "training in the background on GPU $TRAIN_GPU: $W/train.log" ;;
    doctor)
      timed doctor "${EYAS[@]}" doctor --target $T --engine vllm --python $VPY --json ;;
    extract_eq)
      export CUDA_VISIBLE_DEVICES=$GPU
      timed eq_prepare "${EYAS[@]}" prepare --target $T --data /tmp/sharegpt.json --max-samples "$EQ_ROWS" \
        --out $W/peq --max-length 1024 --draft-vocab-size 4096 --workers 8 --overwrite --json
      timed eq_extract_hf "${EYAS[@]}" extract --target $T --data $W/peq --out $W/s-hf --overwrite
      timed eq_extract_vllm "${EYAS[@]}" extract --target $T --data $W/peq --out $W/s-vllm --backend vllm \
        --python $VPY --overwrite
      timed eq_compare python3 "$D/bench/compare_stores.py" $W/s-hf $W/s-vllm --reference $T \
        --out "$RES/extract_eq.json" ;;
    tp2)
      unset CUDA_VISIBLE_DEVICES
      python3 - <<'PY'
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
tok, c = AutoTokenizer.from_pretrained("/tmp/smol-hf"), LlamaConfig.from_pretrained("/tmp/smol-hf")
c.num_attention_heads, c.num_key_value_heads, c.hidden_size, c.head_dim = 8, 4, 512, 64
c.intermediate_size, c.num_hidden_layers = 1536, 16
torch.manual_seed(0)
LlamaForCausalLM(c).to(torch.bfloat16).save_pretrained("/tmp/rand8")
tok.save_pretrained("/tmp/rand8")
PY
      cp $T/generation_config.json /tmp/rand8/
      timed tp2_prepare "${EYAS[@]}" prepare --target /tmp/rand8 --data /tmp/sharegpt.json --max-samples 200 \
        --out $W/p8 --max-length 1024 --draft-vocab-size 4096 --workers 8 --overwrite
      timed tp2_extract_hf "${EYAS[@]}" extract --target /tmp/rand8 --data $W/p8 --out $W/s8-hf --overwrite
      timed tp2_extract_vllm "${EYAS[@]}" extract --target /tmp/rand8 --data $W/p8 --out $W/s8-tp2 --backend vllm \
        --python $VPY --tensor-parallel-size 2 --overwrite
      timed tp2_compare python3 "$D/bench/compare_stores.py" $W/s8-hf $W/s8-tp2 --reference /tmp/rand8 \
        --out "$RES/extract_eq_tp2.json" ;;
    regen_hf|regen)
      # the hf half is the match sample only (not timed): a one-GPU session runs it beside untimed work first
      export CUDA_VISIBLE_DEVICES=$GPU
      common=(--target $T --data /tmp/sharegpt.json --max-new-tokens 256 --json)
      if [ ! -e $W/rg-hf.done ]; then
        rm -f $W/rg-hf.jsonl*
        timed regen_hf "${EYAS[@]}" regenerate "${common[@]}" --max-samples "$REGEN_ROWS" --batch-size "$REGEN_ROWS" \
          --out $W/rg-hf.jsonl && touch $W/rg-hf.done
      fi
      [ "$stage" = regen_hf ] && continue
      rm -f $W/rg-vllm-big.jsonl*
      # one vLLM run: its first REGEN_ROWS rows are the match sample (compared on the rows both wrote), all of
      # it the speed; continuous batching: eyas keeps max_num_seqs + 1/4 requests in the engine and a finished
      # turn's follow-up goes in at once (backend_stats: in-flight mean and timeline, tok/s over engine time);
      # --engine-max-seqs 2048: vLLM's default 1,024 running capped the old 1,909-prompt first wave (21.8k tok/s)
      # ENGINE_MAX_BATCHED_TOKENS: vLLM's per-step token budget. The 17.2k tok/s run's "~330 in flight per step" was
      # a mean over steps, most of them the tail's short ones; its full window ran ~1,700 requests at ~74 ms a step
      # (inferred), where vLLM also detokenized every request each step (now off); the worker's by_load says it now
      knobs=(); [ -n "${ENGINE_MAX_BATCHED_TOKENS:-}" ] \
        && knobs=(--engine-max-batched-tokens "$ENGINE_MAX_BATCHED_TOKENS")
      # ENGINE_REPLICAS / ENGINE_ASYNC: SmolLM2's engine is bound by its one engine-core CPU thread (78 ms a step
      # at ~1,720 in flight, 4.8 ms at 47), not by the GPU; N engines on the GPU (0.9/N of its memory each) split
      # that work (async scheduling, which overlaps it with the GPU step, is vLLM 0.26's default already)
      [ "${ENGINE_ASYNC:-0}" = 1 ] && knobs+=(--engine-async-scheduling)
      timed regen_vllm_big "${EYAS[@]}" regenerate "${common[@]}" --max-samples "$REGEN_BIG" --backend vllm \
        --python $VPY --engine-max-seqs "${ENGINE_MAX_SEQS:-2048}" --engine-replicas "${ENGINE_REPLICAS:-1}" \
        --engine-startup-timeout "${ENGINE_STARTUP_TIMEOUT:-$((150 * ${ENGINE_REPLICAS:-1} + 60))}" "${knobs[@]}" --out $W/rg-vllm-big.jsonl
      # ENGINE_STARTUP_TIMEOUT: an engine takes ~75 s to come up on the H200 and replicas build one at a time; a
      # start-up that hangs (2026-12-02: ~590 s of device time) now stops the stage instead of the session.
      # Each engine's own log (one per replica), whatever happened: a hang said nothing in regen_vllm_big.log
      for f in $W/rg-vllm-big.jsonl.vllm*.log; do [ -e "$f" ] && tail -c 60000 "$f" > "$RES/${f##*/}"; done
      timed regen_compare python3 "$D/bench/regen_compare.py" --target $T --out "$RES/regen_vllm.json" \
        --pair $W/rg-hf.jsonl $W/rg-vllm-big.jsonl --logs "$RES/regen_hf.log" "$RES/regen_vllm_big.log" \
        --throughput $W/rg-vllm-big.jsonl "$RES/regen_vllm_big.log" ;;
    serve)
      timed serve_check "${EYAS[@]}" serve-check --draft $W/export --engine vllm --python $VPY --per-category 2 \
        --max-new-tokens 128 --out "$RES/serve_check_gpu.json" ;;
    speedup)
      # vLLM takes K from the export's own config, so each K is its own export.
      for k in $CHAINS; do "${EYAS[@]}" export --draft $W/run9k --format vllm --chain "$k" --out "$W/export-k$k" \
        > "$RES/export_k$k.log" 2>&1 || { echo "export K=$k failed"; tail "$RES/export_k$k.log"; }; done
      timed speedup python3 "$D/bench/vllm_speedup.py" --target $T --export "$W/export-k{k}" --python $VPY \
        --chains $CHAINS --batch-sizes 1 8 32 --per-category 2 --max-new-tokens 256 --gpus 0 1 \
        --out "$RES/vllm_speedup.json" ;;
    fetch_draft)
      # bf16 and without the embedding (the target's, shared): ~25 MB, two parts
      python3 - <<PY
import torch
from safetensors.torch import load_file, save_file
sd = load_file("$W/run9k/model.safetensors")
save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items() if k != "embed_tokens.weight"},
          "$W/draft-bf16.safetensors")
PY
      tar cf - -C $W draft-bf16.safetensors run9k/config.json run9k/metrics.jsonl | split -b 15M -d - "$RES/draft.tar."
      cp $W/train.log "$RES/train.log" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
