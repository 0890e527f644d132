/* bench/comm_bench.c: comm's collective bandwidth and compute/comm overlap
 * (run by bench/comm.sh under mpirun). `comm_bench keel` measures keel's comm
 * layer; `comm_bench raw` the same collectives called straight from the main
 * thread with plain MPI (no comm thread, no peer-arrival barrier), for the
 * cost of keel's machinery. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/comm.h"

typedef enum { ALLGATHER, REDUCE_SCATTER, ALLREDUCE } coll;
static const char *COLL_NAMES[] = {"all-gather", "reduce-scatter", "all-reduce"};

static bool g_raw;
static keel_comm *g_world;
static int g_rank, g_size;

static void run(coll kind, void *send, void *recv, size_t total, keel_comm_dtype dt) {
    size_t chunk = total / (size_t)g_size;
    if (g_raw) {
        MPI_Datatype t = dt == KEEL_COMM_F32 ? MPI_FLOAT : MPI_UINT16_T;
        KEEL_CHECK(dt == KEEL_COMM_F32 || kind == ALLGATHER, "raw bf16 reductions not measured");
        if (kind == ALLGATHER)
            MPI_Allgather(send, (int)chunk, t, recv, (int)chunk, t, MPI_COMM_WORLD);
        if (kind == REDUCE_SCATTER)
            MPI_Reduce_scatter_block(send, recv, (int)chunk, t, MPI_SUM, MPI_COMM_WORLD);
        if (kind == ALLREDUCE)
            MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)total, t, MPI_SUM,
                          MPI_COMM_WORLD);
        return;
    }
    if (kind == ALLGATHER) keel_comm_allgather(g_world, send, recv, chunk, dt);
    if (kind == REDUCE_SCATTER)
        keel_comm_reduce_scatter(g_world, send, recv, chunk, dt, KEEL_COMM_SUM);
    if (kind == ALLREDUCE) keel_comm_allreduce(g_world, send, recv, total, dt, KEEL_COMM_SUM);
}

static void barrier(void) {
    if (g_raw) MPI_Barrier(MPI_COMM_WORLD);
    else keel_comm_barrier(g_world);
}

static double max_over_ranks(double v) {
    if (g_raw) MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    else keel_comm_allreduce_scalar(g_world, &v, KEEL_COMM_MAX);
    return v;
}

/* Median over iterations of the slowest rank's time. */
static double time_coll(coll kind, void *send, void *recv, size_t total, keel_comm_dtype dt,
                        int iters) {
    double *t = malloc((size_t)iters * sizeof *t);
    run(kind, send, recv, total, dt); /* warm-up: page faults, MPI's registration caches */
    for (int i = 0; i < iters; i++) {
        barrier();
        double t0 = keel_now_s();
        run(kind, send, recv, total, dt);
        t[i] = max_over_ranks(keel_now_s() - t0);
    }
    double median = keel_median(t, iters);
    free(t);
    return median;
}

static void bandwidth_table(void) {
    const int sizes_mb[] = {1, 16, 64};
    if (g_rank == 0)
        printf("%-22s %7s %10s %12s %12s\n", "collective", "MB", "ms", "algbw GB/s",
               "busbw GB/s");
    for (size_t s = 0; s < sizeof sizes_mb / sizeof sizes_mb[0]; s++) {
        size_t bytes = (size_t)sizes_mb[s] << 20;
        void *a = malloc(bytes), *b = malloc(bytes);
        memset(a, 0, bytes);
        memset(b, 0, bytes);
        int iters = sizes_mb[s] >= 64 ? 7 : 15;
        for (int dti = 0; dti < (g_raw ? 1 : 2); dti++) {
            keel_comm_dtype dt = dti ? KEEL_COMM_BF16 : KEEL_COMM_F32;
            for (coll k = ALLGATHER; k <= ALLREDUCE; k++) {
                if (dt == KEEL_COMM_BF16 && k == ALLREDUCE) continue;
                size_t total = bytes / keel_comm_dtype_size(dt);
                total -= total % (size_t)g_size;
                double t = time_coll(k, a, b, total, dt, iters);
                double algbw = (double)bytes / t / 1e9;
                double factor = (double)(g_size - 1) / g_size * (k == ALLREDUCE ? 2 : 1);
                if (g_rank == 0) {
                    char name[32];
                    snprintf(name, sizeof name, "%s %s", COLL_NAMES[k],
                             dt == KEEL_COMM_F32 ? "f32" : "bf16");
                    printf("%-22s %7d %10.2f %12.2f %12.2f\n", name, sizes_mb[s], t * 1e3, algbw,
                           algbw * factor);
                }
            }
        }
        free(a);
        free(b);
    }
}

