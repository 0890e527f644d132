#!/usr/bin/env bash
# keel health --epilog on a real local Slurm cluster (tests/slurm_cluster.sh,
# 2 nodes): a node that fails a check is drained with reason "keel: <check>";
# passing again returns it to service; a drain for another reason stays. Then
# as slurm.conf's Epilog, run by slurmd as root after every job: node n1's
# node-local directory is read-only in n1's own mount namespace, so after a
# job there its checkpoint_dir check genuinely fails and n1 is drained, while
# n2, after a job of its own, stays in service. Bad input: the mpi check
# (it needs a job's ranks) and a node Slurm does not know.
source "$KEEL_SRC/tests/lib.sh"
source "$KEEL_SRC/tests/slurm_cluster.sh"
LOCAL=$TMP/node-local
mkdir -p "$LOCAL"
# the node's checks and thresholds from a node config, as on a real cluster
cat >"$TMP/node.json" <<EOF
{"checks": ["checkpoint_dir", "gemm", "memory"], "gemm_floor_gflops": 1, "memory_floor_gib": 0.5, "dir": "$LOCAL"}
EOF
cat >"$TMP/epilog.sh" <<EOF
#!/bin/sh
export SLURM_CONF=$TMP/slurm/slurm.conf
exec "$KEEL_BIN" health --epilog --node-config "$TMP/node.json" >>"$TMP/epilog-\$SLURMD_NODENAME.log" 2>&1
EOF
chmod +x "$TMP/epilog.sh"
export SLURM_EXTRA_CONF="Epilog=$TMP/epilog.sh"
slurm_cluster_start 2

# node_field NODE FIELD: State or Reason of a node (Reason without Slurm's " [user@time]")
node_field() { scontrol -o show node "$1" | sed -n "s/.* $2=\(.*\)/\1/p" | sed 's/ [A-Z][A-Za-z]*=.*//; s/ \[.*//'; }
epilog() { SLURMD_NODENAME=$1 "$KEEL_BIN" health --epilog "${@:2}"; }

# ---- by hand: drain on failure, return on success ----
epilog n1 --checks gemm --gemm-floor 1e9 >"$TMP/out" 2>"$TMP/err" || fail "failing epilog exit $?: $(cat "$TMP/err")"
grep -q "UNHEALTHY" "$TMP/out" || fail "no report: $(cat "$TMP/out")"
[[ "$(node_field n1 State)" == *DRAIN* ]] && [ "$(node_field n1 Reason)" = "keel: gemm" ] ||
  fail "n1 not drained by keel: State=$(node_field n1 State) Reason=$(node_field n1 Reason)"
pass "a failed gemm check drained n1: $(cat "$TMP/err")"
epilog n1 --checks gemm >"$TMP/out" 2>"$TMP/err" || fail "passing epilog exit $?: $(cat "$TMP/err")"
[[ "$(node_field n1 State)" != *DRAIN* ]] || fail "n1 still drained after passing: $(node_field n1 State)"
pass "passing again returned n1 to service: $(cat "$TMP/err")"
scontrol update nodename=n2 state=drain reason="admin: new DIMMs"
epilog n2 --checks gemm >"$TMP/out" 2>"$TMP/err" || fail "epilog on n2 exit $?: $(cat "$TMP/err")"
[[ "$(node_field n2 State)" == *DRAIN* ]] && [ "$(node_field n2 Reason)" = "admin: new DIMMs" ] ||
  fail "an administrator's drain was touched: $(node_field n2 State) $(node_field n2 Reason)"
pass "an administrator's drain stays: $(cat "$TMP/err")"
scontrol update nodename=n2 state=resume

# ---- as slurm.conf's Epilog, after real jobs ----
node_mount_ro n1 "$LOCAL"
timeout 60 srun -w n1 -N1 true || fail "job on n1"
timeout 60 srun -w n2 -N1 true || fail "job on n2"
for _ in $(seq 1 100); do
  [[ "$(node_field n1 State)" == *DRAIN* ]] && [ -s "$TMP/epilog-n2.log" ] && break
  sleep 0.2
done
[[ "$(node_field n1 State)" == *DRAIN* ]] && [ "$(node_field n1 Reason)" = "keel: checkpoint_dir" ] ||
  fail "the Epilog did not drain n1: State=$(node_field n1 State) Reason=$(node_field n1 Reason);" \
    "its log: $(cat "$TMP/epilog-n1.log" 2>/dev/null)"
grep -q "drained" "$TMP/epilog-n1.log" || fail "n1's epilog log: $(cat "$TMP/epilog-n1.log")"
[[ "$(node_field n2 State)" != *DRAIN* ]] ||
  fail "n2 drained: $(node_field n2 Reason); its log: $(cat "$TMP/epilog-n2.log")"
pass "Epilog after a job: n1 (read-only node-local dir) drained \"keel: checkpoint_dir\", n2 in service"

# ---- bad input ----
expect_input_error "mpi in an epilog" "checks mpi: the mpi check needs a job's ranks" epilog n2 --checks mpi
echo '{"checks": ["gemm"], "gemm_floor": 5}' >"$TMP/bad.json"
expect_input_error "unknown node config key" "bad.json: unknown key 'gemm_floor' \\(a node config has" \
  epilog n2 --node-config "$TMP/bad.json"
echo '{"checks": ["gemm", "mpi"]}' >"$TMP/bad.json"
expect_input_error "mpi in a node config" "bad.json: checks: the mpi check needs a job's ranks" \
  epilog n2 --node-config "$TMP/bad.json"
echo '{"memory_floor_gib": "lots"}' >"$TMP/bad.json"
expect_input_error "a node config's bad value" "bad.json: bad value for 'memory_floor_gib'" \
  epilog n2 --node-config "$TMP/bad.json"
[[ "$(node_field n2 State)" != *DRAIN* ]] || fail "bad input drained n2"
rc=0
epilog nosuch --checks gemm >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -q "scontrol show node nosuch: no answer in 30 s, or no such node" "$TMP/err" ||
  fail "unknown node: exit $rc, $(cat "$TMP/err")"
pass "a node Slurm does not know: exit 1, $(tail -1 "$TMP/err")"
