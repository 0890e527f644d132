#!/usr/bin/env bash
# comm's Gloo transport (KEEL_TRANSPORT=gloo): ranks started on their own —
# no mpirun — find each other through a file store and run the build's
# tests/mpi_collectives, which checks every collective exactly, the ring's
# order of sums bit for bit (so results are the MPI transport's), uneven
# groups, many outstanding requests and progress during compute, on 1 to 4
# ranks and in pieces of 1000 elements. A rank killed mid-run, in a
# collective or while its peers wait for it on a node window, makes every
# survivor exit 78 within seconds, naming a lost rank; a bad KEEL_* variable
# is one line naming it.
source "$KEEL_SRC/tests/lib.sh"
cleanup() { kill_leftovers; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
prog=$KEEL_BUILD/tests/mpi_collectives
[ -x "$prog" ] || fail "$prog not built"

# ranks NAME NP [VAR=VALUE...]: start NP ranks of $prog in the background,
# each with its own stdout/stderr $TMP/NAME.R.{out,err}; their pids (env
# execs the program) in PIDS. ctest's timeout bounds a hang.
ranks() {
  local name=$1 np=$2
  shift 2
  mkdir -p "$TMP/store.$name"
  PIDS=()
  for r in $(seq 0 $((np - 1))); do
    env "$@" KEEL_TRANSPORT=gloo KEEL_RANK="$r" KEEL_WORLD_SIZE="$np" KEEL_STORE="file:$TMP/store.$name" \
      KEEL_STORE_PREFIX="$name" KEEL_HOST=127.0.0.1 "$prog" </dev/null \
      >"$TMP/$name.$r.out" 2>"$TMP/$name.$r.err" &
    PIDS+=($!)
  done
}

# 1. every collective, exactly, on 1-4 ranks; then in pieces
for np in 1 2 3 4; do
  ranks "np$np" "$np"
  for r in "${!PIDS[@]}"; do
    wait "${PIDS[$r]}" || fail "$np ranks: rank $r exited $?: $(tail -5 "$TMP/np$np.$r.err")"
  done
  grep -q "^ok: $np ranks" "$TMP/np$np.0.out" || fail "$np ranks: $(cat "$TMP/np$np.0.out")"
  pass "$np ranks over Gloo: $(sed -n 's/^ok: //p' "$TMP/np$np.0.out")"
done
ranks pieces 3 KEEL_COMM_MAX_COUNT=1000
for r in "${!PIDS[@]}"; do wait "${PIDS[$r]}" || fail "pieces: rank $r exited $?: $(tail -5 "$TMP/pieces.$r.err")"; done
grep -q "^ok: 3 ranks" "$TMP/pieces.0.out" || fail "pieces: $(cat "$TMP/pieces.0.out")"
pass "3 ranks over Gloo, collectives in pieces of at most 1000 elements"

# kill_rank2 NAME [WITHIN]: kill rank 2 of the 3 started as NAME; ranks 0 and 1 must exit 78
# within WITHIN s (5; the seconds they took in $took)
kill_rank2() {
  local name=$1 within=${2:-5} killed rc r
  kill -9 "${PIDS[2]}" || fail "$name: rank 2 was gone before it was killed: $(tail -3 "$TMP/$name.2.err")"
  killed=$(date +%s.%N)
  for r in 0 1; do
    rc=0
    wait "${PIDS[$r]}" || rc=$?
    [ "$rc" = 78 ] || fail "$name: rank $r exited $rc after rank 2 was killed, want 78: $(tail -3 "$TMP/$name.$r.err")"
  done
  took=$(python3 -c "import time; print(round(time.time() - $killed, 2))")
  python3 -c "import sys; sys.exit(not $took < $within)" || fail "$name: the survivors took $took s to end"
}

# 2. a rank killed mid-run: the survivors end within seconds, exit 78, naming a lost rank
ranks kill 3
sleep 1 # connected within milliseconds; the collectives take seconds
kill_rank2 kill
grep -q "^keel: error: comm: lost rank [0-9] (gloo: .*): it died or its host went away" \
  "$TMP"/kill.[01].err || fail "no line names the lost peer: $(cat "$TMP"/kill.[01].err)"
grep -q "lost rank 2 " "$TMP"/kill.[01].err || fail "no survivor names rank 2: $(cat "$TMP"/kill.[01].err)"
pass "rank 2 killed: ranks 0 and 1 exit 78 within $took s: $(grep -h '^keel: error' "$TMP"/kill.[01].err | head -1)"

# 2b. a rank gone while the others wait for it on a node window (no collective
# in flight): they see its process gone for 5 s (the backstop's grace: keel
# train's watch of its peers names it first) and end the same way
ranks window 3 KEEL_TEST_WINDOW_STALL=2
sleep 2 # the window made; ranks 0 and 1 asleep on rank 2's part
kill_rank2 window 9
grep -q "^keel: error: comm: lost rank 2 (its process [0-9]* is gone) while waiting on a node window" \
  "$TMP"/window.[01].err || fail "window: no line names the lost peer: $(cat "$TMP"/window.[01].err)"
python3 -c "import sys; sys.exit(not $took >= 4)" || fail "window: the survivors ended after $took s, before the 5 s grace"
pass "rank 2 killed while the others wait on a node window: exit 78 after $took s (the grace: 5 s)"

# 3. bad variables: one line naming the variable, no hang
expect_gloo_error() { # WHAT PATTERN VAR=VALUE...
  local what=$1 pattern=$2 rc=0
  shift 2
  env "$@" timeout 60 "$prog" </dev/null >"$TMP/bad.out" 2>"$TMP/bad.err" || rc=$?
  [ "$rc" != 0 ] || fail "$what: exit 0"
  [ "$(grep -c '^keel: error' "$TMP/bad.err")" = 1 ] && grep -q "$pattern" "$TMP/bad.err" ||
    fail "$what: $(cat "$TMP/bad.err")"
  pass "$what: $(grep '^keel: error' "$TMP/bad.err")"
}
mkdir -p "$TMP/store.bad"
expect_gloo_error "an unknown transport" 'KEEL_TRANSPORT="tcp" is not a transport' KEEL_TRANSPORT=tcp
expect_gloo_error "no KEEL_RANK" 'KEEL_RANK="" is not set' KEEL_TRANSPORT=gloo KEEL_WORLD_SIZE=2 \
  KEEL_STORE="file:$TMP/store.bad"
expect_gloo_error "a rank past the world" 'KEEL_RANK="2" is not a number in range' KEEL_TRANSPORT=gloo KEEL_RANK=2 \
  KEEL_WORLD_SIZE=2 KEEL_STORE="file:$TMP/store.bad"
expect_gloo_error "no store" 'KEEL_STORE="" is not a store' KEEL_TRANSPORT=gloo KEEL_RANK=0 KEEL_WORLD_SIZE=1