/* Latency of a one-double all-reduce: thread hand-off and arrival barrier. */
static void latency(void) {
    double v = 1, *t = malloc(200 * sizeof *t);
    for (int i = 0; i < 200; i++) {
        barrier();
        double t0 = keel_now_s();
        if (g_raw) MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        else keel_comm_allreduce_scalar(g_world, &v, KEEL_COMM_SUM);
        t[i] = keel_now_s() - t0;
    }
    keel_median(t, 200); /* sorts */
    if (g_rank == 0) printf("scalar all-reduce latency: median %.1f µs, p90 %.1f µs\n",
                            t[100] * 1e6, t[180] * 1e6);
    free(t);
}

/* ---- overlap --------------------------------------------------------------- */

static void sleep_s(double seconds) {
    struct timespec ts = {.tv_sec = (time_t)seconds,
                          .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {}
}

static volatile float g_sink;

/* Single-threaded busy compute for about `seconds` (calibrated FMA loop). */
static void busy(long iters) {
    float x[16];
    for (int j = 0; j < 16; j++) x[j] = 1.0f + j * 1e-3f;
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++) x[j] = x[j] * 0.999999f + 1e-7f;
    float s = 0;
    for (int j = 0; j < 16; j++) s += x[j];
    g_sink = s;
}

static long calibrate_busy(double seconds) {
    long iters = 100000;
    for (;;) {
        double t0 = keel_now_s();
        busy(iters);
        double t = keel_now_s() - t0;
        if (t > 0.02) return (long)((double)iters * seconds / t);
        iters *= 4;
    }
}

/* Issue a 64 MB all-reduce, compute for ~2x its standalone time, wait (raw:
 * MPI_Iallreduce, then MPI_Wait after the compute, nothing in between).
 * hidden = how much of the all-reduce's standalone time did not show up in
 * the total (1 = fully overlapped); slowdown = compute time with the
 * all-reduce in flight over compute time alone. */
static void overlap(void) {
    size_t total = (64u << 20) / sizeof(float);
    float *buf = malloc(total * sizeof *buf);
    for (size_t i = 0; i < total; i++) buf[i] = 0;
    double T = time_coll(ALLREDUCE, buf, buf, total, KEEL_COMM_F32, 5);
    double compute_s = 2 * T;
    long iters = calibrate_busy(compute_s);
    for (int mode = 0; mode < 2; mode++) { /* 0: sleep, 1: busy compute */
        double alone = 0, totals = 0, computes = 0;
        const int reps = 5;
        for (int r = 0; r < reps; r++) {
            barrier();
            double t0 = keel_now_s();
            if (mode) busy(iters);
            else sleep_s(compute_s);
            alone += keel_now_s() - t0;
            barrier();
            t0 = keel_now_s();
            keel_comm_req *req = NULL;
            MPI_Request mpi_req = MPI_REQUEST_NULL;
            if (g_raw)
                MPI_Iallreduce(MPI_IN_PLACE, buf, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                               &mpi_req);
            else
                keel_comm_iallreduce(g_world, buf, buf, total, KEEL_COMM_F32, KEEL_COMM_SUM, &req);
            double tc = keel_now_s();
            if (mode) busy(iters);
            else sleep_s(compute_s);
            computes += keel_now_s() - tc;
            if (g_raw) MPI_Wait(&mpi_req, MPI_STATUS_IGNORE);
            else keel_comm_wait(req);
            totals += keel_now_s() - t0;
        }
        alone /= reps, totals /= reps, computes /= reps;
        double hidden = (T + alone - totals) / T;
        double worst_hidden = -max_over_ranks(-hidden);
        if (g_rank == 0)
            printf("overlap, %s compute: all-reduce 64 MB alone %.1f ms, compute alone %.1f ms, "
                   "both %.1f ms -> %.0f%% of the all-reduce hidden (worst rank %.0f%%), "
                   "compute slowed %.2fx\n",
                   mode ? "busy (1 thread)" : "sleep", T * 1e3, alone * 1e3, totals * 1e3,
                   100 * hidden, 100 * worst_hidden, computes / alone);
    }
    free(buf);
}

int main(int argc, char **argv) {
    g_raw = argc > 1 && strcmp(argv[1], "raw") == 0;
    if (g_raw) {
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    } else {
        if (keel_comm_init(&g_world) != KEEL_OK) return 1;
        g_rank = keel_comm_rank(g_world);
        g_size = keel_comm_size(g_world);
    }
    if (g_rank == 0)
        printf("== %s, %d ranks ==\n", g_raw ? "plain MPI from the main thread (reference)"
                                             : "keel comm (comm thread)", g_size);
    bandwidth_table();
    latency();
    overlap();
    if (!g_raw) {
        keel_comm_stats st;
        keel_comm_get_stats(g_world, &st);
        if (g_rank == 0)
            printf("rank 0 comm thread: %llu ops, %.2f s transferring, %.2f s waiting for "
                   "peers\n", (unsigned long long)st.ops, st.transfer_s, st.peer_wait_s);
        keel_comm_finalize(g_world);
    } else {
        MPI_Finalize();
    }
    return 0;
}
