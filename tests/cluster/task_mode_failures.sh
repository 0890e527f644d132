#!/usr/bin/env bash
# srun --auto-resume survives the death of any rank, on a real multi-host
# Slurm cluster from `keel cluster up` (each node its own host): two ranks a
# node on two nodes, no keel supervisor — the ranks watch each other (train/peers.c) and
# the plugin runs the child srun with --kill-on-bad-exit=1. In one job, in
# turn: kill -9 of rank 0, kill -9 of rank 1, SIGSTOP of rank 3, and every
# keel process of rank 2's node killed at once (ranks 2 and 3). Each time the attempt ends within the
# hang bound (max(3 x the median step, 5 s), plus Slurm's relaunch), a
# `peer_lost` event names the rank and its node, the next attempt goes on
# from memory or disk, and the run ends with the params_xxh3 of an
# undisturbed run. Then an MPI setting that cannot connect the hosts
# (OMPI_MCA_btl_tcp_if_include=lo) ends the step at the start-up deadline
# with one line naming what the rank waited for and the setting, and a run
# directory under each node's own /tmp is refused in one line (exit 2).
source "$KEEL_SRC/tests/lib.sh"
source "$KEEL_SRC/tests/cluster_fixture.sh"
K=$KEEL_BIN
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=200 --set checkpoint.every_steps=25 --set train.threads=1)
(mpi_env; "$K" train "$CFG" "${args[@]}" --nproc 4 --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1) ||
  { cat "$TMP/ref.out"; fail "reference run"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")

cluster_spec kc-task 3
S=$TMP/kc-task.json
"$K" cluster up "$S" 2>"$TMP/up.err" || fail "up: $(cat "$TMP/up.err")"
eval "$("$K" cluster env "$S")"
SH=$KEEL_CLUSTER_SHARED KC=$KEEL_CLUSTER_KEEL
cp "$CFG" "$SH/micro.json"
run=$SH/run
printf '#!/bin/sh\nexec srun -N2 -n4 --ntasks-per-node=2 --mpi=pmix --auto-resume=6 "%s" train "%s" %s --run-dir "%s"\n' \
  "$KC" "$SH/micro.json" "${args[*]}" "$run" >"$SH/job.sh"
jobid=$(timeout 30 sbatch --parsable -N2 --ntasks-per-node=2 --chdir="$SH" -o "$SH/job.out" "$SH/job.sh") || fail "sbatch"
WAIT_STEP_S=300
# a failure before the first disruption says what the job printed
trap 'rc=$?; [ "$rc" = 0 ] || { echo "--- job output:" >&2; grep -v "^step" "$SH/job.out" 2>/dev/null | tail -15 >&2; }
      cluster_down; kill_leftovers; rm -rf "$TMP"' EXIT

# disrupt NAME RANK AT ACTION: at step AT of a new attempt, ACTION (kill, stop, node) on RANK; then
# the attempt must end in time and a peer_lost event name the rank
attempt_of() { hb slurm_step "$run" "$1"; }
prev_step=none
disrupt() {
  local name=$1 rank=$2 at=$3 action=$4 pid node t0 t1 median bound lost ranks
  for _ in $(seq 1 3000); do # a new attempt (another Slurm step) trains past AT
    [ "$(attempt_of "$rank")" != "$prev_step" ] && [ -n "$(attempt_of "$rank")" ] && break
    sleep 0.1
  done
  pid=$(wait_train_step "$run" "$rank" "$at")
  prev_step=$(attempt_of "$rank") node=$(hb node "$run" "$rank") ranks=$rank
  if [ "$action" = node ]; then ranks=$(for r in 0 1 2 3; do [ "$(hb node "$run" $r)" = "$node" ] && echo $r; done | tr '\n' ' '); fi
  median=$(python3 - "$run" <<'PY'
import json, sys, statistics
s = [json.loads(l)["step_s"] for l in open(sys.argv[1] + "/metrics.jsonl")][-20:]
print(statistics.median(s))
PY
)
  bound=$(python3 -c "print(max(3 * $median, 5.0))")
  local before; before=$(event_count "$run" peer_lost 2>/dev/null); before=${before:-0}
  t0=$(date +%s.%N)
  case $action in
    kill) "$K" cluster exec "$S" "$node" -- kill -9 "$pid" ;;
    stop) "$K" cluster exec "$S" "$node" -- kill -STOP "$pid" ;;
    node) # every rank on the node, at once
      local r pids=()
      for r in 0 1 2 3; do [ "$(hb node "$run" $r)" = "$node" ] && pids+=("$(hb pid "$run" $r)"); done
      [ "${#pids[@]}" = 2 ] || fail "$name: ${#pids[@]} rank(s) on $node, want 2"
      "$K" cluster exec "$S" "$node" -- kill -9 "${pids[@]}" ;;
  esac
  for _ in $(seq 1 1200); do # the next attempt's ranks start: the old step has ended
    [ "$(attempt_of 0)" != "$prev_step" ] && [ "$(attempt_of 3)" != "$prev_step" ] && break
    sleep 0.1
  done
  t1=$(date +%s.%N)
  python3 -c "import sys; sys.exit(0 if $t1 - $t0 <= $bound + 20 else 1)" ||
    fail "$name: the attempt took $(python3 -c "print(round($t1 - $t0, 1))") s to end, bound $bound s (+20 s for Slurm's relaunch)"
  [ "$(event_count "$run" peer_lost)" -gt "$before" ] 2>/dev/null ||
    fail "$name: no peer_lost event: $(tail -3 "$run/events.jsonl"); the job said: $(grep -v '^step' "$SH/job.out" | grep -v 'healthy\|^node \|  [a-z_]*  pass' | tail -25)"
  lost=$(grep '"event":"peer_lost"' "$run/events.jsonl" | tail -1)
  python3 - "$lost" "$ranks" "$node" <<'PY' || fail "$name: peer_lost names another rank or node: $lost"
