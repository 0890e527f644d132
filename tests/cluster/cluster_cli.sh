#!/usr/bin/env bash
# keel cluster on this machine: bad specs and a failing lifecycle script
# leave nothing running; a spec is data, never code: hostile values ($(...),
# backticks, quotes, a newline, '..') are refused by env and up alike, and
# eval of what env printed runs nothing; a plugin or a library keel loads
# that the nodes cannot reach is refused before anything starts; a slurmd
# that cannot start is one line with its log and the log's last error; a
# cluster of 2 workers comes up with every node its own host (hostname,
# /tmp, /dev/shm, address: MPI ranks on two nodes talk over the bridge),
# its on_create run once per node with its name and role, keel and the
# plugin copied into StateDir where every node sees them (the build may be
# under /tmp); status, env (exactly its variables) and exec work from the
# host; a second up is refused; down leaves no process, namespace, bridge
# or mount. slurm-conf --hosts writes the files for real hosts and never
# overwrites them.
source "$KEEL_SRC/tests/lib.sh"
source "$KEEL_SRC/tests/cluster_fixture.sh"
K=$KEEL_BIN

# ---- bad specs: one line, exit 2, nothing made ----
echo '{"ClusterName": "kc-bad", "InstanceGroups": [], "Colour": 1}' >"$TMP/unknown.json"
expect_input_error "unknown key" "unknown.json: unknown key 'Colour'" "$K" cluster up "$TMP/unknown.json"
echo '{"ClusterName": "kc-bad", "InstanceGroups": [{"InstanceGroupName": "w", "Role": "worker", "InstanceCount": 2}]}' >"$TMP/noctl.json"
expect_input_error "no controller" "no group with Role \"controller\"" "$K" cluster up "$TMP/noctl.json"
cluster_spec kc-zero 0
expect_input_error "zero workers" "InstanceCount: 0 nodes" "$K" cluster up "$TMP/kc-zero.json"
expect_input_error "unknown verb" "unknown command 'start'" "$K" cluster start "$TMP/kc-zero.json"
[ -z "$(cluster_left kc-bad)$(cluster_left kc-zero)" ] || fail "a refused spec left: $(cluster_left kc-bad)"

# ---- a spec is data, never code: refused by env and up, and nothing runs ----
M=$TMP/ran-from-a-spec
hostile_spec() { # NAME KEY JSON_VALUE
  cat >"$TMP/$1.json" <<JSON
{"ClusterName": "kc-bad", "InstanceGroups": [{"InstanceGroupName": "ctl", "Role": "controller", "InstanceCount": 1},
 {"InstanceGroupName": "w", "Role": "worker", "InstanceCount": 1}], "$2": $3}
JSON
}
hostile_spec h-subst StateDir "\"/var/tmp/kc-bad\$(touch $M)\""
hostile_spec h-backtick SharedDir "\"/var/tmp/\`touch $M\`\""
hostile_spec h-quote SharedDir "\"/var/tmp/x'; touch $M; '\""
hostile_spec h-newline AutoResumePlugin "\"/opt/k.so\\nrequired /tmp/evil.so\""
hostile_spec h-dotdot StateDir "\"/var/../tmp/kc-bad\""
for h in h-subst h-backtick h-quote h-newline h-dotdot; do
  expect_input_error "$h: env refuses" "$h.json: (StateDir|SharedDir|AutoResumePlugin): '" "$K" cluster env "$TMP/$h.json"
  [ ! -s "$TMP/out" ] || fail "$h: env printed $(cat "$TMP/out")"
  eval "$(cat "$TMP/out")"
  expect_input_error "$h: up refuses" "$h.json: (StateDir|SharedDir|AutoResumePlugin): '" "$K" cluster up "$TMP/$h.json"
done
[ ! -e "$M" ] && [ ! -e /var/tmp/kc-bad ] || fail "a spec's value ran as code, or up wrote something"
[ -z "$(cluster_left kc-bad)" ] || fail "a hostile spec left: $(cluster_left kc-bad)"
pass "hostile values refused by env and up; nothing ran, nothing written"

