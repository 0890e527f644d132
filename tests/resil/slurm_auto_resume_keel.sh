#!/usr/bin/env bash
# keel under srun --auto-resume (no supervisor of keel's: the plugin
# relaunches) on a real local Slurm cluster of 4 nodes (tests/slurm_cluster.sh;
# the job takes all 4, its step 2 of them, 2 spare). An sbatch script runs
#   srun -N2 -n2 --mpi=pmix --kill-on-bad-exit=1 --auto-resume=2 keel train ...
# one rank per task. Rank 1 is killed (kill -9) while its node's node-local
# directory has gone read-only there: the plugin's health check (keel health
# --epilog) drains that node with its reason, the step comes back on the
# others — rank 1's state from the replica its buddy kept on rank 0's node,
# the killed node's shared memory being gone with it — and the run ends with
# the params_xxh3 of an undisturbed run. keel train --nproc under --auto-resume is refused (two layers would
# relaunch). Every srun is time-bounded.
source "$KEEL_SRC/tests/lib.sh"
source "$KEEL_SRC/tests/slurm_cluster.sh"
mpi_env
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=120 --set checkpoint.every_steps=20)
"$KEEL_BIN" train "$CFG" "${args[@]}" --nproc 2 --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 ||
  { cat "$TMP/ref.out"; fail "reference run"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")

LOCAL=$TMP/node-local
slurm_auto_resume_plugin "$LOCAL"
slurm_cluster_start 4

cat >"$TMP/job.sh" <<EOF
#!/bin/sh
exec srun -N2 -n2 --mpi=pmix --kill-on-bad-exit=1 --auto-resume=2 "$KEEL_BIN" train "$CFG" ${args[*]} --run-dir "$TMP/run"
EOF
jobid=$(timeout 30 sbatch --parsable -N4 -o "$TMP/job.out" "$TMP/job.sh") || fail "sbatch"
pid=$(wait_train_step "$TMP/run" 1 30)
bad=$(hb node "$TMP/run" 1)
node_mount_ro "$bad" "$LOCAL"
# the node's memory is lost with it: its rank's snapshot segment and the replica of rank 0 it kept.
# Rank 1 is frozen first, so it writes neither after the removal, and the relaunch (seconds after
# the kill, sooner than a busy machine may run this loop) cannot find them.
kill -STOP "$pid"
for seg in $(segments "$TMP/run"); do
  case $seg in *-w2-r1|*-w2-b0) rm -f "$seg" ;; esac
done
kill -9 "$pid"
for _ in $(seq 1 900); do [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] && break; sleep 0.2; done
[ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] || { scancel "$jobid"; fail "job $jobid still running after 180 s: $(tail -5 "$TMP/job.out")"; }
[ "$(json "$TMP/run/summary.json" "j['status']")" = completed ] || fail "run not completed: $(tail -5 "$TMP/job.out")"
scontrol show node "$bad" | grep -q "Reason=keel: checkpoint_dir" ||
  fail "$bad not drained: $(scontrol show node "$bad" | grep -E 'State|Reason'); job: $(tail -5 "$TMP/job.out")"
grep -q "node $bad is drained: the next attempts exclude it" "$TMP/job.out" || fail "no exclusion: $(cat "$TMP/job.out")"
for r in 0 1; do
  [ "$(hb node "$TMP/run" $r)" != "$bad" ] || fail "rank $r of the relaunch ran on the drained $bad"
done
got=$(json "$TMP/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got, undisturbed run $want"
survivor_left "$TMP/run" "$TMP/job.out" "$bad"
resumed=$(grep '"event":"resumed"' "$TMP/run/events.jsonl" | tail -1 | sed 's/.*"detail":"\([^"]*\)".*/\1/')
[[ "$resumed" == *"from memory"*"1 of them from their buddies' replicas"* ]] ||
  fail "rank 1 did not come back from its buddy's replica: $resumed"
pass "rank 1 killed on $bad (its local directory read-only): drained, relaunched on $(hb node "$TMP/run" 0),$(hb node "$TMP/run" 1), resumed $resumed; params_xxh3 $want as undisturbed"
[ -z "$(segments "$TMP/run")" ] || fail "snapshot segments left after the run completed: $(segments "$TMP/run")"

# ---- the two layers do not nest ----
expect_input_error "--nproc under --auto-resume" "keel train --nproc under srun/sbatch --auto-resume" \
  env KEEL_AUTO_RESUME_ATTEMPT=1 "$KEEL_BIN" train "$CFG" --nproc 2 --run-dir "$TMP/nested"
expect_input_error "--nproc under sbatch --auto-resume" "keel's supervisor and the plugin would both relaunch" \
  env SLURM_SPANK__SLURM_SPANK_OPTION_keel_auto_resume_auto_resume=1 "$KEEL_BIN" train "$CFG" --nproc 2 \
  --run-dir "$TMP/nested"
