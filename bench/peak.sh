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
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2046  # pkg-config prints a word list
${CC:-cc} -std=c17 -O2 -march=x86-64-v3 -Wall -Wextra -Werror -D_GNU_SOURCE \
    -I"$root/include" -I"$root/src" "$root/bench/peak_bench.c" "$KEEL_BUILD/libkeelcore.a" \
    $(pkg-config --cflags --libs ompi-c) -L/usr/lib/x86_64-linux-gnu/openblas-pthread -lopenblas \
    -ldnnl -lgomp -lcjson -lxxhash -lpthread -lm -o "$tmp/peak_bench"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| cap | threads | precision | GEMM path | kernel GF/s | library GF/s | yardstick GF/s |"
echo "|---|---|---|---|---|---|---|"
for level in avx2 avx512 avx512_bf16 amx; do
    env=(KEEL_MAX_ISA=$level)
    [ "$level" = avx2 ] && env+=(OPENBLAS_CORETYPE=Haswell)
    out=$(env "${env[@]}" "$tmp/peak_bench" "${1:-2}" 2>/dev/null)
    # a level above the CPU's runs at the CPU's level: print each level once
    case "$out" in "| $level |"*) echo "$out" ;; esac
done
