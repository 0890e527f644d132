#!/usr/bin/env bash
# A metrics port the user never set never stops a run: with the default port
# busy, a run moves to the next free port of the default range, says which in
# its log, in RUN/endpoint.json and in `keel status`, and serves /metrics
# there; two runs side by side both serve, on different ports; with the whole
# range busy a run warns once and trains without an endpoint. A port the user
# set (--set, a config file, $KEEL_METRICS_PORT) that is busy is one error
# line, exit 2, naming where it was set. Under --nproc the supervisor serves. The test never needs the default
# port for itself: it occupies what it must of the range and works with the
# rest, and skips (77) only when others hold nearly all of it.
source "$KEEL_SRC/tests/lib.sh"
cd "$TMP"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; kill_leftovers; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

CFG=$KEEL_SRC/tests/train/micro.json
live=(--set train.steps=100000 --set train.threads=1)
# the default range, as keel documents it in metrics.port's help
FIRST="" LAST=""
read -r FIRST LAST < <(env -u KEEL_METRICS_PORT "$KEEL_BIN" config keys |
  sed -n 's/^| `metrics.port` .*first free one of \([0-9]*\)-\([0-9]*\).*/\1 \2/p') || true
[[ $FIRST =~ ^[0-9]+$ && $LAST =~ ^[0-9]+$ ]] || fail "no default port range in metrics.port's help"

# hold NAME PORT...: a process listening on 127.0.0.1 on each PORT it can bind
# (0: one the kernel picks); sets HELD to the ports it got and HOLDER to its pid.
cat >"$TMP/hold.py" <<'PY'
import os, socket, sys, time
held, socks = [], []
for p in map(int, sys.argv[2:]):
    s = socket.socket()
    # as keel does: a port whose connections linger in TIME_WAIT is free
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p))
        s.listen()
    except OSError:
        s.close()
        continue
    socks.append(s)
    held.append(s.getsockname()[1])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(" ".join(map(str, held)) + "\n")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(3600)
PY
hold() {
  local name=$1; shift
  python3 "$TMP/hold.py" "$TMP/$name.held" "$@" &
  HOLDER=$!
  pids+=("$HOLDER")
  for _ in $(seq 1 100); do [ -e "$TMP/$name.held" ] && break; sleep 0.1; done
  [ -e "$TMP/$name.held" ] || fail "the port holder did not start"
  HELD=$(cat "$TMP/$name.held")
}
release() { kill -9 "$HOLDER"; wait "$HOLDER" 2>/dev/null || true; }
# free_in_range: how many ports of the range nobody listens on now
free_in_range() {
  python3 - "$FIRST" "$LAST" <<'PY'
import socket, sys
n = 0
for p in range(int(sys.argv[1]), int(sys.argv[2]) + 1):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p)); n += 1
    except OSError:
        pass
    s.close()
print(n)
PY
}
free=$(free_in_range)
if [ "$free" -lt 2 ]; then
  echo "SKIP: only $free port(s) of $FIRST-$LAST are free on this machine (others listen on the rest):" \
    "the default port's fallback needs two"
  exit 77
fi

# start NAME ARGS...: a keel run without metrics.port in the background; sets PID
start() {
  local name=$1; shift
  env -u KEEL_METRICS_PORT "$KEEL_BIN" train "$CFG" "$@" --run-dir "$TMP/$name" >"$TMP/$name.out" 2>&1 &
  PID=$!
  pids+=("$PID")
}
# served NAME: the port RUN/endpoint.json names (waits for it, 60 s)
served() {
  for _ in $(seq 1 600); do
    [ -s "$TMP/$1/endpoint.json" ] && break
    sleep 0.1
  done
  [ -s "$TMP/$1/endpoint.json" ] || fail "$1: no endpoint.json ($(cat "$TMP/$1.out"))"
  json "$TMP/$1/endpoint.json" 'j["port"]'
}
# check_served NAME PORT PID: its log, endpoint.json (served by PID) and keel status name the URL,
# /metrics answers there
check_served() {
  local name=$1 port=$2 pid=$3 url="http://127.0.0.1:$2/metrics"
  [ "$port" -ge "$FIRST" ] && [ "$port" -le "$LAST" ] || fail "$name serves on $port, outside $FIRST-$LAST"
  [ "$(json "$TMP/$name/endpoint.json" 'j["url"]')" = "$url" ] || fail "$name: endpoint.json: $(cat "$TMP/$name/endpoint.json")"
  [ "$(json "$TMP/$name/endpoint.json" 'j["pid"]')" = "$pid" ] ||
    fail "$name: endpoint.json names another pid than $pid's: $(cat "$TMP/$name/endpoint.json")"
  grep -q "metrics: $url" "$TMP/$name.out" || fail "$name's log does not say $url: $(head -3 "$TMP/$name.out")"
  "$KEEL_BIN" status "$TMP/$name" >"$TMP/status" || fail "keel status $name"
  grep -q "^endpoint $url" "$TMP/status" || fail "keel status $name does not name $url: $(head -3 "$TMP/status")"
  curl -sf --max-time 10 "$url" >"$TMP/scrape" || fail "GET $url"
  grep -Eq '^keel_step [1-9]' "$TMP/scrape" || fail "$url has no keel_step: $(head -5 "$TMP/scrape")"
}
# stop NAME PID: SIGTERM, wait; the run's endpoint.json goes with its server
stop() {
  kill -TERM "$2"
  wait "$2" || true
  [ ! -e "$TMP/$1/endpoint.json" ] || fail "$1 stopped serving and left endpoint.json behind"
}

