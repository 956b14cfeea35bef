#!/usr/bin/env bash
# Background lanes on the GPU machine, one short device call at a time (the machine is given back ~30 s after a
# call returns, so work runs in detached lanes and every call returns quickly or waits on them):
#   bash lab/lanes.sh start NAME CMD...   run CMD in its own session (survives the call), log /tmp/lanes/NAME.log,
#                                         exit status in /tmp/lanes/NAME.rc when it ends; a lane already started or
#                                         finished is not started again (a repeated call is harmless)
#   bash lab/lanes.sh after NAME WAIT CMD...   the same, but CMD starts once lane WAIT has ended (rc file present)
#   bash lab/lanes.sh wait SECONDS [NAME...]   wait until the named lanes (default: all) have ended, at most SECONDS;
#                                         prints each lane's state and its log's last lines; then `pack`
#   bash lab/lanes.sh pack                $OUT/lanes.tgz: every lane's log and rc, and /tmp/res (results JSON)
#   bash lab/lanes.sh snap                copy the tree (less .carry, .whl) to /tmp/snap and run later lanes from there:
#                                         each device call re-copies the working tree, and a file being replaced
#                                         under a running lane is missing for a moment
# Lanes start in /tmp/snap when it exists (after `snap`), else in the current directory.
# Lanes write their results under /tmp/res (RES), which `pack` brings back with every call.
set -uo pipefail
L=/tmp/lanes
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
  setsid bash -c 'cd "$1"; shift; n=$1; shift; "$@" > /tmp/lanes/$n.log 2>&1; echo $? > /tmp/lanes/$n.rc' \
    _ "$dir" "$name" "$@" < /dev/null > /dev/null 2>&1 &
  echo $! > "$L/$name.pid"
  echo "lane $name started (pid $!)"
}

after() {
  local name=$1 prev=$2; shift 2
  start "$name" bash -c 'while [ ! -f /tmp/lanes/$0.rc ]; do sleep 2; done; exec "$@"' "$prev" "$@"
}

pack() {
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/lanes.tgz" -C / tmp/lanes "${RES#/}" 2>/dev/null
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
  pack) pack ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
