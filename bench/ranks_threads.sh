#!/usr/bin/env bash
# ranks_threads.sh: the FSDP tax on one node — configs/small.json at the same global batch on
# 1 rank x 2 threads (--nproc 1: nothing sharded) and on 2 ranks x 1 thread (--nproc 2: full_shard),
# both under the supervisor with its defaults (in-memory snapshots every step), fp32 and bf16.
# The machine this runs on is shared and its speed drifts by 5-10% from one minute to the
# next, so the two layouts run alternately, BENCH_ROUNDS times, and the ratio quoted is the
# median of each round's 2x1 / 1x2. Prints per precision (and snapshot setting): tokens/s (the
# median over rounds of each run's median after two warm-up steps), the ratio, its range over
# the rounds, and where the second step's time went on rank 0 in the last round
# (train.profile_steps: that step is left out of the median): GEMMs, attention, elementwise
# kernels (norms, RoPE, SwiGLU, cross-entropy, casts, copies), the optimizer (AdamW, the
# gradient norm), collectives issued, the waits for them, time outside the backend's calls,
# and beside them the comm thread's time moving data and the CPU time that took (profile.json's
# comm_thread: the wall time bounds what it takes from the calls on these cores, the CPU time
# is what it took). Not a test.
#
#   bash bench/ranks_threads.sh
#   BENCH_ROUNDS=5 BENCH_PRECISIONS=bf16 BENCH_SNAPSHOTS="on off" bash bench/ranks_threads.sh
#
# BENCH_STEPS (8 a run), BENCH_ROUNDS (3), BENCH_PRECISIONS ("fp32 bf16"), BENCH_SNAPSHOTS
# ("on": resilience.snapshot_every_steps 1, the default; "off": 0), BENCH_SET (more settings for
# every run, e.g. "fsdp.node_windows=false"), KEEL_BIN.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
steps=${BENCH_STEPS:-8}
rounds=${BENCH_ROUNDS:-3}
precisions=${BENCH_PRECISIONS:-fp32 bf16}
snapshots=${BENCH_SNAPSHOTS:-on}
extra=()
for kv in ${BENCH_SET:-}; do extra+=(--set "$kv"); done
if [ -z "${KEEL_BIN:-}" ]; then
  make -C "$root" keel >/dev/null
  KEEL_BIN="$root/build/keel"
fi
tmp=$(mktemp -d /tmp/keel-bench-ranks.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export KEEL_METRICS_PORT=0
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "configs/small.json, T 512, 2 sequences a step; $rounds rounds of 1x2 then 2x1, $steps steps a run${BENCH_SET:+; $BENCH_SET}"
echo
printf '| precision | snapshots | layout | tok/s | 2x1 / 1x2 (range) | GEMM | attention | elementwise | optimizer | collectives | waits | outside calls | comm thread, beside | comm thread, CPU |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n'
for p in $precisions; do
  for snap in $snapshots; do
    every=1; [ "$snap" = on ] || every=0
    for r in $(seq 1 "$rounds"); do
      for layout in 1x2 2x1; do
        if [ "$layout" = 1x2 ]; then shape=(--nproc 1 --set train.threads=2 --set train.micro_batch_size=2)
        else shape=(--nproc 2 --set train.threads=1 --set train.micro_batch_size=1); fi
        "$KEEL_BIN" train "$root/configs/small.json" "${shape[@]}" --set train.steps="$steps" --set train.profile_steps=1 \
          --set fsdp.mixed_precision="$p" --set resilience.snapshot_every_steps=$every --set checkpoint.every_steps=0 \
          --set train.eval_every=0 ${extra[@]+"${extra[@]}"} --run-dir "$tmp/$p-$snap-$layout-$r" >"$tmp/log" 2>&1 ||
          { tail -5 "$tmp/log" >&2; echo "bench: $p $layout failed" >&2; exit 1; }
      done
    done
    python3 - "$tmp" "$p" "$snap" "$rounds" "$root/bench" <<'PY'
import json, statistics, sys
tmp, p, snap, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from profile_shares import cells, shares
def run(layout, r):
    d = f"{tmp}/{p}-{snap}-{layout}-{r}"
    rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"tokens_per_s"' in l]
    prof = json.load(open(f"{d}/profile.json"))
    return statistics.median(x["tokens_per_s"] for x in rows[2:] if x["step"] != prof["first_step"]), prof
tps = {l: [run(l, r)[0] for r in range(1, rounds + 1)] for l in ("1x2", "2x1")}
ratios = sorted(b / a for a, b in zip(tps["1x2"], tps["2x1"]))
for layout in ("1x2", "2x1"):
    ratio = "1.00" if layout == "1x2" else f"**{statistics.median(ratios):.2f}** ({ratios[0]:.2f}-{ratios[-1]:.2f})"
    print(f"| {p} | {snap} | {layout} | {statistics.median(tps[layout]):.0f} | {ratio} | " +
          " | ".join(cells(shares(run(layout, rounds)[1]))) + " |")
PY
  done
done
