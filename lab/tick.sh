# Sourced by each lab plan's `tick` (PLAN=lab/plan_X.sh; . lab/tick.sh): where the carry and the lanes live, the tests
# a plan asks of them, and what every tick does first — receive the part this call carried, snapshot the tree once.
C=${CARRY_DIR:-/tmp/eyas-carry} L=${LANES_DIR:-/tmp/lanes}   # (both overridable for the tests)
have() { for i in "$@"; do [ -e "$C/installed.$i" ] || return 1; done; }                 # carry items installed
carried() { grep -q "\"name\": \"$1\"" "$C/index.json" 2>/dev/null; }                   # an item of this pack
ended() { for n in "$@"; do [ -f "$L/$n.rc" ] || return 1; done; }                       # lanes ended
ok() { for n in "$@"; do [ "$(cat "$L/$n.rc" 2>/dev/null)" = 0 ] || return 1; done; }   # ... with exit 0
running() { [ -f "$L/$1.pid" ] && [ ! -f "$L/$1.rc" ]; }                                 # a lane under way
lane() { bash lab/lanes.sh start "$1" bash "$PLAN" "${2:-$1}"; }                          # lane NAME [JOB]
if [ -d .carry ]; then bash lab/gpu_carry.sh recv || true; fi
[ -d /tmp/snap ] || bash lab/lanes.sh snap
