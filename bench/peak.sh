#!/usr/bin/env bash
# peak.sh: the MFU yardstick at every instruction-set level this CPU has
# (KEEL_MAX_ISA; OPENBLAS_CORETYPE=Haswell at avx2): the kernel of the level
# (one core's best x threads), the GEMM library's own rate on the same
# threads, and the yardstick (the higher). Not a test: numbers only.
#
#   bash bench/peak.sh [THREADS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${KEEL_BUILD:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BUILD="$root/build"
fi
cmake --build "$KEEL_BUILD" --target peak_bench >/dev/null # CMakeLists.txt: linked as keel is
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| cap | threads | precision | GEMM path | kernel GF/s | library GF/s | yardstick GF/s |"
echo "|---|---|---|---|---|---|---|"
for level in avx2 avx512 avx512_bf16 amx; do
    env=(KEEL_MAX_ISA=$level)
    [ "$level" = avx2 ] && env+=(OPENBLAS_CORETYPE=Haswell)
    out=$(env "${env[@]}" "$KEEL_BUILD/peak_bench" "${1:-2}" 2>/dev/null)
    # a level above the CPU's runs at the CPU's level: print each level once
    case "$out" in "| $level |"*) echo "$out" ;; esac
done
