# tests/cluster_fixture.sh (a fixture, not a test; sourced after tests/lib.sh):
# `keel cluster` specs for the tests. cluster_spec NAME WORKERS [EXTRA_JSON]
# writes $TMP/NAME.json: a controller, a login node and WORKERS workers, its
# state and shared directories under /var/tmp (each node has its own /tmp),
# a subnet of its own; cluster_down (on exit) takes every cluster the test
# brought up down and checks nothing of them is left. Jobs run the cluster's
# copy of keel ($KEEL_CLUSTER_KEEL from `keel cluster env`): the build's may
# be under /tmp, which no node shares.
CLUSTER_SPECS=()
declare -A CLUSTER_BRIDGE_ADDR
CLUSTER_STATE=$(mktemp -d /var/tmp/keel-cluster-test.XXXXXX)
# The nodes' /tmp is their own: what a job's processes read by path (LeakSanitizer's
# suppressions, tests/lib.sh) must lie where every node sees it, whatever directory
# the source tree is in (a clone under /tmp).
if [[ ${LSAN_OPTIONS:-} == *suppressions=* ]]; then
  cp "$KEEL_SRC/tests/lsan.supp" "$CLUSTER_STATE/lsan.supp"
  export LSAN_OPTIONS=suppressions=$CLUSTER_STATE/lsan.supp:print_suppressions=0
fi
cluster_spec() {
  local name=$1 workers=$2 extra=${3:-} lc='' net
  [ -z "${4:-}" ] || lc=", \"LifeCycleConfig\": {\"SourceDir\": \"$4\", \"OnCreate\": \"on_create.sh\"}"
  net=10.$(( 200 + RANDOM % 50 )).$(( 20 + RANDOM % 200 ))
  CLUSTER_BRIDGE_ADDR[$name]=$net.1
  cat >"$TMP/$name.json" <<JSON
{"ClusterName": "$name",
 "InstanceGroups": [
   {"InstanceGroupName": "ctl", "Role": "controller", "InstanceCount": 1$lc},
   {"InstanceGroupName": "login", "Role": "login", "InstanceCount": 1$lc},
   {"InstanceGroupName": "w", "Role": "worker", "InstanceCount": $workers, "Cpus": 4, "MemoryMiB": 2000$lc}],
 "StateDir": "$CLUSTER_STATE/$name", "SharedDir": "$CLUSTER_STATE/$name/fsx",
 "Subnet": "$net.0/24"${extra:+, $extra}}
JSON
  CLUSTER_SPECS+=("$TMP/$name.json")
}
# cluster_left NAME: what of cluster NAME is still on this machine (empty: nothing)
cluster_left() {
  local ns procs
  ns=$(ip netns list 2>/dev/null | grep -o "^keel-$1-[a-z0-9-]*" | tr '\n' ' ' || true)
  procs=$(pgrep -af -- "$CLUSTER_STATE/$1/" | grep -v pgrep | tr '\n' ' ' || true)
  [ -z "$ns" ] || echo "namespaces: $ns"
  ip -o -4 addr show | grep -q " ${CLUSTER_BRIDGE_ADDR[$1]:-none}/" && echo "bridge: $(ip -o -4 addr show | grep " ${CLUSTER_BRIDGE_ADDR[$1]}/")"
  [ -z "$procs" ] || echo "processes: $procs"
  grep -q "/run/netns/keel-$1-" /proc/mounts && echo "mounts: $(grep "/run/netns/keel-$1-" /proc/mounts | tr '\n' ' ')"
  true
}
cluster_down() {
  local spec
  for spec in "${CLUSTER_SPECS[@]}"; do "$KEEL_BIN" cluster down "$spec" >/dev/null 2>&1 || true; done
  rm -rf "$CLUSTER_STATE"
}
trap 'cluster_down; kill_leftovers; rm -rf "$TMP"' EXIT
command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v ip >/dev/null ||
  fail "Slurm, munge or iproute2 missing: run scripts/install-deps.sh"