# ---- what the nodes could not reach: refused before anything starts ----
cluster_spec kc-noplug 1 "\"AutoResumePlugin\": \"$TMP/nope.so\""
expect_input_error "a missing plugin" "AutoResumePlugin: $TMP/nope.so does not exist" "$K" cluster up "$TMP/kc-noplug.json"
echo 'not a library' >"$TMP/notelf.so"
cluster_spec kc-notelf 1 "\"AutoResumePlugin\": \"$TMP/notelf.so\""
expect_input_error "a plugin that is not a shared object" "plugin $TMP/notelf.so is not a shared object" \
  "$K" cluster up "$TMP/kc-notelf.json"
# a library keel loads from /tmp (LD_LIBRARY_PATH): the nodes' copy of keel would not find it
lib=$(ldd "$K" | awk '/libxxhash/ {print $3}')
mkdir -p "$TMP/lib" && cp "$lib" "$TMP/lib/"
expect_input_error "a library under /tmp" "keel loads $TMP/lib/libxxhash[^ ]*, under /tmp" \
  env LD_LIBRARY_PATH="$TMP/lib" "$K" cluster up "$TMP/kc-notelf.json"
[ ! -e "$CLUSTER_STATE/kc-noplug" ] && [ ! -e "$CLUSTER_STATE/kc-notelf" ] && [ -z "$(cluster_left kc-notelf)" ] ||
  fail "a refused up wrote or left something: $(ls "$CLUSTER_STATE") $(cluster_left kc-notelf)"
pass "unreachable plugin or library refused before anything started"

# ---- a slurmd that cannot start: its log's path and last error, in one line ----
mkdir -p "$TMP/lc-badplug"
cat >"$TMP/lc-badplug/on_create.sh" <<'SH'
# on w2 alone the plugin in StateDir reads as an empty file
[ "$KEEL_NODE_NAME" != w2 ] || mount --bind /dev/null "$(dirname "$KEEL_CLUSTER_SHARED")/lib/keel/keel_auto_resume.so"
SH
cluster_spec kc-badplug 2 '' "$TMP/lc-badplug"
rc=0
"$K" cluster up "$TMP/kc-badplug.json" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" != 0 ] && [ "$(wc -l <"$TMP/err")" = 1 ] && grep -q "slurmd" "$TMP/err" && grep -q "w2" "$TMP/err" &&
  grep -q "its log $CLUSTER_STATE/kc-badplug/nodes/w2/slurmd.log says: .*keel_auto_resume.so: file too short" "$TMP/err" ||
  fail "a slurmd that cannot start: exit $rc, stderr: $(cat "$TMP/err")"
[ -z "$(cluster_left kc-badplug)" ] || fail "a failed up left: $(cluster_left kc-badplug)"
pass "slurmd that cannot start: $(cat "$TMP/err")"

# ---- a lifecycle script that fails on one node: one line, nothing left ----
mkdir -p "$TMP/lc"
cat >"$TMP/lc/on_create.sh" <<'SH'
echo "on_create on $KEEL_NODE_NAME"
[ "$KEEL_NODE_NAME" != w2 ] || { echo "w2 cannot be set up" >&2; exit 3; }
SH
cluster_spec kc-lcfail 2 '"HealthTimeoutS": 30' "$TMP/lc"
rc=0
"$K" cluster up "$TMP/kc-lcfail.json" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && [ "$(wc -l <"$TMP/err")" = 1 ] && grep -q "failed on node w2 (exit 3): w2 cannot be set up" "$TMP/err" ||
  fail "failing on_create: exit $rc, stderr: $(cat "$TMP/err")"
[ -z "$(cluster_left kc-lcfail)" ] || fail "a failed up left: $(cluster_left kc-lcfail)"
pass "failing lifecycle script: $(cat "$TMP/err")"

