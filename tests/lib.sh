# tests/lib.sh: helpers for keel's script tests (sourced). Each test runs in
# its own temp dir, removed on exit; `fail` prints why and exits non-zero.
set -euo pipefail
: "${KEEL_BIN:?KEEL_BIN must point at the keel binary}"
: "${KEEL_SRC:?KEEL_SRC must point at the source tree}"
TMP=$(mktemp -d /tmp/keel-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok   $*"; }
# json FILE EXPR: evaluate a Python expression on the parsed JSON `j`.
json() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }
# json_line TEXT EXPR: the same on one JSON text (an events.jsonl line).
json_line() { python3 -c "import json,sys; j=json.loads(sys.argv[1]); print($2)" "$1"; }
# survivor_left RUN JOB_OUT NODE: rank 1 on NODE was killed in a Slurm step; the surviving rank,
# stuck in a collective with a dead peer, left at once — naming the lost rank (its watch of the
# others: a peer_lost event, exit 78) or else at its stop deadline (2 steps, at least 2 s) — never
# after Slurm's KillWait (30 s)
survivor_left() {
  local lost
  if grep -q '"event":"peer_lost"' "$1/events.jsonl"; then
    lost=$(grep '"event":"peer_lost"' "$1/events.jsonl" | tail -1)
    [ "$(json_line "$lost" "j['rank']")" = 1 ] && [ "$(json_line "$lost" "j['node']")" = "$3" ] ||
      fail "the surviving rank named another peer: $lost"
  else
    grep -q "did not reach the end of its step in time (a peer gone?)" "$2" ||
      fail "the surviving rank neither named its lost peer nor left at its stop deadline: $(grep -v '^step' "$2" | tail -5)"
  fi
}
# pinned_venv DIR PACKAGE VERSION: a Python venv at DIR holding PACKAGE==VERSION from PyPI
# (the reference a test compares keel with), made once and remade when the installed
# version differs; its python is DIR/bin/python. The package's module is named as it is.
pinned_venv() {
  local venv=$1 pkg=$2 version=$3 base=/usr/bin/python3
  "$venv/bin/python" -c "import $pkg, sys; sys.exit($pkg.__version__ != '$version')" 2>/dev/null && return 0
  [ -x "$base" ] || base=$(command -v python3)
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$base" -m venv "$venv" >"$TMP/venv.log" 2>&1 || fail "cannot make a venv at $venv: $(tail -n 2 "$TMP/venv.log")"
  "$venv/bin/pip" install -q "$pkg==$version" >>"$TMP/venv.log" 2>&1 ||
    fail "pip install $pkg==$version failed: $(tail -n 2 "$TMP/venv.log")"
}
# expect_input_error NAME PATTERN CMD...: CMD must exit 2 with exactly one
# stderr line that matches PATTERN (extended regex).
expect_input_error() {
  local name=$1 pattern=$2; shift 2
  local rc=0
  "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  [ "$rc" = 2 ] || fail "$name: exit code $rc, want 2 (stderr: $(cat "$TMP/err"))"
  [ "$(wc -l <"$TMP/err")" = 1 ] || fail "$name: want one stderr line, got: $(cat "$TMP/err")"
  grep -Eq "$pattern" "$TMP/err" || fail "$name: stderr '$(cat "$TMP/err")' lacks /$pattern/"
  pass "$name: $(cat "$TMP/err")"
}
# Under ASan+UBSan: leaks that are not keel's (OpenMPI's at MPI_Finalize, a
# glibc one in thread start-up) suppressed; keel's are still reported
# (tests/lsan.supp).
if grep -q '^KEEL_SANITIZE:BOOL=ON' "${KEEL_BUILD:-/nonexistent}/CMakeCache.txt" 2>/dev/null; then
  export ASAN_OPTIONS=fast_unwind_on_malloc=0
  export LSAN_OPTIONS=suppressions=$KEEL_SRC/tests/lsan.supp:print_suppressions=0
  export OMPI_MCA_mca_base_component_disable_dlclose=1
