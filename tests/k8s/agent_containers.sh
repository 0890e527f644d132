#!/usr/bin/env bash
# The CPU image (scripts/build-image.sh) run as a PyTorchJob runs it: the
# build's keel packaged with the libraries it links, two podman containers
# (runc) on a network of their own, each given the operator's environment
# (PET_NNODES, PET_NPROC_PER_NODE, PET_RDZV_*), meeting in an etcd on the
# network's gateway, the run directory a shared volume. The image's entry
# point is `keel agent`; the job ends with mpirun's params_xxh3 for 2 ranks.
# Containers, network and image are removed at the end, whatever happened.
source "$KEEL_SRC/tests/lib.sh"
for tool in podman buildah runc etcd; do
  command -v "$tool" >/dev/null || fail "$tool not found: run scripts/install-deps.sh"
done
tag=keel-test-$$
net=10.$((100 + RANDOM % 50)).$((20 + RANDOM % 200))
cleanup() {
  podman rm -f "$tag-a" "$tag-b" >/dev/null 2>&1 || true
  podman network rm -f "$tag" >/dev/null 2>&1 || true
  podman rmi -f "localhost/$tag:cpu" >/dev/null 2>&1 || true
  kill_leftovers
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

bash "$KEEL_SRC/scripts/build-image.sh" --keel "$KEEL_BIN" --name "$tag:cpu" >"$TMP/build.out" 2>&1 ||
  fail "build-image.sh: $(tail -3 "$TMP/build.out")"
size=$(podman image inspect "localhost/$tag:cpu" --format '{{.Size}}')
entry=$(podman image inspect "localhost/$tag:cpu" --format '{{json .Config.Entrypoint}}')
[ "$entry" = '["/usr/local/bin/keel","agent"]' ] || fail "the image's entry point is $entry"
pass "scripts/build-image.sh: $tag:cpu, $((size / 1000000)) MB, entry point $entry"

podman network create --subnet "$net.0/24" --gateway "$net.1" "$tag" >/dev/null || fail "podman network create"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
peer=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# the bridge exists once a container uses the network: etcd listens on the gateway after that
mkdir -p "$TMP/shared"
cp "$KEEL_SRC/tests/train/micro.json" "$TMP/shared/micro.json"
args=(--set train.steps=40 --set checkpoint.every_steps=20)
run_pod() { # NAME: a pod of the job, as the operator would start it
  podman run --runtime runc --rm --name "$tag-$1" --hostname "$1" --network "$tag" \
    --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 --shm-size 256m -v "$TMP/shared:/shared" \
    -e PET_NNODES=2 -e PET_NPROC_PER_NODE=1 -e PET_RDZV_BACKEND=etcd -e "PET_RDZV_ENDPOINT=$net.1:$port" \
    -e PET_RDZV_ID=containers -e KEEL_METRICS_PORT=0 -e "ASAN_OPTIONS=detect_leaks=0" \
    "localhost/$tag:cpu" /shared/micro.json --run-dir /shared/run --last-call 1 "${args[@]}" \
    >"$TMP/$1.out" 2>&1 &
  eval "POD_$1=$!"
}
run_pod a
for _ in $(seq 1 100); do ip -o -4 addr show | grep -q " $net.1/" && break; sleep 0.1; done
ip -o -4 addr show | grep -q " $net.1/" || fail "the network's bridge never came up"
etcd --name c --data-dir "$TMP/etcd" --listen-client-urls "http://$net.1:$port" \
  --advertise-client-urls "http://$net.1:$port" --listen-peer-urls "http://127.0.0.1:$peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "c=http://127.0.0.1:$peer" \
  >"$TMP/etcd.log" 2>&1 &
run_pod b
for p in a b; do
  rc=0
  wait "$(eval echo "\$POD_$p")" || rc=$?
  [ "$rc" = 0 ] || fail "container $p exited $rc: $(grep -v '^step' "$TMP/$p.out" | tail -5)"
done
mpi_env
"$KEEL_BIN" train "$KEEL_SRC/tests/train/micro.json" "${args[@]}" --nproc 2 --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 ||
  fail "reference: $(tail -3 "$TMP/ref.out")"
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")
got=$(json "$TMP/shared/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "two containers: params_xxh3 $got, mpirun's $want"
nodes=$(for r in 0 1; do hb node "$TMP/shared/run" "$r"; done | sort | tr '\n' ' ')
[ "$nodes" = "a b " ] || fail "the ranks ran on '$nodes', not on containers a and b"
pass "2 containers of the image (entry point keel agent, PET_* as the operator sets them): mpirun's params_xxh3 $want"
