#!/usr/bin/env bash
# keel on a real multi-host Slurm cluster from `keel cluster up` (4 workers,
# each its own host: address, hostname, /tmp, /dev/shm; tests/cluster_fixture.sh):
#  - `keel train --nproc 2` under `sbatch -N3` with one spare: ranks on two
#    hosts, MPI over the bridge, the params_xxh3 of a run on this machine;
#  - an sbatch script whose srun has --auto-resume=2 trains on 2 nodes; rank 1
#    is killed (kill -9) while its node's health check genuinely fails (its
#    node-local directory read-only on that host alone): the node is drained
#    with its reason, the step comes back on a spare, rank 1's state from the
#    replica its buddy kept on another host (the killed host's /dev/shm is
#    its own), and the run ends with the undisturbed run's params_xxh3;
#  - --auto-resume=abc and =-1 are refused at submission; a command that is
#    not keel and always fails is run 1 + N times and exits with its own code.
# Every srun and sbatch is time-bounded. Jobs run the cluster's copy of keel
# ($KEEL_CLUSTER_KEEL) on a config in SharedDir: this build and the source
# tree may be under /tmp, which no node shares.
source "$KEEL_SRC/tests/lib.sh"
source "$KEEL_SRC/tests/cluster_fixture.sh"
K=$KEEL_BIN
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=120 --set checkpoint.every_steps=20)
(mpi_env; "$K" train "$CFG" "${args[@]}" --nproc 2 --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1) ||
  { cat "$TMP/ref.out"; fail "reference run"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")

mkdir -p "$TMP/lc"
printf 'mkdir -p /tmp/keel-local\n' >"$TMP/lc/on_create.sh"
cluster_spec kc-slurm 4 '"HealthCheck": {"checks": ["checkpoint_dir"], "dir": "/tmp/keel-local"}, "HealthTimeoutS": 60' "$TMP/lc"
S=$TMP/kc-slurm.json
"$K" cluster up "$S" 2>"$TMP/up.err" || fail "up: $(cat "$TMP/up.err")"
eval "$("$K" cluster env "$S")"
SH=$KEEL_CLUSTER_SHARED
# what the jobs read must be where every node sees it: the cluster's keel, the config in SharedDir
KC=$KEEL_CLUSTER_KEEL
cp "$CFG" "$SH/micro.json"
CFG=$SH/micro.json
# wait_job ID LIMIT_S: until the job has left the queue
wait_job() {
  for _ in $(seq 1 $(( $2 * 5 ))); do [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && return 0; sleep 0.2; done
  scancel "$1"
  fail "job $1 still running after $2 s"
}

# ---- keel's supervisor under sbatch -N3, one spare ----
printf '#!/bin/sh\nexec "%s" train "%s" %s --set resilience.spares=1 --nproc 2 --run-dir "%s/sup"\n' \
  "$KC" "$CFG" "${args[*]}" "$SH" >"$SH/sup.sh"
jobid=$(timeout 30 sbatch --parsable -N3 --chdir="$SH" -o "$SH/sup.out" "$SH/sup.sh") || fail "sbatch -N3"
wait_job "$jobid" 300
[ "$(json "$SH/sup/summary.json" "j['status']")" = completed ] || fail "sbatch -N3 run: $(tail -5 "$SH/sup.out")"
n0=$(hb node "$SH/sup" 0) n1=$(hb node "$SH/sup" 1)
[ "$n0" != "$n1" ] && [[ "$n0$n1" =~ ^w[1-4]w[1-4]$ ]] || fail "ranks on '$n0' and '$n1', want two worker hosts"
got=$(json "$SH/sup/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "sbatch -N3 params_xxh3 $got, the run on this machine $want"
pass "keel train --nproc 2 under sbatch -N3 (1 spare): ranks on $n0 and $n1, params_xxh3 $want as on one machine"

# ---- srun --auto-resume=2: a rank killed on a host whose health check fails ----
printf '#!/bin/sh\nexec srun -N2 -n2 --mpi=pmix --kill-on-bad-exit=1 --auto-resume=2 "%s" train "%s" %s --run-dir "%s/run"\n' \
  "$KC" "$CFG" "${args[*]}" "$SH" >"$SH/job.sh"
jobid=$(timeout 30 sbatch --parsable -N4 --chdir="$SH" -o "$SH/job.out" "$SH/job.sh") || fail "sbatch -N4"
pid=$(wait_train_step "$SH/run" 1 30)
bad=$(hb node "$SH/run" 1)
"$K" cluster exec "$S" "$bad" -- sh -c 'mount --bind /tmp/keel-local /tmp/keel-local && mount -o remount,bind,ro /tmp/keel-local' ||
  fail "cannot make /tmp/keel-local read-only on $bad"
! "$K" cluster exec "$S" "$bad" -- touch /tmp/keel-local/x 2>/dev/null || fail "/tmp/keel-local still writable on $bad"
for n in w1 w2 w3 w4; do
  [ "$n" = "$bad" ] || "$K" cluster exec "$S" "$n" -- touch /tmp/keel-local/x || fail "$n's /tmp/keel-local went read-only too"
done
kill -9 "$pid"
wait_job "$jobid" 180
[ "$(json "$SH/run/summary.json" "j['status']")" = completed ] || fail "run not completed: $(tail -5 "$SH/job.out")"
scontrol show node "$bad" | grep -q "Reason=keel: checkpoint_dir" ||
  fail "$bad not drained: $(scontrol show node "$bad" | grep -E 'State|Reason'); job: $(tail -5 "$SH/job.out")"
"$K" cluster status "$S" | grep "^$bad " | grep -q "keel: checkpoint_dir" || fail "status lacks $bad's reason: $("$K" cluster status "$S")"
for r in 0 1; do
  [ "$(hb node "$SH/run" $r)" != "$bad" ] || fail "rank $r of the relaunch ran on the drained $bad"
done
got=$(json "$SH/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got, undisturbed run $want"
survivor_left "$SH/run" "$SH/job.out" "$bad"
resumed=$(grep '"event":"resumed"' "$SH/run/events.jsonl" | tail -1 | sed 's/.*"detail":"\([^"]*\)".*/\1/')
[[ "$resumed" == *"from memory"*"1 of them from their buddies' replicas"* ]] ||
  fail "rank 1 did not come back from its buddy's replica on another host: $resumed"
pass "rank 1 killed on $bad (its /tmp/keel-local read-only there): drained, relaunched on $(hb node "$SH/run" 0),$(hb node "$SH/run" 1), resumed $resumed; params_xxh3 as undisturbed"

# ---- refused at submission; any command relaunched, its own exit code at the end ----
for bad_value in abc -1; do
  rc=0
  timeout 30 sbatch --parsable --auto-resume=$bad_value -N1 --wrap true >"$TMP/out" 2>"$TMP/err" || rc=$?
  [ "$rc" != 0 ] && grep -q "auto-resume" "$TMP/err" || fail "--auto-resume=$bad_value accepted (exit $rc): $(cat "$TMP/err")"
done
[ -z "$(squeue -h)" ] || fail "a refused submission left a job: $(squeue)"
rc=0
timeout 120 srun -N1 --auto-resume=2 bash -c "echo \$KEEL_AUTO_RESUME_ATTEMPT >>'$SH/attempts'; exit 3" \
  >"$TMP/out" 2>&1 || rc=$?
[ "$rc" = 3 ] && [ "$(tr '\n' ' ' <"$SH/attempts")" = "1 2 3 " ] ||
  fail "a failing command: exit $rc, attempts '$(cat "$SH/attempts" 2>/dev/null)' (want 3, '1 2 3 '): $(cat "$TMP/out")"
pass "--auto-resume=abc and =-1 refused at submission; bash -c 'exit 3' ran 3 times, exit 3"
"$K" cluster down "$S" 2>/dev/null || fail "down"
[ -z "$(cluster_left kc-slurm)" ] || fail "down left: $(cluster_left kc-slurm)"
pass "down: nothing of the cluster left"
