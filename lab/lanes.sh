#!/usr/bin/env bash
# Background lanes on the GPU machine, one short device call at a time (the machine is given back ~30 s after a
# call returns, so work runs in detached lanes and every call returns quickly or waits on them):
#   bash lab/lanes.sh start NAME CMD...   run CMD in its own session (survives the call), log /tmp/lanes/NAME.log,
#                                         exit status in /tmp/lanes/NAME.rc when it ends; a lane already started or
#                                         finished is not started again (a repeated call is harmless)
#   bash lab/lanes.sh after NAME WAIT CMD...   the same, but CMD starts once lane WAIT has ended (rc file present)
#   bash lab/lanes.sh wait SECONDS [NAME...]   wait until the named lanes (default: all) have ended, at most SECONDS;
#                                         prints each lane's state and its log's last lines; then `pack`
#   bash lab/lanes.sh stop NAME           kill a running lane and everything below it; `start` runs it afresh (a
#                                         resumable job continues), its earlier log kept as NAME.log.N
#   bash lab/lanes.sh pack                $OUT/lanes.tgz: every lane's log and rc, and /tmp/res (results JSON)
#                                         (and PACK_EXTRA's small logs / JSON)
#   bash lab/lanes.sh snap                copy the tree (less .carry, .whl) to /tmp/snap and run later lanes from there:
#                                         each device call re-copies the working tree, and a file being replaced
#                                         under a running lane is missing for a moment
# Lanes start in /tmp/snap when it exists (after `snap`), else in the current directory.
# Lanes write their results under /tmp/res (RES), which `pack` brings back with every call.
set -uo pipefail
L=${LANES_DIR:-/tmp/lanes}
RES=${RES:-/tmp/res}
mkdir -p "$L" "$RES"

state() {  # state NAME -> running | done rc=N | none
  if [ -f "$L/$1.rc" ]; then echo "done rc=$(cat "$L/$1.rc")"
  elif [ -f "$L/$1.pid" ]; then echo running
  else echo none; fi
}

start() {
  local name=$1; shift
  [ "$(state "$name")" = none ] || { echo "lane $name: $(state "$name") (not started again)"; return 0; }
  local dir=$PWD; [ -d /tmp/snap ] && dir=/tmp/snap
  setsid bash -c 'L=$1; cd "$2"; n=$3; shift 3; "$@" > "$L/$n.log" 2>&1; echo $? > "$L/$n.rc"' \
    _ "$L" "$dir" "$name" "$@" < /dev/null > /dev/null 2>&1 &
  echo $! > "$L/$name.pid"
  echo "lane $name started (pid $!)"
}

after() {
  local name=$1 prev=$2; shift 2
  start "$name" bash -c 'while [ ! -f "$0" ]; do sleep 2; done; exec "$@"' "$L/$prev.rc" "$@"
}

pack() {  # PACK_EXTRA="DIR ...": their *.log / *.json files under 5 MB come too (a lane's logs before it ends)
  [ -n "${OUT:-}" ] || return 0
  local extra=() d
  for d in ${PACK_EXTRA:-}; do
    [ -d "$d" ] && while IFS= read -r f; do extra+=("${f#/}"); done < <(find "$d" -type f \( -name '*.log' \
      -o -name '*.json' \) -size -5M)
  done
  tar czf "$OUT/lanes.tgz" -C / "${L#/}" "${RES#/}" ${extra[@]+"${extra[@]}"} 2>/dev/null
  echo "packed $(du -h "$OUT/lanes.tgz" | cut -f1)"
}

wait_for() {
  local limit=$1; shift
  local names=("$@") t0=$SECONDS
  [ ${#names[@]} -gt 0 ] || names=($(ls "$L" 2>/dev/null | sed -n 's/\.pid$//p'))
  while [ $((SECONDS - t0)) -lt "$limit" ]; do
    local busy=0
    for n in "${names[@]}"; do [ "$(state "$n")" = running ] && busy=1; done
    [ $busy = 0 ] && break
    sleep 3
  done
  for n in "${names[@]}"; do
    echo "== $n: $(state "$n")"
    tail -n 4 "$L/$n.log" 2>/dev/null | cut -c1-300
  done
  pack
}

stop() {  # stop NAME: a running lane and every process below it, engine workers in sessions of their own included
  local name=$1 n=1
  [ "$(state "$name")" = running ] || { echo "lane $name: $(state "$name") (nothing to stop)"; return 0; }
  # the lane's shell first (it can no longer write an exit status), then all below it: bench/_steps.kill_tree
  python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from _steps import kill_tree; kill_tree(int(sys.argv[2]))' \
    "$(dirname "$0")/../bench" "$(cat "$L/$name.pid")"
  while [ -e "$L/$name.log.$n" ]; do n=$((n + 1)); done
  mv "$L/$name.log" "$L/$name.log.$n" 2>/dev/null
  rm -f "$L/$name.pid" "$L/$name.rc"
  echo "lane $name stopped (its log kept as $name.log.$n; \`start\` runs it again)"
}

snap() {
  rm -rf /tmp/snap.new && mkdir /tmp/snap.new && tar c --exclude=./.carry --exclude=./.whl . | tar x -C /tmp/snap.new
  rm -rf /tmp/snap && mv /tmp/snap.new /tmp/snap
  [ -f /tmp/eyas-env.sh ] && sed -i "s#^export PYTHONPATH=[^:]*/src:#export PYTHONPATH=/tmp/snap/src:#" /tmp/eyas-env.sh
  echo "snapshot in /tmp/snap ($(du -sh /tmp/snap | cut -f1))"
}

case "${1:-}" in
  snap) snap ;;
  start) shift; start "$@" ;;
  after) shift; after "$@" ;;
  wait) shift; wait_for "$@" ;;
  stop) shift; stop "$@" ;;
  pack) pack ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
