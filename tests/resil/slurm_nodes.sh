#!/usr/bin/env bash
# Inside a Slurm allocation (a real local cluster: tests/slurm_cluster.sh) the
# supervisor launches ranks with srun, and after a failure health-checks every
# node with `srun -w NODE keel health`. A node whose checkpoint directory went
# read-only (on that node only: its own mount namespace) fails its check and is
# drained with a reason; then
#   - with a spare node in the allocation, the spare takes its place and the run
#     ends with the uninterrupted run's params_xxh3;
#   - with no spare and resilience.min_ranks allowing it, the job shrinks to one
#     rank, resumes resharded from the in-memory snapshots (the lost node's
#     memory gone: its rank's state from the replica the other node kept) with
#     accumulation keeping the global batch, and ends with the uninterrupted
#     run's losses.
source "$KEEL_SRC/tests/lib.sh"
source "$KEEL_SRC/tests/slurm_cluster.sh"
mpi_env
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=200 --set checkpoint.every_steps=10 --set resilience.backoff_s=0.1 --nproc 2)
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 || { cat "$TMP/ref.out"; fail "reference run"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")

# break_rank_node RUN [lose_memory]: make rank 1's node's checkpoint directory
# read-only there, then kill rank 1 (and with lose_memory remove the snapshot
# segments that node held: rank 1's own and the replica of rank 0 it kept, as
# if the node's memory were gone with it); prints the node
break_rank_node() {
  local pid node
  pid=$(wait_train_step "$1" 1 50)
  node=$(hb node "$1" 1)
  node_mount_ro "$node" "$1/checkpoints"
  kill -9 "$pid"
  if [ "${2:-}" = lose_memory ]; then
    for seg in $(segments "$1"); do
      case $seg in *-w2-r1|*-w2-b0) rm -f "$seg" ;; esac
    done
  fi
  echo "$node"
}

slurm_cluster_start 3
# ---- a spare replaces the sick node ----
timeout 300 salloc -N 3 "$KEEL_BIN" train "$CFG" "${args[@]}" --set resilience.spares=1 --run-dir "$TMP/spare" \
  >"$TMP/spare.out" 2>&1 &
sup=$!
bad=$(break_rank_node "$TMP/spare")
rc=0; wait "$sup" || rc=$?
[ "$rc" = 0 ] || { tail -20 "$TMP/spare.out"; fail "spare: exit $rc, want 0"; }
ev=$TMP/spare/events.jsonl
grep -q "\"event\":\"health\".*node $bad: checkpoint_dir fail" "$ev" || fail "spare: no failed check on $bad: $(grep health "$ev")"
grep -q "\"event\":\"node_drained\".*node $bad failed the checkpoint_dir check: drained" "$ev" || fail "spare: $bad not drained"
grep -q '"event":"spare_used"' "$ev" || fail "spare: no spare_used event"
second=$(grep '"event":"launch"' "$ev" | sed -n 2p)
echo "$second" | grep -q "on n[0-9],n[0-9]" && ! echo "$second" | grep -q "$bad" || fail "spare: relaunch still on $bad: $second"
scontrol show node "$bad" | grep -q "State=.*DRAIN" || fail "spare: $bad is not drained in Slurm"
scontrol show node "$bad" | grep -q "Reason=keel: checkpoint_dir" || fail "spare: drain reason: $(scontrol show node "$bad" | grep Reason)"
got=$(json "$TMP/spare/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "spare: params_xxh3 $got, uninterrupted run $want"
pass "spare: $bad drained (keel: checkpoint_dir), relaunched $(echo "$second" | sed 's/.*attempt 2: //; s/".*//'), params_xxh3 $want"
slurm_cluster_stop

# ---- no spare: shrink to one rank ----
slurm_cluster_start 2
timeout 300 salloc -N 2 "$KEEL_BIN" train "$CFG" "${args[@]}" --set resilience.min_ranks=1 --run-dir "$TMP/shrink" \
  >"$TMP/shrink.out" 2>&1 &
sup=$!
bad=$(break_rank_node "$TMP/shrink" lose_memory)
rc=0; wait "$sup" || rc=$?
[ "$rc" = 0 ] || { tail -20 "$TMP/shrink.out"; fail "shrink: exit $rc, want 0"; }
grep -q '"event":"shrink".*2 -> 1 rank' "$TMP/shrink/events.jsonl" || fail "shrink: no shrink event"
[ "$(json "$TMP/shrink/summary.json" "j['world_size']")" = 1 ] || fail "shrink: final world size is not 1"
[ "$(json "$TMP/shrink/config.json" "j['train']['grad_accum_steps']")" = 2 ] || fail "shrink: accumulation not raised to 2"
# the lost node's ranks' state came from the replica on the other node (one step behind), resharded
grep '"event":"resumed"' "$TMP/shrink/events.jsonl" | tail -1 | grep -q "from memory.*resharded from 2 rank(s)" ||
  fail "shrink: not resumed from memory: $(grep '"event":"resumed"' "$TMP/shrink/events.jsonl" | tail -1)"
python3 - "$TMP/ref/metrics.jsonl" "$TMP/shrink/metrics.jsonl" <<'PY' || fail "shrink: losses differ from the uninterrupted run"
import json, sys
def losses(p):
    out = {}
    for line in open(p):
        o = json.loads(line)
        if "loss" in o: out[o["step"]] = o["loss"]
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
assert len(b) == len(a) and worst <= 1e-4, worst
print(f"ok   shrink: every step's loss within {worst:.1e} of the uninterrupted run")
PY
pass "no spare: $bad drained, shrunk to 1 rank with grad_accum_steps 2, completed"
