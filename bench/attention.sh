#!/usr/bin/env bash
# attention.sh: one layer's causal attention, forward + backward, at T = 512,
# 2048, 4096 (B=1, a Llama 2 7B layer: 32 heads of 128), fp32 and bf16: the
# median time (wall and CPU) and the memory, as a markdown table. Not a test:
# numbers only.
#
#   bash bench/attention.sh                    this tree
#   BEFORE=<rev> bash bench/attention.sh       that revision beside this tree, in
#                                              one run (built in a temporary worktree)
#   BENCH_T="512 2048 4096" BENCH_REPS=3 BENCH_ROUNDS=3 BENCH_THREADS=1 BENCH_SHAPE="B NH NKV HS"
#
# Each configuration runs in its own process (peak RSS is its own) BENCH_REPS
# times after a warm-up, in BENCH_ROUNDS rounds with before and after
# alternating, so that a shared machine's load falls on both alike; a cell is
# the median over the rounds of each process's median.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
cleanup() {
    [ -d "$tmp/before" ] && git -C "$root" worktree remove --force "$tmp/before" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT

# build_bench SRC_ROOT BUILD_DIR OUT: that tree's bench against that tree's library.
build_bench() {
    # shellcheck disable=SC2046  # pkg-config prints a word list
    ${CC:-cc} -std=c17 -O3 -march=x86-64-v3 -Wall -Wextra -Werror -D_GNU_SOURCE -fno-math-errno \
        -I"$1/include" -I"$1/src" "$1/bench/attention_bench.c" "$2/libkeelcore.a" \
        $(pkg-config --cflags --libs ompi-c) -L/usr/lib/x86_64-linux-gnu/openblas-pthread -lopenblas \
        -ldnnl -lgomp -lcjson -lxxhash -lpthread -lm -o "$3"
}

if [ -z "${KEEL_BUILD:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BUILD="$root/build"
fi
build_bench "$root" "$KEEL_BUILD" "$tmp/after"
impls="after"
if [ -n "${BEFORE:-}" ]; then
    git -C "$root" worktree add --detach "$tmp/before" "$BEFORE" >/dev/null 2>&1
    cmake -S "$tmp/before" -B "$tmp/before/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$tmp/before/build" --target keelcore -j 2 >/dev/null
    build_bench "$tmp/before" "$tmp/before/build" "$tmp/before.bin"
    mv "$tmp/before.bin" "$tmp/before_bench"
    impls="before after"
fi
mv "$tmp/after" "$tmp/after_bench"

reps=${BENCH_REPS:-3}
rounds=${BENCH_ROUNDS:-3}
threads=${BENCH_THREADS:-1}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "after: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo '+changes')${BEFORE:+; before: $BEFORE}"
for T in ${BENCH_T:-512 2048 4096}; do
    for dtype in fp32 bf16; do
        for _ in $(seq "$rounds"); do
            for impl in $impls; do
                # shellcheck disable=SC2086  # the shape is a word list
                echo "impl=$impl $("$tmp/${impl}_bench" "$T" "$dtype" "$reps" "$threads" ${BENCH_SHAPE:-})"
            done
        done
    done
done | tee "$tmp/lines" >&2
python3 - "$tmp/lines" <<'PY'
import statistics, sys
rows = [dict(kv.split("=", 1) for kv in line.split()) for line in open(sys.argv[1])]
first = rows[0]
print(f"\nB={first['B']}, NH={first['NH']}, NKV={first['NKV']}, HS={first['HS']}, "
      f"{first['threads']} thread(s); medians over rounds of medians of {first['reps']} runs\n")
impls = list(dict.fromkeys(r["impl"] for r in rows))
both = len(impls) == 2
head = ["T", "dtype"] + [f"{i} ms (CPU)" for i in impls] + (["after/before (CPU)"] if both else [])
head += [f"{i} ms (wall)" for i in impls]
head += [f"{i} kept MiB" for i in impls] + [f"{i} scratch MiB" for i in impls]
head += [f"{i} peak RSS above I/O MiB" for i in impls]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for T in dict.fromkeys(r["T"] for r in rows):
    for dtype in ("fp32", "bf16"):
        got = {i: [r for r in rows if r["T"] == T and r["dtype"] == dtype and r["impl"] == i] for i in impls}
        if not all(got.values()):
            continue
        med = {i: {k: statistics.median(float(r[k]) for r in got[i])
                   for k in ("cpu_ms", "total_ms", "kept_bytes", "scratch_bytes", "peak_above_io_bytes")}
               for i in impls}
        cells = [T, dtype] + [f"{med[i]['cpu_ms']:.0f}" for i in impls]
        if both:
            cells.append(f"{med['after']['cpu_ms'] / med['before']['cpu_ms']:.2f}")
        cells += [f"{med[i]['total_ms']:.0f}" for i in impls]
        cells += [f"{med[i]['kept_bytes'] / 2**20:.2f}" for i in impls]
        cells += [f"{med[i]['scratch_bytes'] / 2**20:.2f}" for i in impls]
        cells += [f"{med[i]['peak_above_io_bytes'] / 2**20:.0f}" for i in impls]
        print("| " + " | ".join(cells) + " |")
PY
