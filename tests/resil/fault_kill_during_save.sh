#!/usr/bin/env bash
# kill -9 of a rank while a checkpoint is being written: the half-written save
# never becomes LATEST, the supervisor relaunches from the previous checkpoint
# and the run ends with the uninterrupted run's params_xxh3. In-memory
# snapshots are off: this is the disk path (fault_snapshot.sh covers memory).
source "$KEEL_SRC/tests/lib.sh"
mpi_env
TINY=$KEEL_SRC/configs/tiny.json
args=(--set train.steps=6 --set checkpoint.every_steps=2 --set checkpoint.keep_last=0
      --set train.micro_batch_size=2 --set train.threads=1 --set resilience.backoff_s=0.1
      --set resilience.snapshot_every_steps=0 --nproc 2)
"$KEEL_BIN" train "$TINY" "${args[@]}" --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 || { cat "$TMP/ref.out"; fail "reference run"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")
for attempt in 1 2 3; do
  rm -rf "$TMP/run"
  "$KEEL_BIN" train "$TINY" "${args[@]}" --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 &
  sup=$!
  # the second save (step 4) is in flight once its .tmp appears: kill rank 1 then
  hit=0
  for _ in $(seq 1 12000); do
    if [ -d "$TMP/run/checkpoints/step_00000004.tmp" ]; then
      kill -9 "$(hb pid "$TMP/run" 1)" && hit=1
      break
    fi
    kill -0 "$sup" 2>/dev/null || break
    sleep 0.005
  done
  rc=0; wait "$sup" || rc=$?
  [ "$hit" = 1 ] && [ "$(event_count "$TMP/run" failure)" = 1 ] && break
  echo "attempt $attempt: the kill missed the save window; again"
done
[ "$(event_count "$TMP/run" failure)" = 1 ] || fail "could not kill a rank in the middle of a save"
[ "$rc" = 0 ] || { tail -20 "$TMP/run.out"; fail "keel train exit $rc, want 0"; }
grep -q '"event":"resumed","step":2,' "$TMP/run/events.jsonl" || fail "did not resume from the checkpoint at step 2: $(grep resumed "$TMP/run/events.jsonl")"
got=$(json "$TMP/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got, uninterrupted run $want"
pass "rank killed mid-save: resumed from step 2, completed with params_xxh3 $want"
