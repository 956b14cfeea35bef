#!/usr/bin/env bash
# What one-pass drafting saves on a GPU (issue 39): each drafter kind's round cost — drafting vs verification, chain
# and tree(60,7,10) — on a target's real shape with random weights, so no weights travel (a few minutes of device
# time). Random drafts accept almost nothing, so every round is one full draft + one verify: the per-round times are
# what a trained draft of the kind pays; τ comes from the trained comparisons (BENCHMARKS "Parallel drafters").
#   carry: [".carry/p0" (ITEMS="eyas-deps"), ".carry/skel" (the target's config.json + tokenizer files)]
#   bash lab/plan_round_costs.sh .carry/skel        -> $OUT/rc-<kind>.json (eyas eval JSON), $OUT/rc.log
# Order: EAGLE-3, P-EAGLE, DFlash (each eval writes its JSON as it ends, so a cut call keeps the first kinds).
set -uo pipefail
cd "$(dirname "$0")/.."
SKEL=${1:?skeleton dir (config.json + tokenizer)}
R=${OUT:-/tmp/rc-out}; mkdir -p "$R"
exec > >(tee -a "$R/rc.log") 2>&1
if [ "${NO_RECV:-0}" = 1 ]; then export PYTHONPATH=$PWD/src   # (a CPU smoke run: eyas from this tree)
else bash lab/gpu_carry.sh recv > /dev/null && . /tmp/eyas-env.sh || exit 1; fi
export EYAS_CACHE=/tmp/ec PYTHONUNBUFFERED=1
T=${RT:-/tmp/rt} DEV=${DEV:-cuda}   # (RT, DEV, MAX_NEW: for a CPU smoke run)
[ -f $T/model.safetensors ] || python3 - "$SKEL" $T $DEV <<'PY' || exit 1
import shutil, sys, time
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
skel, out = Path(sys.argv[1]), Path(sys.argv[2])
t0 = time.time()
cfg = AutoConfig.from_pretrained(skel)
torch.manual_seed(0)
with torch.device(sys.argv[3]):
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained(out)
for f in skel.iterdir():
    if f.name != "config.json":
        shutil.copy(f, out / f.name)
print(f"random {cfg.architectures} -> {out} in {time.time() - t0:.1f} s")
PY
for kind in ${KINDS:-eagle3 p-eagle dflash}; do   # (KINDS: a subset, in the order wanted)
  k=3; [ $kind = eagle3 ] || k=7        # EAGLE-3's best chain; the parallel kinds draft all 7 in their one pass
  python3 bench/random_draft.py --target $T --out /tmp/rd-$kind --draft-kind $kind --ttt-steps 7 || continue
  python3 -m eyas.cli eval --draft /tmp/rd-$kind --target $T --per-category 1 --max-new-tokens ${MAX_NEW:-96} --chain $k \
      --tree total=60,depth=7,topk=10 --device $DEV --temperature 0 --baseline-cache /tmp/rc-bcache \
      --out "$R/rc-$kind.json"
  python3 - "$R/rc-$kind.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    t, n = r["time_s"], max(1, r["steps"])
    print(r["setting"], f"rounds {n}", f"draft {1e3 * t['draft'] / n:.3f} ms", f"verify {1e3 * t['verify'] / n:.3f} ms",
          f"AR {r['baseline_tokens_per_s']:.1f} tok/s")
PY
done
