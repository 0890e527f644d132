#!/usr/bin/env bash
# kill -9 of a random rank at a random step, three times in one run: the
# supervisor relaunches from the last checkpoint each time and the run ends
# with the uninterrupted run's params_xxh3; summary.json and events.jsonl
# account for every failure (restarts, lost steps, recovery time, goodput).
# In-memory snapshots are off: this is the disk path (fault_snapshot.sh
# covers memory).
source "$KEEL_SRC/tests/lib.sh"
mpi_env
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=300 --set checkpoint.every_steps=10 --set resilience.backoff_s=0.1
      --set resilience.snapshot_every_steps=0 --nproc 2)
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 || { cat "$TMP/ref.out"; fail "reference run"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")

"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 &
sup=$!
last=x
for k in 1 2 3; do
  step=$(( 40 + 80 * (k - 1) + RANDOM % 40 )) rank=$(( RANDOM % 2 ))
  pid=$(wait_train_step "$TMP/run" "$rank" "$step" "$last")
  kill -9 "$pid"
  echo "kill $k: rank $rank (pid $pid) at step $(hb step "$TMP/run" "$rank")"
  last=$pid
  # the next kill is in the next launch: wait for this one to be noticed
  for _ in $(seq 1 400); do [ "$(event_count "$TMP/run" failure)" -ge "$k" ] && break; sleep 0.05; done
done
rc=0; wait "$sup" || rc=$?
[ "$rc" = 0 ] || { tail -20 "$TMP/run.out"; fail "keel train exit $rc after three kills, want 0"; }
got=$(json "$TMP/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got after three kills, uninterrupted run $want"
[ "$(json "$TMP/run/summary.json" "j['restarts']")" = 3 ] || fail "summary restarts $(json "$TMP/run/summary.json" "j['restarts']"), want 3"
[ "$(event_count "$TMP/run" failure)" = 3 ] || fail "$(event_count "$TMP/run" failure) failure events, want 3"
[ "$(event_count "$TMP/run" recovered)" = 3 ] || fail "$(event_count "$TMP/run" recovered) recovered events, want 3"
grep -q '"event":"failure".*crash: rank [01] (pid [0-9]*) died' "$TMP/run/events.jsonl" || fail "failure events do not name the rank"
python3 - "$TMP/run/summary.json" <<'PY' || fail "summary.json accounting"
import json, sys
s = json.load(open(sys.argv[1]))
rec = s["recovery_s"]
assert len(rec["each"]) == 3 and 0 < rec["median"] <= rec["max"] < 60, rec
# every kill loses at most one checkpoint interval (10 steps) of work
assert 0 < s["lost_steps"] <= 30, s["lost_steps"]
assert 0 < s["goodput"] < 1, s["goodput"]
print(f"ok   summary: restarts 3, lost_steps {s['lost_steps']}, recovery median {rec['median']:.2f} s "
      f"max {rec['max']:.2f} s, goodput {s['goodput']:.2f}")
PY
pass "three kill -9s: completed with the uninterrupted params_xxh3 $want"
