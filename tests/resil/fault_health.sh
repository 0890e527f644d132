#!/usr/bin/env bash
# After a failure the supervisor health-checks the node before relaunching; a
# check that genuinely fails excludes the node. A local run has only this
# machine, so the run stops with a report naming the check (tests/resil/slurm_nodes.sh
# covers spares and shrinking on a multi-node Slurm cluster):
#   - an impossible GEMM floor (resilience.gemm_floor_gflops);
#   - the checkpoint directory remounted read-only under the running job.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
# lazily: a rank still dying may hold the directory; a bind mount left behind breaks the next run's
trap 'umount -l "$TMP/ro/checkpoints" 2>/dev/null || true; rm -rf "$TMP"' EXIT
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=5000 --set checkpoint.every_steps=10 --set resilience.backoff_s=0.1 --nproc 2)

# the floor: the first launch runs (checks run only after a failure), then a kill
"$KEEL_BIN" train "$CFG" "${args[@]}" --set resilience.gemm_floor_gflops=1e9 --run-dir "$TMP/gemm" \
  >"$TMP/gemm.out" 2>"$TMP/gemm.err" &
sup=$!
kill -9 "$(wait_train_step "$TMP/gemm" 1 30)"
rc=0; wait "$sup" || rc=$?
[ "$rc" = 1 ] || fail "gemm floor: exit $rc, want 1"
grep -q '"event":"health".*gemm fail: one core does' "$TMP/gemm/events.jsonl" || fail "gemm floor: no failed gemm check event"
grep -q '"event":"node_excluded".*failed the gemm check' "$TMP/gemm/events.jsonl" || fail "gemm floor: no node_excluded event"
grep -q "keel: error: this machine (.*) failed the gemm health check" "$TMP/gemm.err" || fail "gemm floor: report: $(tail -2 "$TMP/gemm.err")"
[ "$(event_count "$TMP/gemm" launch)" = 1 ] || fail "gemm floor: relaunched on a node that failed its check"
pass "impossible GEMM floor: node excluded, stopped: $(grep 'keel: error' "$TMP/gemm.err")"

# the checkpoint directory goes read-only under the job (a broken mount)
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/ro" >"$TMP/ro.out" 2>"$TMP/ro.err" &
sup=$!
pid=$(wait_train_step "$TMP/ro" 1 30)
# a save writing into it at that moment makes the read-only remount busy: try again until one is not
mount --bind "$TMP/ro/checkpoints" "$TMP/ro/checkpoints" || { kill "$sup"; fail "cannot bind-mount (needs root and mount)"; }
ro=0
for _ in $(seq 1 200); do mount -o remount,bind,ro "$TMP/ro/checkpoints" 2>"$TMP/mount.err" && { ro=1; break; }; sleep 0.02; done
[ "$ro" = 1 ] || { kill "$sup"; fail "cannot remount a directory read-only: $(cat "$TMP/mount.err")"; }
kill -9 "$pid"
rc=0; wait "$sup" || rc=$?
[ "$rc" = 1 ] || fail "read-only checkpoints: exit $rc, want 1"
grep -q '"event":"health".*checkpoint_dir fail: .*not writable' "$TMP/ro/events.jsonl" || fail "read-only: no failed checkpoint_dir event"
grep -q "keel: error: this machine (.*) failed the checkpoint_dir health check" "$TMP/ro.err" || fail "read-only: report: $(tail -2 "$TMP/ro.err")"
pass "read-only checkpoint directory: node excluded, stopped: $(grep 'keel: error' "$TMP/ro.err")"