# ---- a cluster of 2 workers ----
cat >"$TMP/lc/on_create.sh" <<'SH'
set -e
echo "$KEEL_NODE_NAME $KEEL_NODE_ROLE $KEEL_INSTANCE_GROUP $KEEL_CLUSTER_NAME $(hostname)" >>"$KEEL_CLUSTER_SHARED/created"
echo "$KEEL_NODE_NAME" >/tmp/mine
echo "$KEEL_NODE_NAME" >/dev/shm/mine
SH
cluster_spec kc-cli 2 '' "$TMP/lc"
S=$TMP/kc-cli.json
t0=$(date +%s.%N)
"$K" cluster up "$S" 2>"$TMP/up.err" || fail "up: $(cat "$TMP/up.err")"
pass "up in $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s: $(cat "$TMP/up.err")"
"$K" cluster status "$S" >"$TMP/status" || fail "status says not up: $(cat "$TMP/status")"
for n in ctl1 login1 w1 w2; do grep -q "^$n " "$TMP/status" || fail "status lacks $n: $(cat "$TMP/status")"; done
[ "$(grep -c ' idle' "$TMP/status")" = 2 ] || fail "workers not idle: $(cat "$TMP/status")"
eval "$("$K" cluster env "$S")"
[ "$SLURM_CONF" = "$CLUSTER_STATE/kc-cli/slurm.conf" ] && [ "$KEEL_CLUSTER_SHARED" = "$CLUSTER_STATE/kc-cli/fsx" ] ||
  fail "env: SLURM_CONF=$SLURM_CONF KEEL_CLUSTER_SHARED=$KEEL_CLUSTER_SHARED"
# env sets exactly its variables in a bash with nothing else
got=$(env -i /bin/bash --norc --noprofile -c 'eval "$1"; env' _ "$("$K" cluster env "$S")" |
  grep -v -e '^PWD=' -e '^SHLVL=' -e '^_=' | sort | tr '\n' ' ')
[ "$got" = "KEEL_CLUSTER_KEEL=$CLUSTER_STATE/kc-cli/bin/keel KEEL_CLUSTER_SHARED=$CLUSTER_STATE/kc-cli/fsx SLURM_CONF=$CLUSTER_STATE/kc-cli/slurm.conf " ] ||
  fail "eval of env set: $got"
# keel and the plugin where every node sees them, whatever directory this build is in
[ "$KEEL_CLUSTER_KEEL" = "$CLUSTER_STATE/kc-cli/bin/keel" ] && cmp -s "$K" "$KEEL_CLUSTER_KEEL" ||
  fail "the cluster's keel $KEEL_CLUSTER_KEEL is not a copy of $K"
grep -q "^required $CLUSTER_STATE/kc-cli/lib/keel/keel_auto_resume.so health=" "$CLUSTER_STATE/kc-cli/plugstack.conf" ||
  fail "plugstack.conf: $(cat "$CLUSTER_STATE/kc-cli/plugstack.conf")"
"$K" cluster exec "$S" w2 -- "$KEEL_CLUSTER_KEEL" --version >/dev/null || fail "w2 cannot run $KEEL_CLUSTER_KEEL"
pass "env sets exactly SLURM_CONF, KEEL_CLUSTER_SHARED, KEEL_CLUSTER_KEEL; keel and the plugin in StateDir, run on a node"
sort "$KEEL_CLUSTER_SHARED/created" >"$TMP/created"
printf '%s\n' "ctl1 controller ctl kc-cli ctl1" "login1 login login kc-cli login1" "w1 worker w kc-cli w1" \
  "w2 worker w kc-cli w2" | diff - "$TMP/created" >/dev/null || fail "on_create runs: $(cat "$TMP/created")"
