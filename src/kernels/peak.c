/* kernels/peak.c: the fp32 FLOP/s this machine can do, measured, so MFU is
 * honest on whatever CPU keel runs on (the 2-core VMs here have been Intel
 * with AMX at 460 GF/s and AMD Zen 4 without it at ~225 GF/s). */
#include "keel/kernels.h"

/* GNU vector extension: one 64-byte register of floats. */
typedef float v16 __attribute__((vector_size(64)));

#define CHAINS 12 /* independent FMA chains: > latency x ports on any x86 we run on */

typedef struct {
    int64_t iters;
    float sink[1];
} peak_ctx;

static void fma_chains(peak_ctx *c) {
    v16 acc[CHAINS], x, y;
    for (int l = 0; l < 16; l++) x[l] = 0.999f, y[l] = 1e-3f;
    for (int j = 0; j < CHAINS; j++) acc[j] = x * (float)j;
    for (int64_t i = 0; i < c->iters; i++)
        for (int j = 0; j < CHAINS; j++) acc[j] = acc[j] * x + y;
    v16 s = acc[0];
    for (int j = 1; j < CHAINS; j++) s += acc[j];
    c->sink[0] = s[0]; /* keep the work observable */
}

/* One core is measured and multiplied by the thread count: on these shared
 * VMs a second vCPU's speed swings by +-30% from run to run, and MFU should
 * charge that to keel's run, not move the yardstick. */
double keel_measure_peak_flops(void) {
    peak_ctx c = {.iters = 500000}; /* ~10 ms a run */
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = keel_now_s();
        fma_chains(&c);
        double dt = keel_now_s() - t0;
        double flops = (double)c.iters * CHAINS * 16 * 2;
        if (dt > 0 && flops / dt > best) best = flops / dt;
    }
    return best * keel_pool_threads();
}
