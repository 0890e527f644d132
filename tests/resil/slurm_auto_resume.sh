#!/usr/bin/env bash
# srun --auto-resume[=N] (plugins/slurm, the keel_auto_resume SPANK plugin) on
# a real local Slurm cluster (tests/slurm_cluster.sh, 2 nodes, the plugin in
# plugstack.conf): bad values are refused at submission by srun and sbatch —
# no job left pending, no node drained; a failing step of any command is run
# again up to N times, each attempt numbered in its environment, and srun
# exits with the last attempt's code; a step that succeeds is not run again;
# inside an allocation the attempts are steps of the one job; sbatch
# --auto-resume=N gives every srun of its script the option. Every srun here
# is time-bounded.
source "$KEEL_SRC/tests/lib.sh"
source "$KEEL_SRC/tests/slurm_cluster.sh"
# after a failure the plugin runs `keel health --epilog` on each node of the
# step (a node config: the checkpoint_dir check of a node-local directory)
LOCAL=$TMP/node-local
slurm_auto_resume_plugin "$LOCAL"
slurm_cluster_start 3

srun --help 2>&1 | grep -q -- "--auto-resume=N  *relaunch the step when it fails" || fail "srun --help does not list --auto-resume: $(srun --help 2>&1 | tail -5)"

# ---- refused at submission ----
nothing_left() { # no job in the queue, both nodes idle
  [ -z "$(squeue -h 2>&1)" ] && [ "$(sinfo -h -N -o '%t' | sort -u)" = idle ] ||
    fail "$1 left something behind: queue '$(squeue -h 2>&1)', nodes $(sinfo -h -N -o '%N %t' | tr '\n' ' ')"
}
for bad in abc -1 1x 101 ""; do
  rc=0
  timeout 30 srun --auto-resume="$bad" -N1 true >"$TMP/out" 2>"$TMP/err" || rc=$?
  [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "srun --auto-resume=$bad: exit $rc"
  grep -q -- "--auto-resume=$bad: expected how many times to relaunch a failed step, a whole number from 0 to 100" "$TMP/err" ||
    fail "srun --auto-resume=$bad: $(cat "$TMP/err")"
  nothing_left "srun --auto-resume=$bad"
  rc=0
  timeout 30 sbatch --auto-resume="$bad" -N1 --wrap true >"$TMP/out" 2>"$TMP/err" || rc=$?
  [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q -- "--auto-resume=$bad: expected" "$TMP/err" ||
    fail "sbatch --auto-resume=$bad: exit $rc, $(cat "$TMP/err")"
  nothing_left "sbatch --auto-resume=$bad"
done
pass "srun and sbatch refuse --auto-resume=abc, -1, 1x, 101 and '' at submission: $(grep -m1 auto-resume "$TMP/err")"

# ---- any command: relaunched up to N times ----
rc=0
timeout 120 srun --auto-resume=2 -N1 bash -c "echo \$KEEL_AUTO_RESUME_ATTEMPT >>'$TMP/attempts'; exit 3" \
  >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 3 ] || fail "a step that always fails: exit $rc, want 3 ($(cat "$TMP/err"))"
[ "$(tr '\n' ' ' <"$TMP/attempts")" = "1 2 3 " ] || fail "attempts: $(cat "$TMP/attempts")"
grep -q "the step failed 3 time(s); giving up with exit 3" "$TMP/err" || fail "no give-up line: $(cat "$TMP/err")"
pass "a step that always fails (exit 3): run 3 times with --auto-resume=2, attempts 1 2 3, exit 3"

rm -f "$TMP/attempts"
timeout 120 srun --auto-resume -N1 bash -c "echo \$KEEL_AUTO_RESUME_ATTEMPT >>'$TMP/attempts'; [ \$KEEL_AUTO_RESUME_ATTEMPT -ge 2 ] || exit 5" \
  >"$TMP/out" 2>"$TMP/err" || fail "a step that fails once, --auto-resume (1): $(cat "$TMP/err")"
[ "$(tr '\n' ' ' <"$TMP/attempts")" = "1 2 " ] || fail "attempts: $(cat "$TMP/attempts")"
rm -f "$TMP/attempts"
timeout 60 srun --auto-resume=3 -N1 bash -c "echo \$KEEL_AUTO_RESUME_ATTEMPT >>'$TMP/attempts'" ||
  fail "a step that succeeds"
[ "$(cat "$TMP/attempts")" = 1 ] || fail "a step that succeeded was run again: $(cat "$TMP/attempts")"
rm -f "$TMP/attempts"
rc=0
timeout 60 srun --auto-resume=0 -N1 bash -c "echo x >>'$TMP/attempts'; exit 4" 2>/dev/null || rc=$?
[ "$rc" = 4 ] && [ "$(wc -l <"$TMP/attempts")" = 1 ] || fail "--auto-resume=0: exit $rc, $(wc -l <"$TMP/attempts") attempt(s)"
pass "a step that fails once comes back (bare --auto-resume: 1 relaunch); success and --auto-resume=0 run once"

# ---- a stop asked for (SIGTERM, as scancel sends) is not a failure: no relaunch ----
rm -f "$TMP/attempts"
timeout 60 srun --auto-resume=3 -N1 bash -c "echo \$KEEL_AUTO_RESUME_ATTEMPT >>'$TMP/attempts'; sleep 30" \
  >"$TMP/out" 2>"$TMP/err" &
mon=$!
for _ in $(seq 1 100); do [ -s "$TMP/attempts" ] && break; sleep 0.1; done
sleep 0.5
kill -TERM "$mon"
wait "$mon" || true
[ "$(cat "$TMP/attempts")" = 1 ] && grep -q "stopped by a signal; no relaunch" "$TMP/err" ||
  fail "SIGTERM: attempts $(cat "$TMP/attempts" | tr '\n' ' '), $(cat "$TMP/err")"
pass "SIGTERM to srun --auto-resume=3 ends the step without a relaunch"

# ---- inside an allocation: each attempt a step of the job ----
rm -f "$TMP/attempts"
rc=0
timeout 120 salloc -N1 srun --auto-resume=1 bash -c "echo \$SLURM_JOB_ID.\$SLURM_STEP_ID >>'$TMP/attempts'; exit 7" \
  >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 7 ] || fail "inside salloc: exit $rc ($(cat "$TMP/err"))"
