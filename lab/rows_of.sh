#!/usr/bin/env bash
# The rows.tgz that `plan_q15_draft.sh back` brought home, to stdout, from DIR: its rows.tgz.NN, or (parts brought
# before the rows came apart) the ./rows.tgz inside its draft.tar.NN.    bash lab/rows_of.sh DIR > rows.tgz
set -euo pipefail
d=${1:?folder of what back brought}
if ls "$d"/rows.tgz.* > /dev/null 2>&1; then cat "$d"/rows.tgz.*
else cat "$d"/draft.tar.* | tar xO ./rows.tgz; fi
