#!/usr/bin/env bash
# A real Prometheus (Debian's) scrapes a 2-rank run's /metrics every second:
# its query API returns keel_loss and keel_tokens_per_second with values, and
# after a kill -9 of a rank keel_failures_total{cause="crash"} reads 1;
# promtool lints the text; the endpoint listens on 127.0.0.1 only, refuses
# other methods than GET/HEAD; a port in use, a bad bind address and a bad
# KEEL_METRICS_PORT are one-line errors that start nothing. Every query of
# every panel of deploy/grafana-keel.json returns data; headless Chromium
# draws the dashboard (its screenshot is kept in the build's artifacts/);
# keel status and keel plot (SVG and PNG, kept beside it) read the same run;
# a single-process run serves its own endpoint, with DCGM-named gauges of two
# GPUs read through the NVML stand-in library. The values are the run's: every
# scrape Prometheus stored, and the single-process run's /metrics, against
# metrics.jsonl and events.jsonl of the same run, family by family and exactly
# (tests/monitor/exported_values.py; keel_goodput within the bounds of the wall
# time measured around the launch), and the last samples against summary.json.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
command -v prometheus >/dev/null && command -v promtool >/dev/null ||
  fail "prometheus/promtool not found: run scripts/install-deps.sh"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port) prom_port=$(free_port)
[ "$port" != "$prom_port" ] || prom_port=$(free_port)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; kill_leftovers; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=100000 --set checkpoint.every_steps=20 --set resilience.backoff_s=0.1
      --set metrics.port="$port" --nproc 2)
t_launch=$(date +%s.%N)  # the serving process starts after this and before t_announce: keel_goodput's wall time
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 &
sup=$!
pids+=("$sup")
for _ in $(seq 1 100); do grep -q "metrics: http://127.0.0.1:$port/metrics" "$TMP/run.out" && break; sleep 0.1; done
grep -q "metrics: http://127.0.0.1:$port/metrics" "$TMP/run.out" ||
  fail "keel train did not announce its endpoint: $(cat "$TMP/run.out")"
t_announce=$(date +%s.%N)

# the shipped scrape config, pointed at this run's port and scraping every second
sed -e "s/127.0.0.1:9477/127.0.0.1:$port/" -e 's/_interval: 5s/_interval: 1s/' \
  "$KEEL_SRC/deploy/prometheus.yml" >"$TMP/prometheus.yml"
promtool check config "$TMP/prometheus.yml" >/dev/null 2>&1 || fail "deploy/prometheus.yml: $(promtool check config "$TMP/prometheus.yml" 2>&1)"
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$TMP/prometheus.log" 2>&1 &
pids+=("$!")

# query EXPR: the value of the first series of an instant query ("" when none)
query() {
  curl -sf --max-time 5 "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null || true
}
# wait_query EXPR PYTHON_CONDITION_ON_v: poll (60 s) until the value satisfies it
wait_query() {
  local v=""
  for _ in $(seq 1 120); do
    v=$(query "$1")
    if [ -n "$v" ] && python3 -c "import sys; v=float(sys.argv[1]); sys.exit(0 if ($2) else 1)" "$v"; then
      echo "$v"; return 0
    fi
    sleep 0.5
  done
  fail "Prometheus query '$1' never satisfied '$2' (last: '$v'; prometheus log: $(tail -3 "$TMP/prometheus.log"))"
}
loss=$(wait_query 'keel_loss{job="keel"}' 'v > 0')
pass "Prometheus scraped keel_loss = $loss"
tps=$(wait_query 'keel_tokens_per_second{job="keel"}' 'v > 0')
pass "Prometheus scraped keel_tokens_per_second = $tps"
wait_query 'count(keel_rank_step{job="keel"})' 'v == 2' >/dev/null
pass "one keel_rank_step series per rank"
[ "$(query 'keel_failures_total{job="keel",cause="crash"}')" = 0 ] || fail "crash failures before any kill"

curl -sf "http://127.0.0.1:$port/metrics" >"$TMP/metrics.txt" || fail "GET /metrics"
promtool check metrics <"$TMP/metrics.txt" >"$TMP/lint" 2>&1 || fail "promtool check metrics: $(cat "$TMP/lint")"
pass "promtool check metrics: clean ($(grep -c '^# TYPE' "$TMP/metrics.txt") families)"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d x=1 "http://127.0.0.1:$port/metrics")
[ "$code" = 405 ] || fail "POST /metrics answered $code, want 405"
code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "http://127.0.0.1:$port/metrics")
[ "$code" = 405 ] || fail "DELETE /metrics answered $code, want 405"
pass "POST and DELETE refused (405)"
ss -ltnH "sport = :$port" | awk '{print $4}' >"$TMP/listen"
[ "$(cat "$TMP/listen")" = "127.0.0.1:$port" ] || fail "endpoint listens on '$(cat "$TMP/listen")', want 127.0.0.1:$port only"
pass "listens on 127.0.0.1:$port only"

