/* comm/probe.c: is the network between the ranks sound? An all-reduce of
 * known values checked exactly and timed: `keel health`'s mpi check (a job of
 * its own) and the first collective of a relaunch after a failure. */
#include <math.h>
#include <stdio.h>

#include "keel/comm.h"

bool keel_comm_probe(keel_comm *world, double *bus_gbps, char *detail, size_t detail_n) {
    int rank = keel_comm_rank(world), W = keel_comm_size(world);
    const int64_t n = 4 << 20; /* 16 MB of floats */
    float *x = keel_xmalloc(sizeof(float) * (size_t)n, "mpi probe");
    /* small integers: the sum is exact in any order */
    int64_t bad = 0;
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        for (int64_t i = 0; i < n; i++) x[i] = (float)((rank + 1) * (1 + i % 13));
        keel_comm_barrier(world);
        double t0 = keel_now_s();
        keel_comm_allreduce(world, x, x, n, KEEL_COMM_F32, KEEL_COMM_SUM);
        best = fmin(best, keel_now_s() - t0);
        for (int64_t i = 0; i < n; i++)
            bad += x[i] != (float)((double)W * (W + 1) / 2 * (1 + i % 13));
    }
    keel_free(x);
    double all_bad = (double)bad;
    keel_comm_allreduce_scalar(world, &all_bad, KEEL_COMM_SUM);
    *bus_gbps = W > 1 ? 2.0 * (W - 1) / W * (double)n * 4 / best / 1e9 : 0;
    snprintf(detail, detail_n, "%d rank(s): all-reduce of 16 MB %s, bus bandwidth %.2f GB/s", W,
             all_bad == 0 ? "exact" : "WRONG", *bus_gbps);
    return all_bad == 0;
}
