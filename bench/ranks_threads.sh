#!/usr/bin/env bash
# ranks_threads.sh: the FSDP tax on one node — configs/small.json at the same global batch on
# 1 rank x 2 threads (one process, no FSDP) and on 2 ranks x 1 thread (full_shard), fp32 and
# bf16, in one run. Prints tokens/s (median after two warm-up steps), the 2-rank / 1-rank ratio,
# and where the second step's time went on rank 0 (train.profile_steps: that step is left out of
# the median): GEMMs, attention, elementwise kernels (norms, RoPE, SwiGLU, cross-entropy, casts,
# copies), the optimizer (AdamW, the gradient norm), collectives issued, the waits for them, and
# time outside the backend's calls. Not a test.
#
#   bash bench/ranks_threads.sh
#   BENCH_STEPS=8 BENCH_PRECISIONS=fp32 bash bench/ranks_threads.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
steps=${BENCH_STEPS:-6}
precisions=${BENCH_PRECISIONS:-fp32 bf16}
if [ -z "${KEEL_BIN:-}" ]; then
  make -C "$root" keel >/dev/null
  KEEL_BIN="$root/build/keel"
fi
tmp=$(mktemp -d /tmp/keel-bench-ranks.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export KEEL_METRICS_PORT=0
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "configs/small.json, T 512, 2 sequences a step; $steps steps, tok/s the median of steps 3-$steps, step 2 profiled"
echo
printf '| precision | layout | tok/s | vs 1x2 | GEMM | attention | elementwise | optimizer | collectives | waits | outside calls |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|\n'
for p in $precisions; do
  one=""
  for layout in 1x2 2x1; do
    dir=$tmp/$p-$layout
    if [ "$layout" = 1x2 ]; then shape=(--set train.threads=2 --set train.micro_batch_size=2)
    else shape=(--nproc 2 --set train.threads=1 --set train.micro_batch_size=1); fi
    "$KEEL_BIN" train "$root/configs/small.json" "${shape[@]}" --set train.steps="$steps" --set train.profile_steps=1 \
      --set fsdp.mixed_precision="$p" --set checkpoint.every_steps=0 --set train.eval_every=0 --run-dir "$dir" \
      >"$tmp/log" 2>&1 || { tail -5 "$tmp/log" >&2; echo "bench: $p $layout failed" >&2; exit 1; }
    row=$(python3 - "$dir" "$p" "$layout" "$one" <<'PY'
import json, statistics, sys
d, p, layout, one = sys.argv[1:5]
rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"tokens_per_s"' in l]
prof = json.load(open(f"{d}/profile.json"))
tps = statistics.median(r["tokens_per_s"] for r in rows[2:] if r["step"] != prof["first_step"])
def kind(op):
    if op.startswith(("matmul", "gemm")): return "gemm"
    if op.startswith("attention"): return "attention"
    if op in ("adamw_update", "sumsq"): return "optimizer"
    if op == "collective_wait": return "waits"
    if op in ("all_gather", "reduce_scatter", "allreduce", "broadcast"): return "collectives"
    return "elementwise"
share = {k: 0.0 for k in ("gemm", "attention", "elementwise", "optimizer", "collectives", "waits")}
for o in prof["ops"]:
    share[kind(o["op"])] += o["seconds"]
step = prof["step_s"]  # the profiled steps, all of them
cells = [f"{100 * share[k] / step:.1f}%" for k in share] + [f"{100 * prof['outside_calls_s'] / step:.1f}%"]
ratio = f"{tps / float(one):.2f}" if one else "1.00"
print(f"{tps:.1f}\t| {p} | {layout} | {tps:.0f} | {ratio} | " + " | ".join(cells) + " |")
PY
)
    [ -n "$one" ] || one=${row%%$'\t'*}
    echo "${row#*$'\t'}"
  done
done
