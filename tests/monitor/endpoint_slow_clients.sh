#!/usr/bin/env bash
# The endpoint keeps serving while clients misbehave: 40 clients trickling a
# header byte a second (reconnecting whenever they are cut) never stop a
# scrape — every one of 10 scrapes over 20 s is answered within 2 s — and
# each of them is cut at the request deadline although it never stops
# sending; more connections than the endpoint's slots are refused and then
# served again; the dashboard and /api/run refuse a Host that is not this
# machine's (DNS rebinding) while /metrics answers the name Prometheus
# scrapes by; a bad metrics.allowed_hosts entry is one error line; and
# libmicrohttpd's own messages reach the run's stderr only as keel's
# rate-limited lines.
source "$KEEL_SRC/tests/lib.sh"
cd "$TMP"
cleanup() { kill_leftovers; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

CFG=$KEEL_SRC/tests/train/micro.json
# the suite runs with KEEL_METRICS_PORT=0 (no endpoint): this run names a free port
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE=http://127.0.0.1:$PORT

expect_input_error "a metrics.allowed_hosts entry with a port" \
  '^keel: error: metrics.allowed_hosts entry "node1:9477" is not a host name or an IP address' \
  "$KEEL_BIN" train "$CFG" --set metrics.port="$PORT" --set metrics.allowed_hosts=node1:9477 --run-dir "$TMP/refused"

"$KEEL_BIN" train "$CFG" --set train.steps=1000000 --set train.threads=1 --set metrics.port="$PORT" \
  --set metrics.allowed_hosts=dash.example,10.9.8.7 --run-dir "$TMP/run" >"$TMP/run.out" 2>"$TMP/run.err" &
RUN=$!
wait_train_step "$TMP/run" 0 2 >/dev/null
curl -sf --max-time 10 "$BASE/metrics" >/dev/null || fail "no /metrics on $PORT: $(cat "$TMP/run.err")"

# code HOST PATH: the HTTP status of GET PATH with that Host header
code() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H "Host: $1" "$BASE$2"; }

# 1. Host: the dashboard and its API answer this machine's names only; /metrics any
for path in / /api/run; do
  [ "$(code evil.example "$path")" = 421 ] || fail "GET $path with Host evil.example: $(code evil.example "$path"), want 421"
  [ "$(code "evil.example:$PORT" "$path")" = 421 ] || fail "GET $path with Host evil.example:$PORT is not refused"
  for host in "127.0.0.1:$PORT" "localhost:$PORT" "LOCALHOST" "[::1]:$PORT" "dash.example:8080" "10.9.8.7"; do
    [ "$(code "$host" "$path")" = 200 ] || fail "GET $path with Host $host: $(code "$host" "$path"), want 200"
  done
done
curl -s --max-time 5 -H "Host: evil.example" "$BASE/api/run" | grep -q "not one the dashboard answers to" ||
  fail "the refusal does not say why"
[ "$(code "127.0.0.1:$PORT" /metrics)" = 200 ] || fail "/metrics with Host 127.0.0.1:$PORT is not served"
[ "$(code "node12.cluster.example:$PORT" /metrics)" = 200 ] ||
  fail "/metrics refuses the DNS name a Prometheus scrapes by"
pass "Host evil.example: / and /api/run get 421; localhost, 127.0.0.1, [::1] and metrics.allowed_hosts are" \
  "answered; /metrics answers any Host"

# 2. 40 clients trickle a header byte a second; scrapes are answered throughout
cat >"$TMP/trickle.py" <<'PY'
import json, select, socket, sys, time
port, n, seconds, out = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
# the request line and a header at once, then a header byte a second: never the blank line that ends it
head, trickle = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"X-Slow: " + b"x" * 1000
def connect():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(head)
    return {"sock": s, "opened": time.monotonic(), "sent": 0, "next": time.monotonic() + 1}
clients = [connect() for _ in range(n)]
open(out + ".ready", "w").close()
lifetimes, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    readable, _, _ = select.select([c["sock"] for c in clients], [], [], 0.1)
    now = time.monotonic()
    for i, c in enumerate(clients):
        closed = False
        if c["sock"] in readable:
            try:
                closed = c["sock"].recv(4096) == b""
            except OSError:
                closed = True
        elif now >= c["next"]:
            try:
                c["sock"].send(trickle[c["sent"]:c["sent"] + 1])
                c["sent"] += 1
                c["next"] = now + 1
            except OSError:
                closed = True
        if closed:
            lifetimes.append(now - c["opened"])
            c["sock"].close()
            clients[i] = connect()