mapfile -t steps <"$TMP/attempts"
[ "${#steps[@]}" = 2 ] && [ "${steps[0]%.*}" = "${steps[1]%.*}" ] && [ "${steps[0]}" != "${steps[1]}" ] ||
  fail "inside salloc the attempts were not two steps of one job: ${steps[*]}"
pass "inside an allocation: attempts are steps ${steps[*]} of one job, exit 7"

# ---- sbatch --auto-resume=N: every srun of the batch script relaunches ----
rm -f "$TMP/attempts"
jobid=$(timeout 30 sbatch --parsable --auto-resume=1 -N1 -o "$TMP/job.out" \
  --wrap "srun bash -c 'echo \$KEEL_AUTO_RESUME_ATTEMPT >>$TMP/attempts; exit 3'") || fail "sbatch --auto-resume=1"
for _ in $(seq 1 300); do [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] && break; sleep 0.2; done
[ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] || fail "batch job $jobid still queued or running"
[ "$(tr '\n' ' ' <"$TMP/attempts")" = "1 2 " ] || fail "sbatch --auto-resume=1: attempts $(cat "$TMP/attempts"); $(cat "$TMP/job.out")"
pass "sbatch --auto-resume=1: the script's srun ran its failing step twice"

# ---- a node that fails its health check is drained and left out ----
# attempt 1 runs on n1 and n2 (Slurm's first pick); n1's node-local directory
# is read-only there alone, and its task is killed (kill -9): the plugin's
# health check drains n1 ("keel: checkpoint_dir"), attempt 2 runs on n2 and n3.
node_mount_ro n1 "$LOCAL"
rm -f "$TMP/attempts"
rc=0
timeout 120 salloc -N3 srun --auto-resume=1 -N2 -n2 bash -c \
  "echo \$KEEL_AUTO_RESUME_ATTEMPT \$SLURMD_NODENAME >>'$TMP/attempts'; sleep 0.5
   [ \$KEEL_AUTO_RESUME_ATTEMPT = 1 ] && [ \$SLURMD_NODENAME = n1 ] && kill -9 \$\$; exit 0" \
  >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 0 ] || fail "relaunch on the healthy nodes: exit $rc ($(cat "$TMP/err"))"
[ "$(grep '^1 ' "$TMP/attempts" | cut -d' ' -f2 | sort | tr '\n' ' ')" = "n1 n2 " ] &&
  [ "$(grep '^2 ' "$TMP/attempts" | cut -d' ' -f2 | sort | tr '\n' ' ')" = "n2 n3 " ] ||
  fail "attempts and their nodes: $(tr '\n' ';' <"$TMP/attempts")"
scontrol show node n1 | grep -q "Reason=keel: checkpoint_dir" || fail "n1 not drained: $(scontrol show node n1 | grep -E 'State|Reason')"
grep -q "node n1 is drained: the next attempts exclude it" "$TMP/err" || fail "no exclusion line: $(cat "$TMP/err")"
pass "n1 failed its health check after the kill: drained (keel: checkpoint_dir), attempt 2 ran on n2 and n3"

# ---- too few nodes left in the allocation: requeue, or give up when not a batch job ----
rc=0
timeout 120 salloc -N2 -w n2,n3 srun --auto-resume=1 -N2 -n2 bash -c \
  "[ \$SLURMD_NODENAME = n2 ] && { scontrol update nodename=n2 state=drain reason='keel: test'; exit 6; }
   # n3's task fails only after n2's has drained its node (a first failure would end n2's task,
   # by the plugin's --kill-on-bad-exit, before it drains), and ends with 6 when that ends it
   trap 'exit 6' TERM
   until scontrol show node n2 | grep -q DRAIN; do sleep 0.1; done; sleep 1; exit 6" \
  >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 6 ] && grep -q "1 of the job's 2 node(s) drained, the step needs 2: requeue failed (not a batch job?), giving up" "$TMP/err" ||
  fail "too few nodes: exit $rc, $(cat "$TMP/err")"
pass "too few nodes left (n2 drained, 2 needed of 2): requeue tried, given up with the step's exit 6"