# the same port again: one line, exit 2, no run directory
expect_input_error "port in use" "metrics.port $port on 127.0.0.1 is in use" \
  "$KEEL_BIN" train "$CFG" --set metrics.port="$port" --run-dir "$TMP/second"
[ ! -e "$TMP/second" ] || fail "a run refused for its port left $TMP/second behind"
expect_input_error "bad bind address" 'metrics.bind "nowhere" is not a numeric IP address' \
  "$KEEL_BIN" train "$CFG" --set metrics.port="$port" --set metrics.bind=nowhere --run-dir "$TMP/third"
KEEL_METRICS_PORT=abc expect_input_error "bad KEEL_METRICS_PORT" 'KEEL_METRICS_PORT=abc is not a port' \
  "$KEEL_BIN" train "$CFG" --run-dir "$TMP/fourth"

# a single-process run (no supervisor) serves its own endpoint, here with two
# GPUs read through the NVML stand-in (tests/monitor/nvml_stand_in.c)
solo_port=$(free_port)
t_solo=$(date +%s.%N)
KEEL_NVML_LIB="$KEEL_NVML_STAND_IN" "$KEEL_BIN" train "$CFG" --set train.steps=100000 --set metrics.port="$solo_port" --run-dir "$TMP/solo" \
  >"$TMP/solo.out" 2>&1 &
solo=$!
pids+=("$solo")
got=""
for _ in $(seq 1 300); do
  got=$(curl -sf "http://127.0.0.1:$solo_port/metrics" 2>/dev/null | grep -E '^keel_(loss|rank_step\{rank="0")' || true)
  [ "$(grep -c . <<<"$got")" = 2 ] && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$solo_port/metrics" >"$TMP/solo.txt" || true
t_solo_text=$(date +%s.%N)
kill -TERM "$solo"; wait "$solo" || true
[ "$(grep -c . <<<"$got")" = 2 ] || fail "a single-process run's /metrics lacks keel_loss or rank 0: '$got' ($(tail -3 "$TMP/solo.out"))"
pass "a single-process run serves /metrics itself: $(tr '\n' ' ' <<<"$got")"
# its values are the run's: the metrics.jsonl line it had read, the sums up to it, the events
python3 "$KEEL_SRC/tests/monitor/exported_values.py" text "$TMP/solo.txt" "$TMP/solo" "$t_solo" "$t_solo_text" \
  >"$TMP/values" 2>&1 || fail "a single-process run's /metrics: $(cat "$TMP/values")"
pass "$(cat "$TMP/values")"
# promtool: keel's families clean; DCGM's keep dcgm-exporter's names and labels
# (UUID, modelName, Hostname; counters without _total), which its style lint
# flags exactly as on dcgm-exporter's own endpoint. Anything else fails.
promtool check metrics <"$TMP/solo.txt" >"$TMP/lint" 2>&1 || true
grep -vE "^DCGM_FI_DEV_[A-Z_]+ (label names should be written in 'snake_case' not 'camelCase'|counter metrics should have \"_total\" suffix|metric name should not include type 'counter')$" \
  "$TMP/lint" >"$TMP/lint.other" || true
[ ! -s "$TMP/lint.other" ] || fail "promtool check metrics (with GPUs): $(head -5 "$TMP/lint.other")"
[ "$(grep -c '^DCGM_FI_DEV_GPU_UTIL{gpu="[01]",UUID=' "$TMP/solo.txt")" = 2 ] ||
  fail "no DCGM_FI_DEV_GPU_UTIL for 2 GPUs: $(grep -m3 DCGM "$TMP/solo.txt")"
pass "DCGM-named GPU gauges ($(grep -c '^# TYPE DCGM_FI' "$TMP/solo.txt") families); promtool: only dcgm-exporter's own naming flagged"

# kill -9 a rank: the failure is counted by cause, and the run recovers (then stops on SIGTERM)
pid=$(wait_train_step "$TMP/run" 1 30)
kill -9 "$pid"
crashes=$(wait_query 'keel_failures_total{job="keel",cause="crash"}' 'v == 1')
pass "after kill -9 of rank 1: keel_failures_total{cause=\"crash\"} = $crashes"
wait_query 'keel_restarts_total{job="keel"}' 'v == 1' >/dev/null
wait_query 'keel_recovery_last_seconds{job="keel"}' 'v > 0' >/dev/null
[ "$(query 'keel_failures_total{job="keel",cause="hang"}')" = 0 ] || fail "a kill counted as a hang"
pass "restart and recovery time exported"

