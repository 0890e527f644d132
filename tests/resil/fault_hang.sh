#!/usr/bin/env bash
# Hangs in seconds, the culprit named. (1) SIGSTOP of a random rank at a random
# step: it stops beating, the other rank blocks in a collective; with the
# automatic timeout (steady steps of milliseconds: the 5 s floor) the
# supervisor names the frozen rank within the bound (+ polling slack), kills
# the launch, resumes, and ends with the uninterrupted run's params_xxh3.
# (2) Rank 1's main thread blocks for good in step 40 (KEEL_FAULT=hang@40:1)
# while its beat thread goes on: the event names rank 1 as the one that never
# arrived at the collective rank 0 runs.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
trap 'kill_leftovers; rm -rf "$TMP"' EXIT
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=200 --set checkpoint.every_steps=10 --set resilience.backoff_s=0.1 --nproc 2)
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 || { cat "$TMP/ref.out"; fail "reference run"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")

# first_failure RUN UNIX: the first failure event at or after UNIX
first_failure() {
  python3 - "$1/events.jsonl" "$2" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e["event"] == "failure" and e["unix_s"] >= float(sys.argv[2]):
        print(l.strip()); break
PY
}
bound=$(json "$TMP/ref/config.json" "max(j['resilience']['hang_floor_s'], 0)")

"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 &
sup=$!
rank=$(( RANDOM % 2 ))
pid=$(wait_train_step "$TMP/run" "$rank" $(( 50 + RANDOM % 50 )))
t0=$(date +%s.%N)
kill -STOP "$pid"
rc=0; wait "$sup" || rc=$?
[ "$rc" = 0 ] || { tail -20 "$TMP/run.out"; fail "keel train exit $rc after a hang, want 0"; }
line=$(first_failure "$TMP/run" "$t0") && [ -n "$line" ] || fail "no failure event after the SIGSTOP"
echo "$line" | grep -q "\"cause\":\"hang\",\"rank\":$rank" || fail "the hang does not name rank $rank: $line"
echo "$line" | grep -q "rank $rank stopped beating" || fail "not a rank that stopped beating: $line"
echo "$line" | grep -q "rank $rank (pid $pid) is stopped" || fail "the stopped rank is not named: $line"
detect=$(python3 -c "import json,sys; print(round(json.loads(sys.argv[1])['unix_s'] - float(sys.argv[2]), 2))" "$line" "$t0")
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) + 2 else 1)" "$detect" "$bound" ||
  fail "hang detected after $detect s (bound ${bound} s + 2 s of polling and beats)"
got=$(json "$TMP/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got after the hang, uninterrupted run $want"
src=$(json "$TMP/run/summary.json" "j['recovery_s']['split'][0]['source']")
[ "$src" = memory ] || fail "the recovery restored from '$src', want memory (the in-memory snapshot)"
pass "SIGSTOP of rank $rank: named after $detect s (bound ${bound} s), recovered from memory, params_xxh3 $want"

# a rank stuck in its own work, its process alive and beating
t0=$(date +%s.%N)
rc=0
KEEL_FAULT=hang@40:1 "$KEEL_BIN" train "$CFG" "${args[@]}" --set resilience.max_restarts=0 --run-dir "$TMP/stuck" \
  >"$TMP/stuck.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || { tail -5 "$TMP/stuck.out"; fail "exit $rc with max_restarts 0 after a hang, want 1"; }
line=$(first_failure "$TMP/stuck" "$t0") && [ -n "$line" ] || fail "no failure event for the stuck rank"
echo "$line" | grep -Eq '"cause":"hang","rank":1,.*rank 1 never arrived at collective #[0-9]+, which 1 other rank\(s\) run' ||
  fail "the stuck rank is not named as the one that never arrived: $line"
started=$(python3 - "$TMP/stuck/events.jsonl" <<'PY'
import json, sys
print([json.loads(l)["detail"] for l in open(sys.argv[1]) if '"failure"' in l][0])
PY
)
pass "rank 1 stuck in step 40: $started"
