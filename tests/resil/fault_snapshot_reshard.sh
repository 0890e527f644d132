#!/usr/bin/env bash
# Resharding from memory: a job killed whole (kill -9 of the supervisor and
# every rank, as when an allocation ends) leaves its ranks' snapshot segments
# in /dev/shm, and `keel train` on the same run directory with another number
# of ranks resumes from them, not from the older checkpoint on disk:
#   1 rank -> 4 ranks hybrid_shard (groups of 2: the old shard split in two,
#   each half on two ranks) -> 2 ranks full_shard (each old shard served once
#   though two ranks held it). Disk checkpoints every 10 steps, kills near
#   steps 14 and 27: each relaunch resumes at most one step before the kill.
# The losses follow the undisturbed 2-rank run (other world sizes sum in
# another order), the last world's segments go once the new one has resumed,
# and none is left when the run completes (nor the OpenMPI backing directories
# of the killed supervisors: the next supervisor removes those).
source "$KEEL_SRC/tests/lib.sh"
mpi_env
trap 'kill_leftovers; rm -rf "$TMP"' EXIT
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=40 --set checkpoint.every_steps=10)
"$KEEL_BIN" train "$CFG" "${args[@]}" --nproc 2 --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 ||
  { cat "$TMP/ref.out"; fail "reference run"; }

# kill_job AT NPROC ARGS...: train on NPROC ranks until rank 0 has done AT
# steps, then kill -9 the supervisor and every rank; prints rank 0's step then
kill_job() {
  local at=$1 nproc=$2; shift 2
  "$KEEL_BIN" train "$CFG" "${args[@]}" "$@" --nproc "$nproc" --run-dir "$TMP/run" >>"$TMP/run.out" 2>&1 &
  local sup=$!
  echo "$sup" >>"$TMP/killed"
  wait_train_step "$TMP/run" 0 "$at" >/dev/null
  kill -9 "$sup"
  pkill -9 -f -- "$TMP/run" || true
  wait "$sup" 2>/dev/null || true
  for _ in $(seq 1 100); do pgrep -f -- "$TMP/run" >/dev/null || break; sleep 0.05; done
  hb step "$TMP/run" 0
}

# resumed_from_memory FROM_RANKS KILLED_AT: the newest resume resharded FROM_RANKS' snapshot
resumed_from_memory() {
  local line step
  line=$(grep '"event":"resumed"' "$TMP/run/events.jsonl" | tail -1)
  echo "$line" | grep -q "from memory.*resharded from $1 rank(s)" || fail "not resharded from memory: $line"
  step=$(echo "$line" | sed 's/.*"step":\([0-9]*\).*/\1/')
  [ "$step" -ge $(( $2 - 1 )) ] || fail "resumed at step $step, the job was killed after step $2"
  echo "$step"
}

k1=$(kill_job 14 1 --set train.grad_accum_steps=2)
[ -n "$(segments "$TMP/run")" ] || fail "no segment left by the killed job"
k2=$(kill_job 27 4 --set train.micro_batch_size=4 --set fsdp.strategy=hybrid_shard --set fsdp.shard_group_size=2)
s1=$(resumed_from_memory 1 "$k1")
pass "1 -> 4 ranks (hybrid_shard): killed after step $k1, resumed from memory at step $s1"
n=$(ls $(segments "$TMP/run") | grep -c -- '-w4-r' || true)
[ "$n" = 4 ] && ! ls $(segments "$TMP/run") | grep -q -- '-w1-' ||
  fail "segments after the 4-rank job: $(segments "$TMP/run")"
rc=0
"$KEEL_BIN" train "$CFG" "${args[@]}" --nproc 2 --run-dir "$TMP/run" >>"$TMP/run.out" 2>&1 || rc=$?
[ "$rc" = 0 ] || { tail -20 "$TMP/run.out"; fail "the 2-rank relaunch: exit $rc"; }
s2=$(resumed_from_memory 4 "$k2")
pass "4 -> 2 ranks (full_shard): killed after step $k2, resumed from memory at step $s2"
[ -z "$(segments "$TMP/run")" ] || fail "segments left after the run completed: $(segments "$TMP/run")"
for pid in $(cat "$TMP/killed"); do
  [ ! -e "/dev/shm/keel-mpi-$pid" ] || fail "the killed supervisor's OpenMPI directory /dev/shm/keel-mpi-$pid is left"
done
pass "no segment, and no killed supervisor's OpenMPI directory, left"
python3 - "$TMP/ref/metrics.jsonl" "$TMP/run/metrics.jsonl" <<'PY' || fail "losses differ from the undisturbed run"
import json, sys
def losses(p):
    out = {}
    for line in open(p):
        o = json.loads(line)
        if "loss" in o: out[o["step"]] = o["loss"]  # a step done twice: its last loss
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
assert sorted(a) == sorted(b) and worst <= 1e-4, (worst, sorted(set(a) ^ set(b)))
print(f"ok   every step's loss within {worst:.1e} of the undisturbed 2-rank run")
PY