# 1. the default port busy: the run moves on, says where, and serves there
hold first "$FIRST"
busy_by=$([ -n "$HELD" ] && echo "this test" || echo "another process")
start moved "${live[@]}"
wait_train_step "$TMP/moved" 0 2 >/dev/null
port=$(served moved)
[ "$port" != "$FIRST" ] || fail "the run serves on the busy default port $FIRST"
check_served moved "$port" "$PID"
grep -q "(port $FIRST is in use: an unset metrics.port takes the first free one of $FIRST-$LAST)" "$TMP/moved.out" ||
  fail "the log does not say why the port moved: $(head -2 "$TMP/moved.out")"
pass "default port $FIRST busy ($busy_by): the run trains and serves on $port (log, endpoint.json, keel status, /metrics)"
stop moved "$PID"
pass "endpoint.json removed when the run stops"
release

# 2. a busy port the user set: one line, exit 2, naming where it was set; nothing written
hold mine 0
mine=$HELD
expect_input_error "busy port by --set" "^keel: error: metrics.port $mine on 127.0.0.1 is in use .*from --set" \
  env -u KEEL_METRICS_PORT "$KEEL_BIN" train "$CFG" --set metrics.port="$mine" --run-dir "$TMP/refused"
expect_input_error "busy port from \$KEEL_METRICS_PORT" \
  "^keel: error: metrics.port $mine on 127.0.0.1 is in use .*from \\\$KEEL_METRICS_PORT" \
  env KEEL_METRICS_PORT="$mine" "$KEEL_BIN" train "$CFG" --run-dir "$TMP/refused"
python3 - "$CFG" "$TMP/port.json" "$mine" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["metrics"] = {"port": int(sys.argv[3])}
json.dump(c, open(sys.argv[2], "w"))
PY
expect_input_error "busy port in the config" "^keel: error: metrics.port $mine on 127.0.0.1 is in use .*set in $TMP/port.json" \
  env -u KEEL_METRICS_PORT "$KEEL_BIN" train "$TMP/port.json" --run-dir "$TMP/refused"
[ ! -e "$TMP/refused" ] || fail "a run refused for its port left $TMP/refused behind"
release

# 3. two runs side by side, neither with a port: both train, on different ports
start left "${live[@]}"
left=$PID
start right "${live[@]}"
right=$PID
wait_train_step "$TMP/left" 0 2 >/dev/null
wait_train_step "$TMP/right" 0 2 >/dev/null
lport=$(served left) rport=$(served right)
[ "$lport" != "$rport" ] || fail "two runs both claim port $lport"
check_served left "$lport" "$left"
check_served right "$rport" "$right"
pass "two runs side by side serve on $lport and $rport"
stop left "$left"
stop right "$right"

# 4. under --nproc the supervisor serves, and names itself in the run directory
mpi_env
start ranks "${live[@]}" --nproc 2
sup=$PID
wait_train_step "$TMP/ranks" 1 2 >/dev/null
port=$(served ranks)
check_served ranks "$port" "$sup"
pass "keel train --nproc 2: the supervisor (pid $sup) serves on $port"
stop ranks "$sup"

# 5. the whole range busy: one warning, and the run trains without an endpoint
hold all $(seq "$FIRST" "$LAST")
rc=0
env -u KEEL_METRICS_PORT "$KEEL_BIN" train "$CFG" --set train.steps=3 --run-dir "$TMP/none" >"$TMP/none.out" 2>"$TMP/none.err" || rc=$?
if grep -q "info: metrics: http" "$TMP/none.err"; then
  echo "note: another process freed a port of $FIRST-$LAST meanwhile and the run served there: $(grep -m1 'metrics:' "$TMP/none.err")"
else
  [ "$rc" = 0 ] || fail "a run with every port of $FIRST-$LAST busy exited $rc: $(cat "$TMP/none.err")"
  [ "$(json "$TMP/none/summary.json" 'j["status"]')" = completed ] || fail "the run without an endpoint did not complete"
  grep -E 'metrics|error' "$TMP/none.err" >"$TMP/none.lines" || true
  [ "$(wc -l <"$TMP/none.lines")" = 1 ] || fail "want one line about the endpoint, got: $(cat "$TMP/none.lines")"
  grep -q "^keel: warn: metrics: ports $FIRST-$LAST on 127.0.0.1 are all in use: this run trains without a metrics endpoint" \
    "$TMP/none.lines" || fail "the warning: $(cat "$TMP/none.lines")"
  [ ! -e "$TMP/none/endpoint.json" ] || fail "a run without an endpoint wrote endpoint.json"
  pass "all of $FIRST-$LAST busy, the run trains without an endpoint: $(cat "$TMP/none.lines")"
fi
release
