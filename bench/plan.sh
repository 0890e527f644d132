#!/usr/bin/env bash
# plan.sh: `keel plan` against real runs on this machine. For each case
# (CONFIG:RANKS:STRATEGY[:key=value,...]) it asks `keel plan --device cpu
# --per-node RANKS --json` for the plan, then trains with `keel train
# --nproc RANKS` and prints, side by side, predicted and measured peak RSS
# per rank (summary.json's peak_rss_bytes, the largest rank's) and step time
# (metrics.jsonl's step_s, median over the steps after two warm-up steps),
# with their ratios. The plan is made right before its run, so both see the
# same machine load. Not a test: the machine is shared and step times move;
# two columns say how busy it was: the share of its cores the plan's
# measurement got, and the run's (CPU seconds of the whole run over wall
# seconds x cores, start-up included) — a row where either is well below 1
# ran beside other work.
#
#   bash bench/plan.sh
#   BENCH_CASES="tiny:2:full_shard small:2:no_shard:fsdp.mixed_precision=bf16" bash bench/plan.sh
#   BENCH_CASES="path/to/any.json:2:full_shard:train.steps=3" bash bench/plan.sh   # any config
#   BENCH_CASES="llama2-7b-slice:2:full_shard" BENCH_STEPS=1 bash bench/plan.sh   # 7B-width layer, ~4 min
# (CONFIG is a name under configs/ or a path.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
small="model.max_seq_len=128,train.steps=6"
cases="${BENCH_CASES:-tiny:1:full_shard tiny:2:full_shard tiny:3:full_shard tiny:4:full_shard
  tiny:2:shard_grad_op tiny:2:no_shard tiny:4:hybrid_shard tiny:2:full_shard:fsdp.mixed_precision=bf16
  tiny:2:full_shard:fsdp.activation_checkpointing=true tiny:2:no_shard:checkpoint.every_steps=3
  small:1:full_shard:$small small:2:full_shard:$small small:4:full_shard:$small
  small:2:shard_grad_op:$small small:2:no_shard:$small small:2:full_shard:$small,fsdp.mixed_precision=bf16}"
steps="${BENCH_STEPS:-6}"
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| config | ranks | strategy | settings | plan peak RSS | measured | ratio | plan step | measured (median) | ratio | plan MFU | CPU share: plan / run |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|---|\n'
i=0
for c in $cases; do
    IFS=: read -r config ranks strategy extra <<<"$c"
    path="$config"; [ -f "$path" ] || path="$root/configs/$config.json"
    sets=(--set train.steps="$steps" --set fsdp.strategy="$strategy" --set fsdp.shard_group_size="$ranks")
    IFS=, read -ra more <<<"${extra:-}"
    for kv in "${more[@]}"; do [ -n "$kv" ] && sets+=(--set "$kv"); done
    i=$((i + 1))
    rc=0
    "$KEEL_BIN" plan "$path" "${sets[@]}" --per-node "$ranks" --json >"$tmp/plan.json" 2>"$tmp/plan.err" || rc=$?
    [ "$rc" -le 1 ] || { cat "$tmp/plan.err" >&2; exit 1; }
    /usr/bin/time -f "%e %U %S" -o "$tmp/time" "$KEEL_BIN" train "$path" "${sets[@]}" --nproc "$ranks" \
        --run-dir "$tmp/run$i" >"$tmp/log" 2>&1 ||
        { tail -5 "$tmp/log" >&2; echo "bench: $c failed" >&2; exit 1; }
    python3 - "$tmp/plan.json" "$tmp/run$i" "$config" "$ranks" "$strategy" "${extra:-}" "$tmp/time" "$(nproc)" <<'PY'
import json, statistics, sys
plan_path, run, config, ranks, strategy, extra, timing, cores = sys.argv[1:9]
wall, user, system = map(float, open(timing).read().split()[-3:])
run_share = (user + system) / (wall * int(cores))
plan = json.load(open(plan_path))
e = next(s for s in plan["strategies"] if s["strategy"] == strategy)
summary = json.load(open(f"{run}/summary.json"))
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
rows = rows[min(2, len(rows) - 1):]  # after two warm-up steps
rss = max(r["peak_rss_bytes"] for r in summary["ranks"])
step = statistics.median(r["step_s"] for r in rows)
mib = lambda b: f"{b / 2**20:.0f} MiB"
print(f"| {config.split('/')[-1].removesuffix('.json')} | {ranks} | {strategy} | {extra.replace(',', ' ') or '-'} | "
      f"{mib(e['peak_bytes'])} | {mib(rss)} | {rss / e['peak_bytes']:.3f} | {e['time']['step_s'] * 1e3:.0f} ms | "
      f"{step * 1e3:.0f} ms | {step / e['time']['step_s']:.2f} | {plan['cluster']['mfu']:.2f} | "
      f"{plan['cluster'].get('measured_cpu_share', 0):.2f} / {run_share:.2f} |")
PY
    rm -rf "$tmp/run$i"
done