json.dump({"cut": len(lifetimes), "longest_s": max(lifetimes, default=0),
           "still_open": len(clients)}, open(out, "w"))
PY
python3 "$TMP/trickle.py" "$PORT" 40 22 "$TMP/trickle.json" &
TRICKLE=$!
for _ in $(seq 1 100); do [ -e "$TMP/trickle.json.ready" ] && break; sleep 0.1; done
[ -e "$TMP/trickle.json.ready" ] || fail "the slow clients did not connect"
worst=0
for i in $(seq 1 10); do
  sleep 2
  got=$(curl -s -o "$TMP/scrape" -w '%{http_code} %{time_total}' --max-time 2 "$BASE/metrics") ||
    fail "scrape $i of 10 was not answered within 2 s while 40 clients trickle (curl: $got)"
  read -r status seconds <<<"$got"
  [ "$status" = 200 ] && grep -q '^keel_step ' "$TMP/scrape" || fail "scrape $i: status $status, $(head -c 200 "$TMP/scrape")"
  worst=$(python3 -c "print(max($worst, $seconds))")
done
wait "$TRICKLE" || fail "the slow clients failed"
cut=$(json "$TMP/trickle.json" 'j["cut"]')
longest=$(json "$TMP/trickle.json" 'j["longest_s"]')
[ "$cut" -ge 40 ] || fail "only $cut slow connections were cut in 22 s: a slow client holds its connection"
python3 -c "import sys; sys.exit(not $longest < 8)" || fail "a slow connection lived ${longest} s, past the deadline"
pass "40 slow clients: 10 of 10 scrapes answered (slowest $worst s); $cut slow connections cut, none older than" \
  "$(printf %.1f "$longest") s"

# 3. more connections than there are slots, held and trickling a header byte
# a second (so libmicrohttpd's idle timeout never frees them, only keel's
# request deadline can): a scrape waiting behind them is answered. The limit
# is generous — a loaded machine may retransmit the scrape's SYN — since
# without the deadline the slots stay held until the flood stops at 60 s.
python3 - "$PORT" "$TMP/flood.ready" "$TMP/flood.stop" <<'PY' &
import os, socket, sys, time
port, ready, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3]
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(160)]
for s in held:
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
open(ready, "w").close()
end = time.monotonic() + 60
while time.monotonic() < end and not os.path.exists(stop):
    time.sleep(1)
    for s in held:
        try:
            s.send(b"x")
        except OSError:
            pass
PY
FLOOD=$!
for _ in $(seq 1 100); do [ -e "$TMP/flood.ready" ] && break; sleep 0.1; done
[ -e "$TMP/flood.ready" ] || fail "the held connections did not connect"
got=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' --max-time 30 "$BASE/metrics") ||
  fail "no answer within 30 s while 160 trickling connections are held (curl: $got)"
touch "$TMP/flood.stop"
[ "${got% *}" = 200 ] || fail "a scrape behind 160 held connections: $got"
wait "$FLOOD" || true
pass "160 trickling connections held, more than the slots: a scrape is answered in ${got#* } s"

kill -TERM "$RUN"
wait "$RUN" || true
# 4. the run's stderr: libmicrohttpd speaks only through keel's log, rate-limited
grep -v '^keel: ' "$TMP/run.err" >"$TMP/raw" || true
[ ! -s "$TMP/raw" ] || fail "lines on the run's stderr that are not keel's: $(head -5 "$TMP/raw")"
grep '^keel: warn: metrics: libmicrohttpd: ' "$TMP/run.err" | sed 's/ (and [0-9]* more like it.*//' | sort |
  uniq -c >"$TMP/mhd_lines"
[ -s "$TMP/mhd_lines" ] || fail "no libmicrohttpd line came through keel's log: $(grep metrics "$TMP/run.err")"
! awk '$1 > 1' "$TMP/mhd_lines" | grep -q . || fail "libmicrohttpd lines not rate-limited: $(cat "$TMP/mhd_lines")"
slow=$(grep -c '^keel: warn: metrics: closed a connection from 127.0.0.1 that sent no whole request within' \
  "$TMP/run.err" || true)
[ "$slow" = 1 ] || fail "want one line about the slow clients, got $slow: $(grep metrics "$TMP/run.err")"
grep -q '^keel: warn: metrics: [0-9]* more like "closed a connection from 127.0.0.1' "$TMP/run.err" ||
  fail "the slow connections held back from the log are not counted at the end: $(grep metrics "$TMP/run.err")"
pass "the run's stderr: only keel lines; libmicrohttpd's and the endpoint's own rate-limited:" \
  "$(grep -c 'keel: warn: metrics' "$TMP/run.err") lines"
