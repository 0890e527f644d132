#!/usr/bin/env bash
# checkpoint.sh: checkpoint cost for configs/small.json on 2 ranks (one thread
# each, micro-batch 1) in one run. Not a test.
#   - synchronous saves (checkpoint.async false): the step loop waits for the
#     write + fsync: save time and GB/s (bytes of all shard files / time);
#   - asynchronous saves (the default): the stall per save (the loop waits
#     only if the background copy into the host buffer outlasts a forward +
#     backward) as a share of the median step time (target < 2%), and how much
#     slower the steps are while a save copies and writes beside them;
#   - load: a resume on 2 ranks (verify checksums + read), time and GB/s.
#
#   bash bench/checkpoint.sh
#   BENCH_CONFIG=tiny BENCH_STEPS=6 bash bench/checkpoint.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${BENCH_CONFIG:-small}"
steps="${BENCH_STEPS:-6}"
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
tmp="$(mktemp -d "${BENCH_TMP:-/tmp}/keel-bench-ckpt.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg); run dir on $(df -h "$tmp" | awk 'NR==2 {print $1}')"
batch=4; [ "$name" = small ] && batch=1
for mode in sync async; do
    async=true; [ $mode = sync ] && async=false
    "$KEEL_BIN" train "$root/configs/$name.json" --nproc 2 --set train.steps="$steps" --set train.threads=1 \
        --set train.micro_batch_size=$batch --set checkpoint.every_steps=2 --set checkpoint.keep_last=0 \
        --set checkpoint.async=$async --run-dir "$tmp/$mode" >"$tmp/log" 2>&1 \
        || { cat "$tmp/log" >&2; echo "bench: $mode run failed" >&2; exit 1; }
done
# load: resume the async run for two more steps
"$KEEL_BIN" train "$root/configs/$name.json" --nproc 2 --set train.steps=$((steps + 2)) --set train.threads=1 \
    --set train.micro_batch_size=$batch --set checkpoint.every_steps=2 --set checkpoint.keep_last=0 \
    --run-dir "$tmp/async" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; echo "bench: resume failed" >&2; exit 1; }
python3 - "$tmp" "$name" <<'PY'
import glob, json, re, statistics, sys
tmp, name = sys.argv[1:]
def rows(d): return [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
def ckpt_bytes(d):
    m = json.load(open(sorted(glob.glob(f"{d}/checkpoints/step_*/manifest.json"))[0]))
    return sum(f["bytes"] for f in m["files"]), len(m["files"])
nbytes, nfiles = ckpt_bytes(f"{tmp}/sync")
print(f"\n{name}, 2 ranks: a checkpoint is {nbytes / 1e9:.2f} GB in {nfiles} shard files\n")
print("| what | per save / load | GB/s | stall share of a step |")
print("|---|---|---|---|")
sync, asyn = rows(f"{tmp}/sync"), rows(f"{tmp}/async")
med = statistics.median
last = max(x["step"] for x in asyn)
busy = [r for r in asyn if r["step"] % 2 == 1 and 1 < r["step"] < last]  # the step after a save
quiet = [r for r in asyn if r["step"] % 2 == 0 and r["step"] < last]
step_s = med(r["step_s"] for r in quiet)
s_sync = [r["ckpt_stall_s"] for r in sync if "ckpt_stall_s" in r]
s_async = [r.get("ckpt_stall_s", 0) + n.get("ckpt_stall_s", 0) for r, n in zip(asyn, asyn[1:])
           if r["step"] % 2 == 0 and r["step"] < last]  # boundary + wait before the next update
print(f"| synchronous save (write + fsync, loop waits) | {med(s_sync):.2f} s | {nbytes / med(s_sync) / 1e9:.2f} | {100 * med(s_sync) / step_s:.1f}% |")
print(f"| asynchronous save: stall (loop waiting on the copy) | {1000 * med(s_async):.1f} ms | - | {100 * med(s_async) / step_s:.2f}% |")
print(f"| asynchronous save: the step beside the copy + write | {med(r['step_s'] for r in busy):.2f} s vs {step_s:.2f} s | - | {100 * (med(r['step_s'] for r in busy) / step_s - 1):+.1f}% step time |")
ev = [json.loads(l) for l in open(f"{tmp}/async/events.jsonl") if '"resumed"' in l][-1]
load_s = float(re.search(r"load_s ([0-9.]+)", ev["detail"]).group(1))
print(f"| load at resume (verify checksums + read, 2 ranks) | {load_s:.2f} s | {nbytes / load_s / 1e9:.2f} | - |")
print(f"\nmedian step without a save in flight: {step_s:.2f} s; the final save is left out (at the end "
      f"of training keel waits for the write and the commit by design)")
PY
