#!/usr/bin/env bash
# Preemption: SIGTERM (then, after a resume, SIGUSR1) to the supervisor makes
# the ranks checkpoint at the next step boundary and keel train exit 75
# ("resume me"); running the same command again resumes, and the run ends
# with the uninterrupted run's params_xxh3. Every stop ends with one true line
# as the last thing printed (what was saved, at which step) and no launcher
# banner; a stop with nothing to resume from exits 1, never 75, and says so —
# under the supervisor and as one process.
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
  want_last="keel: info: stopped on a signal after step $saved; state saved at step $saved: run the same keel train command again to resume"
  [ "$(tail -n 1 "$TMP/run.out")" = "$want_last" ] || fail "SIG$sig: the last line is '$(tail -n 1 "$TMP/run.out")', want '$want_last'"
  ! grep -Eq "Primary job|mpirun (detected|noticed)" "$TMP/run.out" || fail "SIG$sig: mpirun's banner for a stop keel asked for: $(cat "$TMP/run.out")"
  echo "SIG$sig at step >= $at: exit 75, checkpoint at step $saved"
  at=$(( saved + 50 ))
done
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 || { tail "$TMP/run.out"; fail "resume"; }
got=$(json "$TMP/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got after two preemptions, uninterrupted run $want"
pass "SIGTERM and SIGUSR1: exit 75 with a checkpoint each, resumed to params_xxh3 $want"

# stop_without_state NAME ARGS...: SIGTERM at step 20 of a run without checkpointing: exit 1, one true last line
stop_without_state() {
  local name=$1 run=$TMP/$1 pid rc=0 last steps
  shift
  "$KEEL_BIN" train "$CFG" --set train.steps=100000 "$@" --run-dir "$run" >"$TMP/$name.out" 2>&1 &
  pid=$!
  wait_train_step "$run" 0 20 >/dev/null
  kill -TERM "$pid"
  wait "$pid" || rc=$?
  [ "$rc" = 1 ] || { tail "$TMP/$name.out"; fail "$name: exit $rc, want 1 (nothing to resume from)"; }
  steps=$(json "$run/summary.json" "j['steps']")
  last=$(tail -n 1 "$TMP/$name.out")
  [[ "$last" == *"stopped on a signal after step $steps; nothing was saved to resume from (checkpointing is off: set checkpoint.every_steps to make a stop resumable)" ]] ||
    fail "$name: the last line is '$last'"
  ! grep -Eq "Primary job|mpirun (detected|noticed)|state saved" "$TMP/$name.out" || fail "$name: $(cat "$TMP/$name.out")"
  [ ! -d "$run/checkpoints" ] || [ -z "$(ls "$run/checkpoints")" ] || fail "$name: a checkpoint appeared"
  pass "$name: stopped after step $steps without checkpointing: exit 1, '$last'"
}
stop_without_state supervised --nproc 2
stop_without_state one_process