# every query of every panel of the shipped Grafana dashboard, against this Prometheus
sleep 3  # a checkpoint after the relaunch, and rate() windows with samples from both launches
python3 - "$KEEL_SRC/deploy/grafana-keel.json" "$prom_port" <<'PY' || fail "Grafana dashboard queries"
import json, sys, urllib.parse, urllib.request
dash, port = json.load(open(sys.argv[1])), sys.argv[2]
# the test run has no validation split (synthetic data): its val loss series is the one allowed to be empty
may_be_empty = {"keel_val_loss"}
bad = []
for panel in dash["panels"]:
    have = 0
    for t in panel["targets"]:
        q = urllib.parse.urlencode({"query": t["expr"]})
        r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{q}", timeout=10))
        if r["status"] != "success":
            bad.append(f"{panel['title']}: {t['expr']}: {r}")
        n = len(r["data"]["result"])
        have += n
        if n == 0 and t["expr"] not in may_be_empty:
            bad.append(f"{panel['title']}: {t['expr']}: no series")
    if have == 0:
        bad.append(f"{panel['title']}: no data at all")
print(f"{len(dash['panels'])} panels, {sum(len(p['targets']) for p in dash['panels'])} queries")
if bad:
    print("\n".join(bad), file=sys.stderr)
    sys.exit(1)
PY
pass "every Grafana panel query returns data from the real run"
# the dashboard in a real browser: the page's script fetched /api/run and drew the series
command -v chromium >/dev/null || fail "chromium not found: run scripts/install-deps.sh"
browse() { timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
  --user-data-dir="$TMP/chromium" --virtual-time-budget=6000 "$@" 2>>"$TMP/chromium.log"; }
browse --dump-dom "http://127.0.0.1:$port/" >"$TMP/dom.html" || fail "chromium --dump-dom: $(tail -3 "$TMP/chromium.log")"
python3 - "$TMP/dom.html" <<'PY' || fail "dashboard DOM: $(head -c 600 "$TMP/dom.html")"
import re, sys
dom = open(sys.argv[1]).read()
points = {m[0]: int(m[1]) for m in re.findall(r'data-series="([^"]+)" data-points="(\d+)"', dom)}
assert points.get("loss", 0) >= 2 and points.get("tokens/s", 0) >= 2, points
table = dom[dom.index('<table id="ranks">'):]
table = table[:table.index("</table>")]
assert table.count("<tr><td>") == 2, "ranks table: a row per rank"
assert "failures <b>crash 1" in dom, "the crash in the summary line"
print(points)
PY
mkdir -p "${KEEL_BUILD:-$TMP}/artifacts"
shot="${KEEL_BUILD:-$TMP}/artifacts/dashboard.png"
browse --window-size=1400,1100 --screenshot="$shot" "http://127.0.0.1:$port/" >/dev/null ||
  fail "chromium --screenshot: $(tail -3 "$TMP/chromium.log")"
