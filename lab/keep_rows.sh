#!/usr/bin/env bash
# Keep the self-written rows a GPU session brought home (`plan_q15_draft.sh back`: rows.tgz.00, .01, ...) in git,
# the one thing a new checkout keeps, without them travelling with every later device call (every tracked file
# does): commit them, note the commit in lab/ROWS, then take them out of the tree in a second commit.
#   bash lab/keep_rows.sh NAME DIR      e.g. bash lab/keep_rows.sh q15-17m DIR   (DIR: the rows.tgz.NN of the back replies, gathered)
# A later pack takes the newest (or a named) line of lab/ROWS:
#   ROWS_GIT=$(bash lab/keep_rows.sh latest [NAME]) ITEMS="eyas-deps q15back qwen15" bash lab/gpu_carry.sh pack
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ "${1:-}" = latest ]; then   # the ROWS_GIT spec of the newest kept rows (of NAME, when given)
  line=$(grep -v '^#' lab/ROWS 2>/dev/null | awk -v n="${2:-}" 'n == "" || $1 == n' | tail -1)
  [ -n "$line" ] || { echo "lab/ROWS: no rows kept${2:+ named $2}" >&2; exit 2; }
  echo "$line" | awk '{print $2}'; exit 0
fi
NAME=${1:?name, e.g. q15-17m} DIR=${2:?folder holding rows.tgz.NN}
ls "$DIR"/rows.tgz.* > /dev/null 2>&1 || { echo "$DIR: no rows.tgz.NN parts" >&2; exit 2; }
[ -z "$(git status --porcelain lab/ROWS bench/data 2>/dev/null)" ] || { echo "lab/ROWS or bench/data has uncommitted changes" >&2; exit 2; }
P=bench/data/$NAME-rows.tgz
mkdir -p bench/data
cat "$DIR"/rows.tgz.* > "$P"
tar tzf "$P" > /dev/null || { rm -f "$P"; echo "$P: the parts do not join to a readable tar.gz" >&2; exit 2; }
rows=$(tar xzOf "$P" self.jsonl | wc -l)
git add "$P" && git commit -q -m "rows: $NAME ($rows self-written rows, kept in history; out of the tree next commit)" -- "$P"
rev=$(git rev-parse HEAD)
[ -f lab/ROWS ] || printf '# NAME ROWS_GIT (REV:PATH) rows date — self-written rows kept in git history (lab/keep_rows.sh)\n' > lab/ROWS
echo "$NAME $rev:$P $rows $(date -u +%F)" >> lab/ROWS
git rm -q "$P" && git add lab/ROWS && git commit -q -m "rows: $NAME out of the tree (ROWS_GIT=$rev:$P, lab/ROWS)" -- "$P" lab/ROWS
echo "kept $rows rows: ROWS_GIT=$rev:$P"
