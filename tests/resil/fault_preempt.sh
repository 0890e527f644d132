#!/usr/bin/env bash
# Preemption: SIGTERM (then, after a resume, SIGUSR1) to the supervisor makes
# the ranks checkpoint at the next step boundary and keel train exit 75
# ("resume me"); running the same command again resumes, and the run ends
# with the uninterrupted run's params_xxh3.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=300 --set checkpoint.every_steps=100 --nproc 2)
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 || { cat "$TMP/ref.out"; fail "reference run"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")
last=x at=50
for sig in TERM USR1; do
  "$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 &
  sup=$!
  last=$(wait_train_step "$TMP/run" 0 "$at" "$last")
  kill -"$sig" "$sup"
  rc=0; wait "$sup" || rc=$?
  [ "$rc" = 75 ] || { tail "$TMP/run.out"; fail "SIG$sig: exit $rc, want 75"; }
  saved=$(json "$TMP/run/summary.json" "j['steps']")
  [ -d "$TMP/run/checkpoints/$(printf 'step_%08d' "$saved")" ] || fail "SIG$sig: no checkpoint at step $saved"
  [ "$(json "$TMP/run/summary.json" "j['status']")" = stopped ] || fail "SIG$sig: summary status"
  grep -q "run the same keel train command again to resume" "$TMP/run.out" || fail "SIG$sig: no resume hint"
  echo "SIG$sig at step >= $at: exit 75, checkpoint at step $saved"
  at=$(( saved + 50 ))
done
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 || { tail "$TMP/run.out"; fail "resume"; }
got=$(json "$TMP/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got after two preemptions, uninterrupted run $want"
pass "SIGTERM and SIGUSR1: exit 75 with a checkpoint each, resumed to params_xxh3 $want"
