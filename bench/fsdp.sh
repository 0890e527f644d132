#!/usr/bin/env bash
# fsdp.sh: keel's FSDP strategies on 2 ranks (one thread each), fp32 and
# bf16 (fsdp.mixed_precision), for configs/tiny.json (batch 4 per rank) and
# configs/small.json (batch 1 per rank) — the shapes and batches of
# shared/notes/anchors.md — in one run. Prints tokens/s, MFU (against the
# peak keel measures for the run's precision: one core x 2), exposed
# communication per step (time the leader's compute thread waited on gathers
# and reduce-scatters), persistent fp32 state and peak RSS per rank, and peak
# RSS over the budget: persistent state + two gathered units (the
# largest, in the gather's precision) + activations. Medians over the steps
# after two warm-up steps. Not a test.
#
#   bash bench/fsdp.sh
#   BENCH_RUNS="tiny:8" BENCH_STRATEGIES="full_shard no_shard" BENCH_PRECISIONS=bf16 bash bench/fsdp.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${BENCH_RUNS:-tiny:8 small:5}"
strategies="${BENCH_STRATEGIES:-full_shard shard_grad_op no_shard hybrid_shard}"
precisions="${BENCH_PRECISIONS:-fp32 bf16}"
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| config | strategy | precision | ranks | tok/s | MFU | exposed comm / step | step | persistent / rank | peak RSS / rank | RSS / budget |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|\n'
for run in $runs; do
    name=${run%%:*} steps=${run##*:}
    batch=4; [ "$name" = small ] && batch=1
    for strategy in $strategies; do
        for precision in $precisions; do
            dir="$tmp/$name-$strategy-$precision"
            "$KEEL_BIN" train "$root/configs/$name.json" --nproc 2 --set train.steps="$steps" \
                --set train.threads=1 --set train.micro_batch_size=$batch --set fsdp.strategy="$strategy" \
                --set fsdp.shard_group_size=2 --set fsdp.mixed_precision="$precision" --run-dir "$dir" \
                >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; echo "bench: $name $strategy $precision failed" >&2; exit 1; }
            python3 - "$dir" "$name" "$strategy" <<'PY'
import json, statistics, sys
d, name, strategy = sys.argv[1:4]
rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl")][2:]
s = json.load(open(f"{d}/summary.json"))
m = json.load(open(f"{d}/config.json"))["model"]
med = lambda k: statistics.median(r[k] for r in rows)
mib = lambda b: f"{b / 2**20:.0f} MiB"
r = max(s["ranks"], key=lambda r: r["peak_rss_bytes"])
persistent = r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"]
unit = m["vocab_size"] * m["dim"] * (2 if s["mixed_precision"] == "bf16" else 4)  # the largest unit
budget = persistent + 2 * unit + r["activation_bytes"]
print(f"| {name} | {strategy} | {s['mixed_precision']} | {s['world_size']} | {med('tokens_per_s'):.0f} | "
      f"{100 * med('mfu'):.1f}% | {1000 * med('comm_wait_s'):.0f} ms | {1000 * med('step_s'):.0f} ms | "
      f"{mib(persistent)} | {mib(r['peak_rss_bytes'])} | {r['peak_rss_bytes'] / budget:.2f} |")
PY
        done
    done
done
