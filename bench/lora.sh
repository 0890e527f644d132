#!/usr/bin/env bash
# lora.sh: a LoRA step against a full fine-tuning step on the same base, data and batch —
# configs/small.json (134M parameters), one process on every core, fp32 and bf16 — in one run.
# Prints the median step time after two warm-up steps, tokens/s, the ratio to the full step,
# the parameters trained and each run's peak RSS (summary.json). The base is a 1-step run's
# checkpoint (its values do not matter for time). Not a test.
#
#   bash bench/lora.sh
#   BENCH_STEPS=8 BENCH_PRECISIONS="fp32" BENCH_LORA="q_proj,v_proj:8 all:16" bash bench/lora.sh
set -euo pipefail
cd "$(dirname "$0")/.."
make keel >/dev/null
K=$PWD/build/keel CFG=$PWD/configs/small.json
steps=${BENCH_STEPS:-8}
precisions=${BENCH_PRECISIONS:-fp32 bf16}
loras=${BENCH_LORA:-q_proj,v_proj:8 all:16}
tmp=$(mktemp -d /tmp/keel-bench-lora.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export KEEL_METRICS_PORT=0
common=(--set train.micro_batch_size=1 --set checkpoint.every_steps=0 --set train.eval_every=0)
"$K" train "$CFG" "${common[@]}" --set train.steps=1 --set checkpoint.every_steps=1 --run-dir "$tmp/base" \
  >"$tmp/base.log" 2>&1 || { tail -3 "$tmp/base.log"; exit 1; }
base=$tmp/base/checkpoints/step_00000001

row() { # NAME PRECISION ARGS...: one run, its row
  local name=$1 p=$2; shift 2
  "$K" train "$CFG" "${common[@]}" --set init_from="$base" --set train.steps="$steps" \
    --set fsdp.mixed_precision="$p" "$@" --run-dir "$tmp/$name-$p" >"$tmp/$name-$p.log" 2>&1 ||
    { tail -3 "$tmp/$name-$p.log"; exit 1; }
  python3 - "$tmp/$name-$p" "$name" "$p" "$tmp/full-$p" <<'PY'
import json, statistics, sys
run, name, p, full = sys.argv[1:5]
def stats(d):
    m = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"step_s"' in l]
    s = json.load(open(f"{d}/summary.json"))
    return statistics.median(x["step_s"] for x in m[2:]), statistics.median(x["tokens_per_s"] for x in m[2:]), s
step, tps, s = stats(run)
ratio = step / stats(full)[0] if name != "full" else 1.0
rss = max(r["peak_rss_bytes"] for r in s["ranks"]) / 2**30
print(f"| {name} | {p} | {s.get('trained_params', s['n_params']):,} | {step:.3f} | {tps:.0f} | {ratio:.2f} | {rss:.2f} |")
PY
}

echo "LoRA against full fine-tuning: configs/small.json, micro-batch 1 x T 512, 1 process, $(nproc) threads,"
echo "$steps steps (median of steps 3-$steps), $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
echo
echo "| run | precision | trained params | step s | tokens/s | step / full | peak RSS GiB |"
echo "|---|---|---|---|---|---|---|"
for p in $precisions; do
  row full "$p"
  for l in $loras; do
    targets=${l%:*} rank=${l#*:}
    [ "$targets" = all ] && targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
    row "lora-r$rank-${targets//,/+}" "$p" --set train.lora.rank="$rank" --set train.lora.alpha=$((2 * rank)) \
      --set train.lora.targets="$targets"
  done
done