[ "$(head -c 8 "$shot" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] && [ "$(stat -c %s "$shot")" -gt 20000 ] ||
  fail "dashboard screenshot $shot is not a PNG of a drawn page"
pass "headless Chromium drew the dashboard (loss and tokens/s series with points, 2 ranks, the crash); screenshot $shot"

# a long run, stopped: SIGTERM saves and exits 75 (resume-me)
kill -TERM "$sup"
rc=0; wait "$sup" || rc=$?
[ "$rc" = 75 ] || { tail -5 "$TMP/run.out"; fail "keel train exit $rc after SIGTERM, want 75"; }
grep -q '"event":"failure","step":[0-9]*,"cause":"crash","rank":1,"node":' "$TMP/run/events.jsonl" ||
  fail "the failure event lacks cause/rank/node fields: $(grep failure "$TMP/run/events.jsonl")"
pass "events.jsonl: the failure carries cause, rank and node"

# every scrape Prometheus stored, family by family, against the run's own record: each
# run family's exact value from metrics.jsonl (the line that scrape had read, the sums up to
# it, keel_goodput from its step times over the serving process's wall time) and events.jsonl
# (a prefix of it near the scrape's time); then the last scrape against summary.json
python3 "$KEEL_SRC/tests/monitor/exported_values.py" prometheus "$prom_port" "$TMP/run" "$t_launch" "$t_announce" \
  >"$TMP/values" 2>&1 || fail "Prometheus' samples: $(cat "$TMP/values")"
pass "$(cat "$TMP/values")"
python3 - "$prom_port" "$TMP/run/summary.json" "$TMP/run/metrics.jsonl" >"$TMP/values" <<'PY' || fail "Prometheus' last samples against summary.json"
import json, sys, urllib.parse, urllib.request
port, summary, metrics = sys.argv[1], json.load(open(sys.argv[2])), [json.loads(l) for l in open(sys.argv[3])]
def last(expr):  # the newest sample Prometheus stored of a series
    q = urllib.parse.urlencode({"query": f"last_over_time({expr}[30m])"})
    r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{q}", timeout=10))["data"]["result"]
    assert len(r) == 1, (expr, r)
    return float(r[0]["value"][1])
restarts, rec_last, rec_median = (last(f'{f}{{job="keel"}}') for f in
                                  ("keel_restarts_total", "keel_recovery_last_seconds", "keel_recovery_median_seconds"))
assert restarts == summary["restarts"] == 1, (restarts, summary["restarts"])
assert rec_last == summary["recovery_s"]["each"][-1] and rec_median == summary["recovery_s"]["median"], \
    (rec_last, rec_median, summary["recovery_s"])
step, tokens = last('keel_step{job="keel"}'), last('keel_tokens_total{job="keel"}')
assert step <= summary["steps"] == metrics[-1]["step"] and tokens <= summary["tokens"] == metrics[-1]["tokens"], \
    (step, tokens, summary["steps"], summary["tokens"])
print(f"restarts {restarts:g}, recovery {rec_last:.3f} s (median {rec_median:.3f}), step {step:g} of {summary['steps']}")
PY
pass "Prometheus' last samples against summary.json: $(cat "$TMP/values")"

# keel status and keel plot read the same run directory
"$KEEL_BIN" status "$TMP/run" >"$TMP/status.txt" || fail "keel status: $(cat "$TMP/status.txt")"
grep -q 'failures: crash 1' "$TMP/status.txt" && [ "$(grep -cE '^ +[01]  ' "$TMP/status.txt")" = 2 ] ||
  fail "keel status: $(cat "$TMP/status.txt")"
"$KEEL_BIN" status "$TMP/run" --json >"$TMP/status.json"
"$KEEL_BIN" plot "$TMP/run" --out "$TMP/plot.svg" || fail "keel plot"
python3 - "$TMP/status.json" "$TMP/plot.svg" <<'PY' || fail "keel plot: $(head -c 400 "$TMP/plot.svg")"
import json, sys, xml.etree.ElementTree as ET
view = json.load(open(sys.argv[1]))
assert len(view["ranks"]) == 2, view["ranks"]
svg = ET.parse(sys.argv[2]).getroot()
ns = "{http://www.w3.org/2000/svg}"
lines = {p.get("data-series"): len(p.get("points").split()) for p in svg.iter(ns + "polyline")}
steps = len(view["steps"]["step"])
assert lines["loss"] == steps and lines["tokens_per_s"] == steps, (lines, steps)
assert any(l.get("class") == "failure" for l in svg.iter(ns + "line")), "no failure marker"
assert any(l.get("class") == "recovery" for l in svg.iter(ns + "line")), "no recovery marker"
print(f"{steps} steps plotted")
PY
pass "keel status: 2 ranks and the crash; keel plot: a valid SVG with every step, the failure and the recovery marked"
# the PNG is the same drawing: loss (blue) above, tokens/s (green) below, and in the
# lower panel only the markers are red (failure) and blue (recovery)
"$KEEL_BIN" plot "$TMP/run" --out "$TMP/plot.png" || fail "keel plot --out .png"
python3 "$KEEL_SRC/tests/monitor/png_colors.py" "$TMP/plot.png" 2563eb dc2626 059669 >"$TMP/png.txt" ||
  fail "keel plot's PNG does not decode: $(cat "$TMP/png.txt")"
read -r width height < "$TMP/png.txt"
read -r _ blue_top blue_low < <(grep ^2563eb "$TMP/png.txt")
read -r _ red_top red_low < <(grep ^dc2626 "$TMP/png.txt")
read -r _ green_top green_low < <(grep ^059669 "$TMP/png.txt")
[ "$width x $height" = "1800 x 1120" ] && [ "$blue_top" -gt 1000 ] && [ "$green_low" -gt 1000 ] && [ "$green_top" = 0 ] &&
  [ "$red_low" -gt 20 ] && [ "$blue_low" -gt 20 ] || fail "keel plot's PNG: $(tr '\n' ' ' <"$TMP/png.txt")"
cp "$TMP/plot.png" "${KEEL_BUILD:-$TMP}/artifacts/plot.png"
pass "keel plot --out .png: ${width}x${height}, loss ${blue_top} px, tokens/s ${green_low} px, failure ${red_low} px and recovery ${blue_low} px markers"
expect_input_error "status of a non-run" "not a run directory" "$KEEL_BIN" status "$TMP/nowhere"
expect_input_error "plot to .jpg" "name an .svg or a .png file" "$KEEL_BIN" plot "$TMP/run" --out "$TMP/plot.jpg"
[ ! -e "$TMP/plot.jpg" ] || fail "a refused plot left $TMP/plot.jpg"
