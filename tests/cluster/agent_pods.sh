#!/usr/bin/env bash
# keel agent as a PyTorchJob's pods run it, each pod a host of its own (the
# `keel cluster` machinery: its own address, hostname, /tmp and /dev/shm —
# so a rank's in-memory snapshot lives only on its pod and its buddy's),
# etcd on a host of its own, the agents given what the operator gives
# (PET_NNODES=2:3, PET_NPROC_PER_NODE, PET_RDZV_BACKEND/ENDPOINT/ID):
#   three pods form a world of 3 and train; a pod killed whole (its agent and
#   its rank) leaves two, which form the next round, resume from the
#   snapshots on their own /dev/shm (the lost rank's shard from its buddy's
#   copy), resharded to 2 ranks, and go on within the resharding tolerance of
#   the undisturbed run; the pod comes back and is admitted at the round
#   after; the run completes. Every rank's heartbeat names its own pod.
source "$KEEL_SRC/tests/lib.sh"
source "$KEEL_SRC/tests/cluster_fixture.sh"
command -v etcd >/dev/null || fail "etcd not found: run scripts/install-deps.sh"
cluster_spec pods 3
"$KEEL_BIN" cluster up "$TMP/pods.json" >"$TMP/up.out" 2>&1 || fail "cluster up: $(tail -3 "$TMP/up.out")"
eval "$("$KEEL_BIN" cluster env "$TMP/pods.json")" # KEEL_CLUSTER_SHARED, KEEL_CLUSTER_KEEL
S=$KEEL_CLUSTER_SHARED
on() { local node=$1; shift; "$KEEL_BIN" cluster exec "$TMP/pods.json" "$node" -- "$@"; }
addr() { "$KEEL_BIN" cluster status "$TMP/pods.json" | awk -v n="$1" '$1 == n {print $3}'; }
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 KEEL_METRICS_PORT=0
cp "$KEEL_SRC/tests/train/micro.json" "$S/micro.json"

# etcd on the login node, reached at its address
E=$(addr login1)
[ -n "$E" ] || fail "no address for login1: $("$KEEL_BIN" cluster status "$TMP/pods.json")"
on login1 etcd --name pods --data-dir "$S/etcd" --listen-client-urls "http://$E:2379" \
  --advertise-client-urls "http://$E:2379" --listen-peer-urls "http://127.0.0.1:2380" \
  --initial-advertise-peer-urls "http://127.0.0.1:2380" --initial-cluster "pods=http://127.0.0.1:2380" \
  >"$TMP/etcd.log" 2>&1 &
for _ in $(seq 1 100); do ETCDCTL_API=3 etcdctl --endpoints "$E:2379" endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
ETCDCTL_API=3 etcdctl --endpoints "$E:2379" endpoint health >/dev/null 2>&1 || fail "etcd on login1: $(tail -3 "$TMP/etcd.log")"

# pod NODE: `keel agent` on NODE with the PyTorchJob's environment
# a global batch of 12 sequences: 3 ranks x 2 x 2 micro-batches, or 2 ranks x 2 x 3
args=(--set train.steps=160 --set checkpoint.every_steps=20 --set train.micro_batch_size=2 --set train.grad_accum_steps=2)
pod() {
  on "$1" env PET_NNODES=2:3 PET_NPROC_PER_NODE=1 PET_RDZV_BACKEND=etcd PET_RDZV_ENDPOINT="$E:2379" \
    PET_RDZV_ID=pods-job PET_MAX_RESTARTS=3 "$KEEL_CLUSTER_KEEL" agent "$S/micro.json" --run-dir "$S/run" \
    --last-call 2 "${args[@]}" >>"$TMP/$1.out" 2>&1 &
  eval "POD_$1=$!"
}
# kill_pod NODE: every keel process in the node's network namespace (its agent and ranks)
kill_pod() {
  local pid
  for pid in $(ip netns pids "keel-pods-$1"); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = keel ] && kill -9 "$pid"
  done
  return 0
}

# the undisturbed run: mpirun, 3 ranks
mpi_env
"$KEEL_BIN" train "$KEEL_SRC/tests/train/micro.json" --nproc 3 "${args[@]}" --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 || fail "reference run: $(tail -3 "$TMP/ref.out")"

pod w1; pod w2; pod w3
wait_train_step "$S/run" 2 40 >/dev/null
for r in 0 1 2; do
  node=$(hb node "$S/run" "$r")
  [[ $node == w[123] ]] || fail "rank $r's heartbeat names node '$node', not a pod"
done
[ "$(for r in 0 1 2; do hb node "$S/run" "$r"; done | sort -u | wc -l)" = 3 ] || fail "the ranks do not run on 3 pods"
victim=$(hb node "$S/run" 2)
kill_pod "$victim"
wait_train_step "$S/run" 0 100 >/dev/null
grep -q '"event":"rendezvous".*round 1: 2 node(s) x 1 rank(s) = world 2' "$S/run/events.jsonl" ||
  fail "no round on the 2 pods left: $(grep -v checkpoint "$S/run/events.jsonl")"
grep -q '"event":"resumed".*from memory.*resharded from 3 rank' "$S/run/events.jsonl" ||
  fail "not resumed from the pods' memory: $(grep resumed "$S/run/events.jsonl")"
pass "pod $victim killed at step 40+: the 2 pods left resumed from their own /dev/shm, resharded from 3 ranks"

pod "$victim"
for p in w1 w2 w3; do # (the victim's: the agent started again)
  rc=0
  wait "$(eval echo "\$POD_$p")" || rc=$?
  [ "$rc" = 0 ] || fail "pod $p's agent exited $rc: $(grep -v '^step' "$TMP/$p.out" | tail -5)"
done
grep -q '"event":"node_joined".*node '"$victim"' is waiting to join' "$S/run/events.jsonl" ||
  fail "$victim was not seen waiting: $(grep -v checkpoint "$S/run/events.jsonl")"
grep -q '"event":"rendezvous".*round 2: 3 node(s) x 1 rank(s) = world 3' "$S/run/events.jsonl" ||
  fail "$victim was not admitted: $(grep rendezvous "$S/run/events.jsonl")"
final_loss_near "$TMP/ref" "$S/run" 160 "after 3 -> 2 -> 3 pods"
pass "pod $victim came back: admitted at round 2 (world 3), the run completed on 3 pods"
