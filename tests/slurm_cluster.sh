# tests/slurm_cluster.sh (a fixture, not a test): a real multi-node Slurm cluster on localhost for the
# tests (sourced after tests/lib.sh). Debian's Slurm runs several slurmd on one
# host, each its own node (../shared/notes/slurm-mpi.md): slurm_cluster_start N
# starts slurmctld and nodes n1..nN (auth/none, ~1 s) and exports SLURM_CONF;
# slurm_cluster_stop (also run on exit) stops them; $SLURM_EXTRA_CONF (lines)
# goes at the end of slurm.conf. Each slurmd runs in a mount
# namespace of its own, which its jobs share: node_mount_ro NODE DIR makes DIR
# read-only on that node alone, like a node whose mount went bad.
SLURM_BASE=
slurm_cluster_stop() {
  [ -n "$SLURM_BASE" ] || return 0
  local f
  for f in "$SLURM_BASE"/slurmd-*.pid "$SLURM_BASE"/slurmctld.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  for _ in $(seq 1 100); do
    pgrep -f "$SLURM_BASE/slurm.conf" >/dev/null || break
    sleep 0.1
  done
  pkill -9 -f "$SLURM_BASE/slurm.conf" 2>/dev/null || true
  SLURM_BASE=
}
# SLURM_PORT: a first port for slurmctld and its N nodes, below the kernel's ephemeral
# range (an outgoing connection elsewhere on the machine cannot take it), none listened on.
slurm_free_ports() { # N
  local lo i busy
  lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
  for _ in $(seq 1 50); do
    SLURM_PORT=$(( 10000 + RANDOM % (lo - 10000 - $1 - 1) )) busy=
    for i in $(seq 0 "$1"); do
      [ -z "$(ss -Htan "sport = :$(( SLURM_PORT + i ))")" ] || busy=1
    done
    [ -n "$busy" ] || return 0
  done
  fail "no free ports for Slurm below $lo"
}
slurm_cluster_start() {
  local n=$1
  # a port found free can still be taken before slurmctld binds it: then it exits at once
  # ("Address already in use") and the cluster starts again on other ports
  for _ in 1 2 3; do
    slurm_cluster_try "$n" && return 0
    grep -q 'Address already in use' "$SLURM_BASE/slurmctld.log" 2>/dev/null ||
      fail "slurmctld stopped: $(tail -5 "$SLURM_BASE/slurmctld.log" 2>/dev/null)"
    slurm_cluster_stop
  done
  fail "slurmctld lost its port 3 times"
}
slurm_cluster_try() {
  local n=$1 port i
  slurm_free_ports "$n"
  port=$SLURM_PORT
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
    || fail "Slurm is not installed: run scripts/install-deps.sh (slurmctld slurmd slurm-client)"
  SLURM_BASE=$TMP/slurm
  rm -rf "$SLURM_BASE"
  mkdir -p "$SLURM_BASE/state"
  for i in $(seq 1 "$n"); do mkdir -p "$SLURM_BASE/spool/n$i" "$SLURM_BASE/tmpfs/n$i"; done
  cat >"$SLURM_BASE/slurm.conf" <<CONF
ClusterName=keeltest
SlurmctldHost=localhost
SlurmctldPort=$port
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SLURM_BASE/state
SlurmdSpoolDir=$SLURM_BASE/spool/%n
SlurmctldPidFile=$SLURM_BASE/slurmctld.pid
SlurmdPidFile=$SLURM_BASE/slurmd-%n.pid
SlurmctldLogFile=$SLURM_BASE/slurmctld.log
SlurmdLogFile=$SLURM_BASE/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
TmpFS=$SLURM_BASE/tmpfs/%n
SlurmdTimeout=10
NodeName=n[1-$n] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$(( port + 1 ))-$(( port + n ))] CPUs=4 RealMemory=2000
PartitionName=debug Nodes=n[1-$n] Default=YES MaxTime=INFINITE State=UP
${SLURM_EXTRA_CONF:-}
CONF
  export SLURM_CONF=$SLURM_BASE/slurm.conf
  trap 'slurm_cluster_stop; rm -rf "$TMP"' EXIT
  # A test that ctest kills at its timeout (SIGKILL) runs no EXIT trap, and daemons are no
  # longer in its process tree for ctest to kill: a watcher outside that tree (double fork,
  # its own session) kills them once the test's shell is gone. The path is in its
  # environment, not its command line, so that the pgrep above does not wait on the watcher.
  (KEEL_WATCH_PID=$$ KEEL_WATCH_CONF=$SLURM_CONF setsid sh -c \
    'while kill -0 "$KEEL_WATCH_PID" 2>/dev/null; do sleep 1; done; pkill -9 -f "$KEEL_WATCH_CONF"' \
    </dev/null >/dev/null 2>&1 &)
  slurmctld -c -i -f "$SLURM_CONF" || fail "slurmctld did not start: $(tail -5 "$SLURM_BASE/slurmctld.log" 2>/dev/null)"
  # each node in a mount namespace of its own: a test can break one node's view of the
  # filesystem (a read-only mount) and no other's
  for i in $(seq 1 "$n"); do
    unshare -m --propagation private slurmd -f "$SLURM_CONF" -N "n$i" || fail "slurmd n$i did not start"
  done
  for _ in $(seq 1 200); do
    pgrep -f "slurmctld -c -i -f $SLURM_CONF" >/dev/null || return 1 # it exited: sinfo would wait on it
    [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c idle)" = "$n" ] && return 0
    sleep 0.1
  done
  fail "the Slurm nodes never became idle: $(sinfo -N 2>&1)"
}
# slurm_auto_resume_plugin DIR [CHECKS]: before slurm_cluster_start, put the
# keel_auto_resume plugin ($KEEL_SPANK_PLUGIN) in plugstack.conf with `keel
# health --epilog` as its health program: a node config of CHECKS (JSON list
# items, default "checkpoint_dir") on the node-local directory DIR.
slurm_auto_resume_plugin() {
  : "${KEEL_SPANK_PLUGIN:?KEEL_SPANK_PLUGIN must point at keel_auto_resume.so}"
  mkdir -p "$1"
  echo "{\"checks\": [${2:-\"checkpoint_dir\"}], \"dir\": \"$1\"}" >"$TMP/node.json"
  printf '#!/bin/sh\nexec "%s" health --epilog --node-config "%s"\n' "$KEEL_BIN" "$TMP/node.json" >"$TMP/health.sh"
  chmod +x "$TMP/health.sh"
  echo "required $KEEL_SPANK_PLUGIN health=$TMP/health.sh health_timeout=120" >"$TMP/plugstack.conf"
  export SLURM_EXTRA_CONF="PlugStackConfig=$TMP/plugstack.conf"
}
node_mount_ro() {
  local pid
  pid=$(cat "$SLURM_BASE/slurmd-$1.pid")
  for _ in $(seq 1 50); do # EBUSY while a file there is open for writing
    nsenter -t "$pid" -m sh -c "mountpoint -q '$2' || mount --bind '$2' '$2'; mount -o remount,bind,ro '$2'" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "cannot make $2 read-only on node $1"
}
