#!/usr/bin/env bash
# SIGSTOP of a rank: its heartbeat stops and the other rank blocks in a
# collective; the supervisor sees the hang within resilience.hang_timeout_s
# (+ a few seconds), names the stopped rank, kills the launch and resumes,
# ending with the uninterrupted run's params_xxh3.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=200 --set checkpoint.every_steps=10 --set resilience.backoff_s=0.1
      --set resilience.hang_timeout_s=3 --nproc 2)
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 || { cat "$TMP/ref.out"; fail "reference run"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")

"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 &
sup=$!
rank=$(( RANDOM % 2 ))
pid=$(wait_train_step "$TMP/run" "$rank" $(( 50 + RANDOM % 50 )))
t0=$(date +%s.%N)
kill -STOP "$pid"
rc=0; wait "$sup" || rc=$?
[ "$rc" = 0 ] || { tail -20 "$TMP/run.out"; fail "keel train exit $rc after a hang, want 0"; }
# the first failure after the SIGSTOP (a loaded machine may add a spurious one: 3 s is tight)
line=$(python3 - "$TMP/run/events.jsonl" "$t0" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e["event"] == "failure" and e["unix_s"] >= float(sys.argv[2]):
        print(l.strip()); break
PY
) && [ -n "$line" ] || fail "no failure event after the SIGSTOP"
echo "$line" | grep -q "hang: no heartbeat" || fail "failure is not a hang: $line"
echo "$line" | grep -q "rank $rank (pid $pid) is stopped" || fail "the stopped rank is not named: $line"
detect=$(python3 -c "import json,sys; print(round(json.loads(sys.argv[1])['unix_s'] - float(sys.argv[2]), 2))" "$line" "$t0")
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 3 + 5 else 1)" "$detect" || fail "hang detected after $detect s (timeout 3 s)"
got=$(json "$TMP/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got after the hang, uninterrupted run $want"
pass "SIGSTOP of rank $rank: detected after $detect s (timeout 3 s), recovered, params_xxh3 $want"