pass "on_create ran once per node, with its name, role and group, as its own host"
for n in ctl1 login1 w1 w2; do
  got=$("$K" cluster exec "$S" $n -- sh -c 'echo $(hostname) $(cat /tmp/mine) $(cat /dev/shm/mine) $(ip -4 -o addr show dev eth0 | grep -o "inet [0-9.]*")')
  addr=$(grep "^$n " "$TMP/status" | awk '{print $3}')
  [ "$got" = "$n $n $n inet $addr" ] || fail "node $n: hostname, /tmp, /dev/shm, address: '$got' (want its own, $addr)"
done
[ ! -e /tmp/mine ] && [ ! -e /dev/shm/mine ] || fail "a node's /tmp or /dev/shm is the host's"
pass "each node has its own hostname, /tmp, /dev/shm and address"
rc=0
"$K" cluster exec "$S" w1 -- sh -c 'exit 7' || rc=$?
[ "$rc" = 7 ] || fail "exec: exit code $rc, want the command's 7"
expect_input_error "exec on no such node" "no node 'w9'" "$K" cluster exec "$S" w9 -- true
expect_input_error "up twice" "is up already" "$K" cluster up "$S"
# MPI ranks on two hosts: their only path is the bridge (each node's loopback and /dev/shm are its own)
timeout 120 srun -N2 -n2 --mpi=pmix bash -c 'echo "$(hostname) $(grep eth0 /proc/net/dev | awk "{print \$2}")"' \
  >"$TMP/before" || fail "srun -N2 from the host"
timeout 120 srun -N2 -n2 --mpi=pmix "$KEEL_CLUSTER_KEEL" health --mpi-probe >"$TMP/probe" 2>&1 ||
  fail "MPI across nodes: $(cat "$TMP/probe")"
timeout 120 srun -N2 -n2 bash -c 'echo "$(hostname) $(grep eth0 /proc/net/dev | awk "{print \$2}")"' >"$TMP/after" ||
  fail "srun after"
[ "$(awk '{print $1}' "$TMP/before" | sort | tr '\n' ' ')" = "w1 w2 " ] || fail "srun -N2 ran on $(cat "$TMP/before")"
pass "MPI all-reduce over 2 hosts (keel health --mpi-probe under srun --mpi=pmix); eth0 bytes in: $(sort "$TMP/before" | tr '\n' ' ')-> $(sort "$TMP/after" | tr '\n' ' ')"
"$K" cluster down "$S" 2>"$TMP/down.err" || fail "down: $(cat "$TMP/down.err")"
[ -z "$(cluster_left kc-cli)" ] || fail "down left: $(cluster_left kc-cli)"
! "$K" cluster status "$S" >"$TMP/status" || fail "status after down says up"
grep -q "kc-cli: down" "$TMP/status" || fail "status after down: $(cat "$TMP/status")"
[ -s "$KEEL_CLUSTER_SHARED/created" ] || fail "down removed the shared directory's data"
"$K" cluster down "$S" 2>/dev/null || fail "a second down fails"
pass "down: $(cat "$TMP/down.err"); nothing left; shared data kept"

# ---- slurm-conf for real hosts ----
printf 'head 192.168.7.1 ctl\nsub 192.168.7.2 login\nn1 192.168.7.11 w\nn2 192.168.7.12 w\n' >"$TMP/hosts"
"$K" cluster slurm-conf "$S" --hosts "$TMP/hosts" --out "$TMP/etc" >/dev/null || fail "slurm-conf"
grep -q "^NodeName=n2 NodeAddr=192.168.7.12 " "$TMP/etc/slurm.conf" && grep -q "^SlurmctldHost=head(192.168.7.1)" "$TMP/etc/slurm.conf" ||
  fail "slurm-conf: $(cat "$TMP/etc/slurm.conf")"
expect_input_error "slurm-conf never overwrites" "slurm.conf exists" "$K" cluster slurm-conf "$S" --hosts "$TMP/hosts" --out "$TMP/etc"
expect_input_error "slurm-conf without --hosts" "slurm-conf: --hosts FILE is required" "$K" cluster slurm-conf "$S"
pass "slurm-conf --hosts: $(ls "$TMP/etc" | tr '\n' ' ')"
