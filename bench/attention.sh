#!/usr/bin/env bash
# attention.sh: one layer of causal attention on one thread, fp32 (OpenBLAS)
# against bf16 (the AVX512_BF16 products of fsdp.mixed_precision bf16), at the
# small config's shape or the one given. Not a test: numbers only.
#
#   bash bench/attention.sh
#   BENCH_SHAPE="B T NH NKV HS REPS" bash bench/attention.sh   (e.g. "4 256 8 8 64 20")
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${KEEL_BUILD:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BUILD="$root/build"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2046  # pkg-config prints a word list
${CC:-cc} -std=c17 -O3 -march=native -Wall -Wextra -Werror -D_GNU_SOURCE -fno-math-errno \
    -I"$root/include" -I"$root/src" "$root/bench/attention_bench.c" "$KEEL_BUILD/libkeelcore.a" \
    $(pkg-config --cflags --libs ompi-c) -L/usr/lib/x86_64-linux-gnu/openblas-pthread -lopenblas \
    -ldnnl -lgomp -lcjson -lxxhash -lpthread -lm -o "$tmp/attention_bench"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
# shellcheck disable=SC2086  # the shape is a word list
"$tmp/attention_bench" ${BENCH_SHAPE:-}