import json, sys
e = json.loads(sys.argv[1])
lost = [int(r) for r in sys.argv[2].split()]
assert e["rank"] in lost and e["node"] == sys.argv[3] and e["cause"] in ("crash", "hang"), e
PY
  pass "$name (rank $rank on $node at step >= $at): the attempt ended in $(python3 -c "print(round($t1 - $t0, 1))") s (bound $bound s): $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["detail"])' "$lost")"
}
disrupt "kill -9 of rank 0" 0 30 kill
disrupt "kill -9 of rank 1" 1 70 kill
disrupt "SIGSTOP of rank 3" 3 110 stop
disrupt "every rank on rank 2's node killed" 2 150 node
for _ in $(seq 1 1500); do [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] && break; sleep 0.2; done
[ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] || { scancel "$jobid"; fail "job still running: $(tail -5 "$SH/job.out")"; }
[ "$(json "$run/summary.json" "j['status']")" = completed ] || fail "run not completed: $(tail -5 "$SH/job.out")"
got=$(json "$run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got after four failures, undisturbed run $want"
grep -q "kill-on-bad-exit" "$SH/job.out" && fail "the plugin's --kill-on-bad-exit was refused: $(cat "$SH/job.out")"
pass "four failures, each a relaunch; params_xxh3 $want as undisturbed"

# ---- start-up that cannot connect the hosts: one line at the deadline ----
printf '#!/bin/sh\nexport OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo\nexec srun -N2 -n2 --mpi=pmix "%s" train "%s" --set resilience.startup_timeout_s=15 --run-dir "%s/lo"\n' \
  "$KC" "$SH/micro.json" "$SH" >"$SH/lo.sh"
t0=$(date +%s)
jobid=$(timeout 30 sbatch --parsable -N2 --chdir="$SH" -o "$SH/lo.out" "$SH/lo.sh") || fail "sbatch lo"
for _ in $(seq 1 600); do [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] && break; sleep 0.2; done
[ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] || { scancel "$jobid"; fail "lo: still running after 120 s: $(tail -5 "$SH/lo.out")"; }
took=$(( $(date +%s) - t0 ))
grep -q "start-up did not finish in 15 s (resilience.startup_timeout_s): still waiting for .*OMPI_MCA_btl_tcp_if_include=lo" "$SH/lo.out" ||
  fail "lo: no start-up line: $(grep -v '^step' "$SH/lo.out" | tail -8)"
[ "$took" -le 60 ] || fail "lo: the job took $took s, the deadline is 15 s"
pass "an MPI setting that cannot connect the hosts: $(grep -m1 'start-up did not finish' "$SH/lo.out" | cut -c1-160)... in $took s"
# ---- a run directory the nodes do not share: said at start, in one line ----
printf '#!/bin/sh\nexec srun -N2 -n2 --mpi=pmix "%s" train "%s" --run-dir /tmp/not-shared/run\n' "$KC" "$SH/micro.json" >"$SH/ns.sh"
jobid=$(timeout 30 sbatch --parsable -N2 --chdir="$SH" -o "$SH/ns.out" "$SH/ns.sh") || fail "sbatch not-shared"
for _ in $(seq 1 600); do [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] && break; sleep 0.2; done
[ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] || { scancel "$jobid"; fail "not-shared: still running: $(tail -5 "$SH/ns.out")"; }
grep -q "/tmp/not-shared/run/config.json: not there on node w[0-9], where rank 0 wrote it: a Slurm step's ranks need a run directory every node shares" "$SH/ns.out" ||
  fail "not-shared: no line saying so: $(grep -v '^step' "$SH/ns.out" | tail -5)"
grep -q "exit code 2" "$SH/ns.out" || fail "not-shared: want exit 2: $(grep -v '^step' "$SH/ns.out" | tail -5)"
pass "a run directory under each node's own /tmp: $(grep -m1 'not there on node' "$SH/ns.out" | cut -c1-140)..."
"$K" cluster down "$S" 2>/dev/null || fail "down"
[ -z "$(cluster_left kc-task)" ] || fail "down left: $(cluster_left kc-task)"
