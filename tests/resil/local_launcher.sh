#!/usr/bin/env bash
# keel train --nproc N --launcher local: keel's own launcher starts the ranks
# on this machine (no mpirun) and they talk over Gloo. The same runs under
# mpirun and under it end with the same params_xxh3: full_shard on 2 and 3
# ranks, hybrid_shard on 4 (shard groups of 2, a bf16 all-reduce across
# them: groups split over Gloo). A rank killed mid-run is named, the
# supervisor restarts the ranks from the in-memory snapshot, and the run ends
# bit-identical to the undisturbed one. Bad --launcher values and a bad
# `keel launch` are one line, exit 2.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
cleanup() { kill_leftovers; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
CFG=$KEEL_SRC/tests/train/micro.json

# same NAME ARGS...: the run under mpirun and under --launcher local, compared
same() {
  local name=$1
  shift
  "$KEEL_BIN" train "$CFG" "$@" --run-dir "$TMP/$name-mpi" >"$TMP/$name-mpi.out" 2>&1 ||
    { tail -5 "$TMP/$name-mpi.out"; fail "$name under mpirun"; }
  "$KEEL_BIN" train "$CFG" "$@" --launcher local --run-dir "$TMP/$name-local" >"$TMP/$name-local.out" 2>&1 ||
    { tail -5 "$TMP/$name-local.out"; fail "$name under --launcher local"; }
  local want got
  want=$(json "$TMP/$name-mpi/summary.json" "j['params_xxh3']")
  got=$(json "$TMP/$name-local/summary.json" "j['params_xxh3']")
  [ "$got" = "$want" ] || fail "$name: params_xxh3 $got under --launcher local, $want under mpirun"
  ! grep -q mpirun "$TMP/$name-local/logs/launcher.log" || fail "$name: mpirun ran under --launcher local"
  pgrep -f "$TMP/$name-local" >/dev/null && fail "$name: processes left behind"
  pass "$name: --launcher local ends with mpirun's params_xxh3 $want"
}
same full_shard-2 --nproc 2 --set train.steps=30
same full_shard-3 --nproc 3 --set train.steps=20
same hybrid-4 --nproc 4 --set train.steps=12 --set fsdp.strategy=hybrid_shard --set fsdp.shard_group_size=2 \
  --set fsdp.reduce_dtype=bf16

# a rank killed mid-run: restarted from memory, bit-identical to the undisturbed run
args=(--nproc 2 --launcher local --set train.steps=200 --set resilience.backoff_s=0.1)
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 || { tail -5 "$TMP/ref.out"; fail "reference run"; }
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 &
sup=$!
pid=$(wait_train_step "$TMP/run" 1 60)
kill -9 "$pid"
rc=0
wait "$sup" || rc=$?
[ "$rc" = 0 ] || { tail -20 "$TMP/run.out"; fail "keel train exit $rc after a kill, want 0"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")
got=$(json "$TMP/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got after the kill, undisturbed $want"
grep -q '"event":"failure","step":[0-9]*,"cause":"crash","rank":1,' "$TMP/run/events.jsonl" ||
  fail "the failure does not name rank 1: $(grep failure "$TMP/run/events.jsonl")"
grep -q '"event":"resumed".*from memory' "$TMP/run/events.jsonl" ||
  fail "not resumed from memory: $(grep resumed "$TMP/run/events.jsonl")"
grep -q '"event":"health".*ranks 2: mpi pass (over gloo): 2 rank(s): all-reduce of 16 MB exact' "$TMP/run/events.jsonl" ||
  fail "the relaunch's all-reduce check does not say it ran over Gloo: $(grep health "$TMP/run/events.jsonl")"
pass "rank 1 killed after step 60: named in the failure event (not rank 0, which lost it), resumed from memory;" \
  "params_xxh3 $got as undisturbed"

# bad input
expect_input_error "an unknown launcher" '^keel: error: --launcher srun: use mpi' \
  "$KEEL_BIN" train "$CFG" --nproc 2 --launcher srun --run-dir "$TMP/bad"
expect_input_error "--launcher without --nproc" '^keel: error: --launcher local starts ranks: give --nproc N too' \
  "$KEEL_BIN" train "$CFG" --launcher local --run-dir "$TMP/bad"
expect_input_error "keel launch without --" '^keel: error: usage: keel launch -n N -- PROGRAM' \
  "$KEEL_BIN" launch -n 2 true
expect_input_error "keel launch -n 0" '^keel: error: -n' "$KEEL_BIN" launch -n 0 -- true
[ ! -e "$TMP/bad" ] || fail "a refused run created its run directory"
# keel launch on its own: every rank's exit code, the first failure's passed on
rc=0
"$KEEL_BIN" launch -n 3 -- sh -c 'exit $((KEEL_RANK == 1 ? 5 : 0))' 2>"$TMP/launch.err" || rc=$?
[ "$rc" = 5 ] && grep -q "^keel: launch: process rank 1 with PID [0-9]* exited with code 5" "$TMP/launch.err" ||
  fail "keel launch: exit $rc, $(cat "$TMP/launch.err")"
pass "keel launch -n 3 with rank 1 failing: exit 5, $(cat "$TMP/launch.err")"