fi
# kill_leftovers: every process whose command line names this test's temp
# dir (a supervisor killed by a failing test leaves its launcher and ranks
# running; prometheus, chromium). For EXIT traps of tests that start runs in
# the background.
kill_leftovers() { pkill -9 -f -- "$TMP/" 2>/dev/null || true; }
# mpi_env: the environment of every MPI test — loopback only.
# Under the sanitizers, the leak check of every process that called MPI_Init
# costs 1.5-3 s at its exit (LeakSanitizer matches each of OpenMPI's hundreds
# of leaked allocations against tests/lsan.supp, unwinding and symbolizing
# them): over the suite's rank processes that added up to minutes. So the
# processes of a test that calls mpi_env skip it unless the test sets
# KEEL_MPI_LEAKS=1 first, as train_nproc.sh (the trainer's sharded paths) and
# mpi_collectives.sh (comm) do; the other tests check leaks as before.
mpi_env() {
  : "${KEEL_BUILD:?KEEL_BUILD must point at the build directory}"
  command -v mpirun >/dev/null || fail "mpirun not found: run scripts/install-deps.sh"
  export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
  if [ -n "${ASAN_OPTIONS:-}" ] && [ "${KEEL_MPI_LEAKS:-0}" != 1 ]; then
    export ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0
  fi
}
# hb FIELD RUN RANK: a field (phase, step, start, pid, ...) of a rank's
# heartbeat (RUN/heartbeats/rank-R), empty when there is none yet.
hb() { sed -n "s/.* $1=\([^ ]*\) .*/\1/p" "$2/heartbeats/rank-$3" 2>/dev/null || true; }
# wait_train_step RUN RANK N [NOT_PID]: wait (at most WAIT_STEP_S, default
# 120 s) until the rank has done N steps in a process other than NOT_PID;
# prints its pid. The heartbeat is rewritten in place (pwrite), so a read
# can catch a line mid-write: a step or pid that is not a number is read again.
wait_train_step() {
  local run=$1 rank=$2 n=$3 not=${4:-x} s p
  for _ in $(seq 1 $(( ${WAIT_STEP_S:-120} * 20 ))); do
    s=$(hb step "$run" "$rank"); p=$(hb pid "$run" "$rank")
    if [ "$(hb phase "$run" "$rank")" = train ] && [[ $s =~ ^[0-9]+$ && $p =~ ^[0-9]+$ ]] && [ "$s" -ge "$n" ] &&
       [ "$p" != "$not" ]; then
      echo "$p"; return 0
    fi
    sleep 0.05
  done
  fail "rank $rank of $run never reached step $n (heartbeat: $(cat "$run/heartbeats/rank-$rank" 2>/dev/null))"
}
# segments RUN: RUN's in-memory snapshot segments in /dev/shm (their headers name the run directory)
segments() { grep -l --null -a -- "$(realpath "$1")" /dev/shm/keel-snap-* 2>/dev/null | tr '\0' ' ' || true; }
# event_count RUN TYPE: how many RUN/events.jsonl lines have this event type.
event_count() { grep -c "\"event\":\"$2\"" "$1/events.jsonl" || true; }
# final_loss_near REF RUN STEP WHAT: RUN's last logged loss is at STEP, as REF's, and within the
# resharding tolerance (1e-4 relative) of it; prints an ok line ending in WHAT.
final_loss_near() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" "$4" <<'PY' || fail "the loss left the resharding tolerance"
import json, sys
last = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l][-1]
a, b, step = last(sys.argv[1]), last(sys.argv[2]), int(sys.argv[3])
assert a["step"] == b["step"] == step and abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (a, b)
print(f"ok   final loss {b['loss']:.6f} {sys.argv[4]}, undisturbed {a['loss']:.6f}")
PY
}
