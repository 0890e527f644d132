#!/usr/bin/env bash
# comm.sh: comm's collective bandwidth at 1, 16 and 64 MB and how much of a
# non-blocking all-reduce hides behind compute, on BENCH_NP ranks (default 2),
# for keel's comm layer and, as the reference, plain MPI called from the main
# thread (same collectives; its non-blocking all-reduce gets no progress
# during compute). Not a test: numbers only.
#
#   bash bench/comm.sh
#   BENCH_NP=4 bash bench/comm.sh
#
# MB is the full buffer: the gathered array (all-gather), the input of
# reduce-scatter, the array of all-reduce. algbw = MB / time; busbw (as in
# nccl-tests) = algbw x (W-1)/W for all-gather and reduce-scatter, x 2(W-1)/W
# for all-reduce. Each time is the median of 7-15 runs of the slowest rank.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
np="${BENCH_NP:-2}"
if [ -z "${KEEL_BUILD:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BUILD="$root/build"
fi

cmake --build "$KEEL_BUILD" --target comm_bench >/dev/null # CMakeLists.txt: linked as keel is

export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_rmaps_base_oversubscribe=1
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for mode in keel raw; do
    mpirun --allow-run-as-root --oversubscribe -np "$np" "$KEEL_BUILD/comm_bench" "$mode" </dev/null
    echo
done
