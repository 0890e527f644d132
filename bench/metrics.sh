#!/usr/bin/env bash
# metrics.sh: what scraping /metrics costs a run. One run of CONFIG on 2
# ranks serves /metrics; the bench scrapes it BENCH_SCRAPES times back to back
# and reads the serving process's (the supervisor's) CPU seconds before and
# after (/proc/PID/stat), then prints the CPU per scrape, the response size,
# and that cost as a share of the run's CPU at the shipped scrape interval
# (deploy/prometheus.yml: 5 s) and at 1 s. Then alternating runs with and
# without a 1-per-second scraper give median step times side by side. Not a
# test.
#
#   bash bench/metrics.sh
#   BENCH_CONFIG=small BENCH_STEPS=12 bash bench/metrics.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config="${BENCH_CONFIG:-tiny}" steps="${BENCH_STEPS:-20}" scrapes="${BENCH_SCRAPES:-200}" rounds="${BENCH_ROUNDS:-2}"
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
tmp="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cfg="$root/configs/$config.json"
cpu_s() { awk '{print ($14 + $15) / '"$(getconf CLK_TCK)"'}' "/proc/$1/stat"; }
median_step() { python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print(statistics.median(r["step_s"] for r in rows))' "$1/metrics.jsonl"; }

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1); load $(cut -d' ' -f1-3 /proc/loadavg)"
"$KEEL_BIN" train "$cfg" --set train.steps=1000000 --set metrics.port="$port" --nproc 2 --run-dir "$tmp/serve" \
    >"$tmp/serve.log" 2>&1 &
sup=$!
for _ in $(seq 1 600); do grep -q '"step":3,' "$tmp/serve/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$port/metrics" >"$tmp/one.txt"
c0=$(cpu_s "$sup") t0=$(date +%s.%N)
for _ in $(seq 1 "$scrapes"); do curl -sf "http://127.0.0.1:$port/metrics" >/dev/null; done
c1=$(cpu_s "$sup") t1=$(date +%s.%N)
step=$(median_step "$tmp/serve")
kill -TERM "$sup"; wait "$sup" || true
python3 - "$c0" "$c1" "$t0" "$t1" "$scrapes" "$(wc -c <"$tmp/one.txt")" "$step" "$(nproc)" <<'PY'
import sys
c0, c1, t0, t1, n, size, step, cores = map(float, sys.argv[1:9])
per = (c1 - c0) / n
print(f"| scrapes | response | supervisor CPU per scrape | wall per scrape | share of the node's CPU at 5 s / 1 s intervals | step (median) |")
print(f"|---|---|---|---|---|---|")
print(f"| {n:.0f} | {size / 1024:.1f} KiB | {per * 1e3:.2f} ms | {(t1 - t0) / n * 1e3:.2f} ms | "
      f"{100 * per / 5 / cores:.4f}% / {100 * per / 1 / cores:.4f}% | {step:.3f} s |")
PY

echo
echo "| round | step without scraping (median) | step with a scrape every second (median) | ratio |"
echo "|---|---|---|---|"
for r in $(seq 1 "$rounds"); do
    "$KEEL_BIN" train "$cfg" --set train.steps="$steps" --set metrics.port=0 --nproc 2 --run-dir "$tmp/off$r" >/dev/null 2>&1
    "$KEEL_BIN" train "$cfg" --set train.steps="$steps" --set metrics.port="$port" --nproc 2 --run-dir "$tmp/on$r" >/dev/null 2>&1 &
    run=$!
    while kill -0 "$run" 2>/dev/null; do curl -sf -o /dev/null "http://127.0.0.1:$port/metrics" || true; sleep 1; done
    wait "$run"
    off=$(median_step "$tmp/off$r") on=$(median_step "$tmp/on$r")
    python3 -c 'import sys; a, b = map(float, sys.argv[2:4]); print(f"| {sys.argv[1]} | {a:.3f} s | {b:.3f} s | {b / a:.3f} |")' "$r" "$off" "$on"
done
