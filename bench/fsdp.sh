#!/usr/bin/env bash
# fsdp.sh: keel's FSDP strategies on 2 ranks (one thread each), fp32, for
# configs/tiny.json (batch 4 per rank) and configs/small.json (batch 1 per
# rank) — the shapes and batches of shared/notes/anchors.md — in one run.
# Prints tokens/s, MFU (against the fp32 peak keel measures: one core x 2),
# exposed communication per step (time the leader's compute thread waited on
# gathers and reduce-scatters), persistent fp32 state and peak RSS per rank.
# Medians over the steps after two warm-up steps. Not a test.
#
#   bash bench/fsdp.sh
#   BENCH_RUNS="tiny:8" BENCH_STRATEGIES="full_shard no_shard" bash bench/fsdp.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${BENCH_RUNS:-tiny:8 small:5}"
strategies="${BENCH_STRATEGIES:-full_shard shard_grad_op no_shard hybrid_shard}"
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| config | strategy | ranks | tok/s | MFU | exposed comm / step | step | persistent / rank | peak RSS / rank |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for run in $runs; do
    name=${run%%:*} steps=${run##*:}
    batch=4; [ "$name" = small ] && batch=1
    for strategy in $strategies; do
        dir="$tmp/$name-$strategy"
        "$KEEL_BIN" train "$root/configs/$name.json" --nproc 2 --set train.steps="$steps" \
            --set train.threads=1 --set train.micro_batch_size=$batch --set fsdp.strategy="$strategy" \
            --set fsdp.shard_group_size=2 --run-dir "$dir" >"$tmp/log" 2>&1 \
            || { cat "$tmp/log" >&2; echo "bench: $name $strategy failed" >&2; exit 1; }
        python3 - "$dir" "$name" "$strategy" <<'PY'
import json, statistics, sys
d, name, strategy = sys.argv[1:4]
rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl")][2:]
s = json.load(open(f"{d}/summary.json"))
med = lambda k: statistics.median(r[k] for r in rows)
mib = lambda b: f"{b / 2**20:.0f} MiB"
persistent = max(r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"] for r in s["ranks"])
rss = max(r["peak_rss_bytes"] for r in s["ranks"])
print(f"| {name} | {strategy} | {s['world_size']} | {med('tokens_per_s'):.0f} | {100 * med('mfu'):.1f}% | "
      f"{1000 * med('comm_wait_s'):.0f} ms | {1000 * med('step_s'):.0f} ms | {mib(persistent)} | {mib(rss)} |")
PY
    done
done
echo "bf16 mixed precision: not implemented yet (fp32 only)."
