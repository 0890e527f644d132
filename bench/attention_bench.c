/* attention_bench.c: one layer of causal attention, forward + backward, at one
 * shape and precision: time (median of `reps` runs after one warm-up) and
 * memory (what forward keeps for backward, the backward's own scratch, and
 * the process's peak RSS above its inputs and outputs). Time is wall clock
 * and the process's CPU time: on a machine shared with other work the CPU
 * time of a 1-thread run moves far less than the wall clock. One configuration a
 * process, so that peak RSS belongs to it. Run by bench/attention.sh, which
 * prints the table; the output is one line of key=value pairs.
 *
 *   attention_bench T fp32|bf16 [reps [threads [B NH NKV HS]]]
 *   (defaults: 5 reps, 1 thread, B=1, a Llama 2 7B layer: 32 heads of 128) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/kernels.h"

static float *rand_vec(int64_t n) {
    float *x = keel_xmalloc(sizeof(float) * (size_t)n, "bench input");
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    return x;
}

/* VmRSS of this process in bytes. */
static uint64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = strtoull(line + 6, NULL, 10);
    if (f) fclose(f);
    return kb * 1024;
}

/* ---- the attention under test: flash, the log-sum-exp kept --------------- */
typedef struct {
    float *lse; /* (B, NH, T) kept for backward */
    int64_t kept_bytes, scratch_bytes;
} saved;

static void saved_init(saved *s, int B, int T, int NH, int HS, bool bf16) {
    int64_t nl = (int64_t)B * NH * T;
    s->lse = rand_vec(nl);
    s->kept_bytes = nl * (int64_t)sizeof(float);
    s->scratch_bytes = keel_attention_workspace_bytes(T, HS, keel_pool_threads(), bf16);
}
static void saved_free(saved *s) { keel_free(s->lse); }

static void forward(bool bf16, saved *s, float *out, const float *q, const float *k, const float *v,
                    int B, int T, int NH, int NKV, int HS) {
    (bf16 ? keel_attention_forward_bf16 : keel_attention_forward)(out, s->lse, q, k, v, NULL, B, T, NH,
                                                                   NKV, HS);
}
static void backward(bool bf16, saved *s, float *dq, float *dk, float *dv, const float *dout,
                     const float *out, const float *q, const float *k, const float *v, int B, int T,
                     int NH, int NKV, int HS) {
    (bf16 ? keel_attention_backward_bf16 : keel_attention_backward)(dq, dk, dv, dout, out, s->lse, q,
                                                                     k, v, NULL, B, T, NH, NKV, HS);
}
/* -------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s T fp32|bf16 [reps [threads [B NH NKV HS]]]\n", argv[0]);
        return 2;
    }
    int T = atoi(argv[1]), reps = argc > 3 ? atoi(argv[3]) : 5, threads = argc > 4 ? atoi(argv[4]) : 1;
    bool bf16 = !strcmp(argv[2], "bf16");
    int B = 1, NH = 32, NKV = 32, HS = 128;
    if (argc == 9) B = atoi(argv[5]), NH = atoi(argv[6]), NKV = atoi(argv[7]), HS = atoi(argv[8]);
    keel_kernels_init(threads);
    int64_t nq = (int64_t)B * T * NH * HS, nkv = (int64_t)B * T * NKV * HS;
    float *q = rand_vec(nq), *k = rand_vec(nkv), *v = rand_vec(nkv), *dout = rand_vec(nq);
    float *out = rand_vec(nq), *dq = rand_vec(nq), *dk = rand_vec(nkv), *dv = rand_vec(nkv);
    uint64_t base_rss = rss_bytes(); /* inputs and outputs, touched */
    saved s;
    saved_init(&s, B, T, NH, HS, bf16);
    double *fwd = keel_xmalloc(sizeof(double) * (size_t)reps, "times");
    double *bwd = keel_xmalloc(sizeof(double) * (size_t)reps, "times");
    double *tot = keel_xmalloc(sizeof(double) * (size_t)reps, "times");
    double *cpu = keel_xmalloc(sizeof(double) * (size_t)reps, "times");
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        double c0 = keel_cpu_s(), t0 = keel_now_s();
        forward(bf16, &s, out, q, k, v, B, T, NH, NKV, HS);
        double t1 = keel_now_s();
        backward(bf16, &s, dq, dk, dv, dout, out, q, k, v, B, T, NH, NKV, HS);
        double t2 = keel_now_s(), c2 = keel_cpu_s();
        if (r >= 0) fwd[r] = t1 - t0, bwd[r] = t2 - t1, tot[r] = t2 - t0, cpu[r] = c2 - c0;
    }
    uint64_t peak = keel_peak_rss_bytes();
    printf("T=%d dtype=%s B=%d NH=%d NKV=%d HS=%d threads=%d reps=%d fwd_ms=%.1f bwd_ms=%.1f "
           "total_ms=%.1f cpu_ms=%.1f kept_bytes=%lld scratch_bytes=%lld peak_rss_bytes=%llu "
           "peak_above_io_bytes=%llu\n",
           T, bf16 ? "bf16" : "fp32", B, NH, NKV, HS, keel_pool_threads(), reps,
           1e3 * keel_median(fwd, reps), 1e3 * keel_median(bwd, reps), 1e3 * keel_median(tot, reps), 1e3 * keel_median(cpu, reps),
           (long long)s.kept_bytes, (long long)s.scratch_bytes, (unsigned long long)peak,
           (unsigned long long)(peak > base_rss ? peak - base_rss : 0));
    saved_free(&s);
    keel_free(q), keel_free(k), keel_free(v), keel_free(dout), keel_free(out);
    keel_free(dq), keel_free(dk), keel_free(dv), keel_free(fwd), keel_free(bwd), keel_free(tot);
    keel_free(cpu);
    keel_kernels_shutdown();
    return 0;
}
