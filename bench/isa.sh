#!/usr/bin/env bash
# isa.sh: training tokens/s and MFU at every instruction-set level this CPU
# has (KEEL_MAX_ISA caps keel's kernels; OPENBLAS_CORETYPE=Haswell caps
# OpenBLAS at avx2), for each config, fp32 and bf16 mixed precision, one
# process on every core. MFU is against the run's own yardstick (the peak of
# the level it ran at, cached per machine and level), so a capped run reads
# its MFU against a capped peak. Not a test: numbers only; the machine is
# shared, so rows of one run compare, runs of different days do not.
#
#   bash bench/isa.sh
#   BENCH_RUNS="tiny:12" BENCH_LEVELS="avx2" bash bench/isa.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${BENCH_RUNS:-tiny:12 small:6}"
warmup="${BENCH_WARMUP:-2}"
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# the levels this CPU has, from its flags (a cap above them would run the CPU's own level)
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
levels="${BENCH_LEVELS:-}"
if [ -z "$levels" ]; then
    levels=avx2
    has avx512f avx512bw avx512vl && levels="$levels avx512"
    has avx512_bf16 && levels="$levels avx512_bf16"
    has amx_tile amx_bf16 && levels="$levels amx"
fi
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); levels: $levels; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| config | cap | precision | tok/s (median) | MFU | yardstick GF/s |"
echo "|---|---|---|---|---|---|"
for run in $runs; do
    name=${run%%:*} steps=${run##*:}
    for level in $levels; do
        env=(KEEL_MAX_ISA=$level)
        [ "$level" = avx2 ] && env+=(OPENBLAS_CORETYPE=Haswell)
        for precision in fp32 bf16; do
            dir="$tmp/$name-$level-$precision"
            env "${env[@]}" "$KEEL_BIN" train "$root/configs/$name.json" --set train.steps="$steps" \
                --set fsdp.mixed_precision="$precision" --run-dir "$dir" >"$tmp/log" 2>&1 ||
                { tail -5 "$tmp/log" >&2; echo "bench: $name at $level $precision failed" >&2; exit 1; }
            python3 - "$dir" "$name" "$level" "$precision" "$warmup" <<'PY'
import json, statistics, sys
run, name, level, precision, warmup = sys.argv[1:6]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
rows = rows[int(warmup):] or rows
summary = json.load(open(f"{run}/summary.json"))
tps = statistics.median(r["tokens_per_s"] for r in rows)
mfu = statistics.median(r["mfu"] for r in rows)
print(f"| {name} | {level} | {precision} | {tps:.0f} | {100 * mfu:.1f}% | {summary['peak_flops'] / 1e9:.0f} |")
PY
        done
    done
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
