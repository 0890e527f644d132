#!/usr/bin/env bash
# keel train as a Kubeflow MPIJob's launcher pod runs it: mpirun over the
# operator's default hostfile (OMPI_MCA_orte_default_hostfile), one slot on
# each of three worker pods, each pod a host of its own (the `keel cluster`
# machinery: own address, hostname, /tmp and /dev/shm). The operator starts
# the remote daemons with ssh; here OpenMPI's rsh agent is `keel cluster exec`,
# which enters the pod as ssh would. The supervisor on the launcher pod has no
# rank of its own there: it watches them through their heartbeats in the
# shared run directory, never by a local pid.
#   - the ranks run one per worker pod; the run ends with the params_xxh3 of
#     mpirun's 3 ranks on one machine;
#   - a rank killed on its pod mid-run: mpirun ends the job, the supervisor
#     names the rank, relaunches over the hostfile, the ranks resume from
#     their pods' own /dev/shm, and the run ends bit-identical;
#   - SIGTERM to the supervisor (the launcher pod deleted) reaches the ranks
#     through mpirun: they save and exit, keel train exits 75, and a second
#     launch resumes from that checkpoint to the end.
source "$KEEL_SRC/tests/lib.sh"
source "$KEEL_SRC/tests/cluster_fixture.sh"
cluster_spec mj 3
"$KEEL_BIN" cluster up "$TMP/mj.json" >"$TMP/up.out" 2>&1 || fail "cluster up: $(tail -3 "$TMP/up.out")"
eval "$("$KEEL_BIN" cluster env "$TMP/mj.json")" # KEEL_CLUSTER_SHARED, KEEL_CLUSTER_KEEL
S=$KEEL_CLUSTER_SHARED
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 KEEL_METRICS_PORT=0
cp "$KEEL_SRC/tests/train/micro.json" "$S/micro.json"
cp "$TMP/mj.json" "$S/mj.json" # the nodes' /tmp is their own
# the operator's hostfile, by the pods' names (they resolve on every node), and ssh's stand-in
printf 'w1 slots=1\nw2 slots=1\nw3 slots=1\n' >"$S/hostfile"
cat >"$S/rsh.sh" <<EOF
#!/bin/sh
h=\$1; shift
exec "$KEEL_CLUSTER_KEEL" cluster exec "$S/mj.json" "\$h" -- /bin/sh -c "\$*"
EOF
chmod +x "$S/rsh.sh"
args=(--set train.steps=80 --set checkpoint.every_steps=20)
# launcher RUN ARGS...: keel train on the launcher pod (login1), in the background: $LAUNCHER
launcher() {
  local run=$1; shift
  "$KEEL_BIN" cluster exec "$TMP/mj.json" login1 -- env OMPI_MCA_orte_default_hostfile="$S/hostfile" \
    OMPI_MCA_plm_rsh_agent="$S/rsh.sh" "$KEEL_CLUSTER_KEEL" train "$S/micro.json" --nproc 3 "${args[@]}" "$@" \
    --run-dir "$run" >>"$TMP/$(basename "$run").out" 2>&1 &
  LAUNCHER=$!
}
ends_with() { # RUN CODE
  local rc=0
  wait "$LAUNCHER" || rc=$?
  [ "$rc" = "$2" ] || fail "keel train on the launcher exited $rc, want $2: $(grep -v '^step' "$TMP/$(basename "$1").out" | tail -5)"
}
xxh() { json "$1/summary.json" "j['params_xxh3']"; }

# the undisturbed run: mpirun, 3 ranks on one machine (pinned to loopback there alone)
(mpi_env && "$KEEL_BIN" train "$KEEL_SRC/tests/train/micro.json" --nproc 3 "${args[@]}" --run-dir "$TMP/ref") \
  >"$TMP/ref.out" 2>&1 || fail "reference run: $(tail -3 "$TMP/ref.out")"
want=$(xxh "$TMP/ref")

launcher "$S/run"
wait_train_step "$S/run" 2 40 >/dev/null
[ "$(for r in 0 1 2; do hb node "$S/run" "$r"; done | sort | tr '\n' ' ')" = "w1 w2 w3 " ] ||
  fail "the ranks do not run one per worker pod: $(for r in 0 1 2; do hb node "$S/run" "$r"; done)"
victim=$(hb node "$S/run" 1)
kill -9 "$(hb pid "$S/run" 1)"
ends_with "$S/run" 0
grep -q '"event":"failure",.*"cause":"crash","rank":1,' "$S/run/events.jsonl" ||
  fail "rank 1 is not named: $(grep failure "$S/run/events.jsonl")"
grep -q '"event":"resumed".*from memory' "$S/run/events.jsonl" ||
  fail "not resumed from the pods' memory: $(grep resumed "$S/run/events.jsonl")"
[ "$(xxh "$S/run")" = "$want" ] || fail "params_xxh3 $(xxh "$S/run") after the kill, undisturbed $want"
pass "mpirun over the hostfile, a rank on each of w1-w3; rank 1 killed on $victim at step 40+: named, relaunched," \
  "resumed from the pods' memory, params_xxh3 as 3 ranks on one machine ($want)"

# the launcher pod deleted: SIGTERM to keel train reaches the ranks through mpirun
launcher "$S/stop"
wait_train_step "$S/stop" 2 30 >/dev/null
pkill -TERM -f -- "^$KEEL_CLUSTER_KEEL train $S/micro.json --nproc 3 .*--run-dir $S/stop" ||
  fail "no keel train to stop"
ends_with "$S/stop" 75
grep -q '"event":"preempt".*(through mpirun: the ranks run on the hostfile' "$S/stop/events.jsonl" &&
  grep -q '"event":"stopped"' "$S/stop/events.jsonl" ||
  fail "no preempt event through mpirun, or no stopped event: $(grep -v checkpoint "$S/stop/events.jsonl" | tail -4)"
saved=$(json "$S/stop/summary.json" "j['steps']")
launcher "$S/stop"
ends_with "$S/stop" 0
[ "$(xxh "$S/stop")" = "$want" ] || fail "stopped at step $saved and resumed: params_xxh3 $(xxh "$S/stop"), undisturbed $want"
pass "SIGTERM to the launcher's keel train: the ranks saved at step $saved and exited 75; resumed to the end, bit-identical"
