/* kernels/peak.c: the fp32 FLOP/s this machine can do, measured, so MFU is
 * honest on whatever CPU keel runs on (the 2-core VMs here have been Intel
 * with AMX at 460 GF/s and AMD Zen 4 without it at ~225 GF/s). */
#include <immintrin.h>

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

/* The same with VDPBF16PS (AVX512_BF16): each instruction multiplies 32
 * bf16 pairs and adds them into 16 fp32 lanes, 64 FLOPs. Compiled for that
 * ISA whatever -march says; only called where keel_bf16_native is true. */
__attribute__((target("avx512f,avx512bf16"))) static void dpbf16_chains(peak_ctx *c) {
    __m512 acc[CHAINS];
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f7f), y = (__m512bh)_mm512_set1_epi16(0x3a83);
    for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < c->iters; i++)
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
    __m512 s = acc[0];
    for (int j = 1; j < CHAINS; j++) s = _mm512_add_ps(s, acc[j]);
    c->sink[0] = _mm512_reduce_add_ps(s);
}

/* One core is measured and multiplied by the thread count: on these shared
 * VMs a second vCPU's speed swings by +-30% from run to run, and MFU should
 * charge that to keel's run, not move the yardstick. */
static double measure(void (*kernel)(peak_ctx *), double flops_per_iter) {
    peak_ctx c = {.iters = 500000}; /* ~10 ms a run */
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = keel_now_s();
        kernel(&c);
        double dt = keel_now_s() - t0;
        double flops = (double)c.iters * flops_per_iter;
        if (dt > 0 && flops / dt > best) best = flops / dt;
    }
    return best * keel_pool_threads();
}

double keel_measure_peak_flops(void) { return measure(fma_chains, CHAINS * 16 * 2); }

double keel_measure_peak_flops_bf16(void) {
    /* emulated bf16 GEMMs are fp32 GEMMs */
    return keel_bf16_native(NULL) ? measure(dpbf16_chains, CHAINS * 64) : keel_measure_peak_flops();
}
