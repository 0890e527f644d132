#!/usr/bin/env bash
# slurm_resume.sh: from kill -9 to the first new step under srun
# --auto-resume, on a real multi-host Slurm cluster on this machine (`keel
# cluster up`, tests/cluster_fixture.sh: 4 workers, each its own host; the
# plugin in plugstack.conf with keel health --epilog as its health program).
# An sbatch job runs
#   srun -N2 -n2 --mpi=pmix --kill-on-bad-exit=1 --auto-resume=3 keel train configs/tiny.json
# (one rank per task, no supervisor of keel's); rank 1 is killed three times,
# each once the relaunch has done a few steps. Per kill: the time to the first
# step the relaunch completes (rank 0's heartbeat: a new pid past its restored
# step) and where it went — until the step's last rank is gone, from then to
# the relaunched ranks' state loaded (health checks, srun, MPI, set-up,
# restore), the first step — the state it resumed from, steps lost. Target:
# median <= 10 s. Not a test.
#
#   bash bench/slurm_resume.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
export KEEL_SRC="$root" KEEL_BIN KEEL_BUILD="$(dirname "$KEEL_BIN")" WAIT_STEP_S=600
source "$root/tests/lib.sh"
source "$root/tests/cluster_fixture.sh"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
mkdir -p "$TMP/lc"
printf 'mkdir -p /tmp/keel-local\n' >"$TMP/lc/on_create.sh"
cluster_spec kc-bench 4 '"HealthCheck": {"checks": ["gemm", "memory", "checkpoint_dir"], "dir": "/tmp/keel-local"}' "$TMP/lc"
"$KEEL_BIN" cluster up "$TMP/kc-bench.json"
eval "$("$KEEL_BIN" cluster env "$TMP/kc-bench.json")"
run=$KEEL_CLUSTER_SHARED/run
# what the job reads must be where every node sees it: the cluster's copy of keel, the config in SharedDir
cp "$root/configs/tiny.json" "$KEEL_CLUSTER_SHARED/tiny.json"
cat >"$KEEL_CLUSTER_SHARED/job.sh" <<EOF
#!/bin/sh
exec srun -N2 -n2 --mpi=pmix --kill-on-bad-exit=1 --auto-resume=3 "$KEEL_CLUSTER_KEEL" train "$KEEL_CLUSTER_SHARED/tiny.json" \\
  --set train.steps=100 --set checkpoint.every_steps=50 --run-dir "$run"
EOF
jobid=$(timeout 30 sbatch --parsable -N4 --chdir="$KEEL_CLUSTER_SHARED" -o "$KEEL_CLUSTER_SHARED/job.out" "$KEEL_CLUSTER_SHARED/job.sh")
trap 'scancel "$jobid" 2>/dev/null || true; cluster_down; rm -rf "$TMP"' EXIT
: >"$TMP/kills"
prev=x
for k in 1 2 3; do
    pid=$(wait_train_step "$run" 1 $(( k * 25 )) "$prev")
    at=$(hb step "$run" 1) old0=$(hb pid "$run" 0)
    t0=$(date +%s.%N)
    kill -9 "$pid"
    # the step's end: rank 0's process gone (Slurm cancelled the step; keel's stop deadline)
    while kill -0 "$old0" 2>/dev/null; do sleep 0.02; done
    t_gone=$(date +%s.%N)
    # the first step the relaunch completes: rank 0 in a new process, past the step it resumed at
    while :; do
        p=$(hb pid "$run" 0) s=$(hb step "$run" 0) ph=$(hb phase "$run" 0)
        if [ -n "$p" ] && [ "$p" != "$old0" ] && [ "$ph" = train ] && [ -n "$s" ]; then
            start=$(grep '"event":"resumed"' "$run/events.jsonl" 2>/dev/null | tail -1 | sed 's/.*"step":\([0-9]*\).*/\1/')
            [ -n "$start" ] && [ "$s" -gt "$start" ] && break
        fi
        sleep 0.02
    done
    t1=$(date +%s.%N)
    line=$(grep '"event":"resumed"' "$run/events.jsonl" | tail -1)
    src=$(echo "$line" | sed 's/.*"detail":"\([^;]*\);.*/\1/')
    t_res=$(echo "$line" | sed 's/.*"unix_s":\([0-9.]*\).*/\1/')
    echo "$k $at $start $(python3 -c "print(f'{$t1 - $t0:.2f} {$t_gone - $t0:.2f} {$t_res - $t_gone:.2f} {$t1 - $t_res:.2f}')") $src" >>"$TMP/kills"
    prev=$pid
done
for _ in $(seq 1 3000); do [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] && break; sleep 0.2; done
python3 - "$TMP/kills" "$run" <<'PY'
import json, statistics, sys
rows = [l.split(" ", 7) for l in open(sys.argv[1])]
print("| kill | killed after step | resumed at step | lost steps | kill -9 -> first new step s | step ended | relaunch to state loaded | first step | from |")
print("|---|---|---|---|---|---|---|---|---|")
for k, at, start, secs, gone, res, first, src in rows:
    print(f"| {k} | {at} | {start} | {int(at) - int(start)} | {secs} | {gone} | {res} | {first} | {src.strip()} |")
med = statistics.median(float(r[3]) for r in rows)
s = json.load(open(f"{sys.argv[2]}/summary.json"))
print(f"\nmedian {med:.2f} s (target <= 10 s: {'met' if med <= 10 else 'MISSED'}); run {s['status']}, "
      f"{s['steps']} steps, median step {s['tokens'] / s['steps'] / s['tokens_per_s_median']:.2f} s")
PY
grep "keel_auto_resume" "$KEEL_CLUSTER_SHARED/job.out" | sed 's/^/  /'
