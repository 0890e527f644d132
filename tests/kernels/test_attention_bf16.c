/* bf16 flash attention (keel_attention_*_bf16) against the double-precision
 * O(T²) reference, forward (output and log-sum-exp) and backward, on ragged
 * shapes (T and HS not multiples of the 16-lane vectors, the 6-row
 * microkernel tiles or the 128 x 256 attention tiles, odd T, grouped-query
 * heads), the small config's and Llama 2's head shapes, 1 and 2 threads.
 *
 * Tolerance: every product input is rounded to bf16 (relative error <= 2^-9)
 * and summed in fp32, so each output is off by a few 2^-9 of the magnitudes it
 * sums; with unit-scale inputs that stays under 1% of the largest reference
 * value (measured: <= 0.53%), where a wrong index or a missed tail would be
 * off by O(1). The log-sum-exp comes from fp32 scores of bf16 q and k, so
 * it gets the same bound. The fp32 kernels are held to 1e-5 in
 * test_kernels_match_reference. The path is the machine's (AMX tiles, the
 * AVX512_BF16 microkernel, or the emulation without them); ctest also runs
 * this as test_attention_bf16_avx512_bf16 and test_attention_bf16_avx2
 * (KEEL_MAX_ISA caps), so an AMX machine checks the microkernel too and every
 * machine the emulation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/kernels.h"

#include "../testlib.h"

#define TOL 1e-2

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float *rand_vec(int64_t n, float scale) {
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

/* max |got - want| / max |want|, NaN-safe (a NaN fails). */
static double rel_err(const float *got, const float *want, int64_t n) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]) / (scale + 1e-30);
        worst = testlib_worst(worst, err);
    }
    return worst;
}

static void check(const char *what, int T, int NH, int NKV, int HS, const float *got,
                  const float *want, int64_t n) {
    double err = rel_err(got, want, n);
    EXPECT(err <= TOL, "%-24s T=%-3d NH=%d NKV=%d HS=%-2d threads=%d: max_err/max|ref| %.2e (tol %.0e)",
           what, T, NH, NKV, HS, keel_pool_threads(), err, TOL);
}

/* Document masking's kv_start (B, T): documents of 1 to 90 tokens in
 * sequence 0, one from position 300 on in sequence 1 (whole key tiles skipped). */
static int32_t *doc_starts(int B, int T) {
    int32_t *ks = malloc(sizeof(int32_t) * (size_t)B * T);
    uint64_t x = 777;
    for (int b = 0; b < B; b++)
        for (int t = 0, from = 0; t < T; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            if (b == 0 ? (x >> 33) % 45 == 0 : t == 300) from = t;
            ks[(int64_t)b * T + t] = from;
        }
    return ks;
}

static void test_attention(int T, int NH, int NKV, int HS, float scale, bool docs) {
    int B = 2;
    int32_t *ks = docs ? doc_starts(B, T) : NULL;
    int64_t nq = (int64_t)B * T * NH * HS, nkv = (int64_t)B * T * NKV * HS, na = (int64_t)B * NH * T * T;
    int64_t nl = (int64_t)B * NH * T;
    float *q = rand_vec(nq, scale), *k = rand_vec(nkv, scale), *v = rand_vec(nkv, 1);
    float *dout = rand_vec(nq, 1);
    float *o1 = calloc(nq, 4), *o2 = calloc(nq, 4), *att = calloc(na, 4);
    float *l1 = calloc(nl, 4), *l2 = calloc(nl, 4);
    keel_attention_forward_bf16(o1, l1, q, k, v, ks, B, T, NH, NKV, HS);
    keel_ref_attention_forward(o2, att, l2, q, k, v, ks, B, T, NH, NKV, HS);
    check(docs ? "bf16 forward, documents" : "bf16 attention forward", T, NH, NKV, HS, o1, o2, nq);
    check("bf16 log-sum-exp", T, NH, NKV, HS, l1, l2, nl);
    /* dq, dk, dv start as garbage, to show that backward overwrites them */
    float *dq1 = rand_vec(nq, 9), *dq2 = calloc(nq, 4), *dk1 = rand_vec(nkv, 9), *dk2 = calloc(nkv, 4);
    float *dv1 = rand_vec(nkv, 9), *dv2 = calloc(nkv, 4);
    keel_attention_backward_bf16(dq1, dk1, dv1, dout, o1, l1, q, k, v, ks, B, T, NH, NKV, HS);
    keel_ref_attention_backward(dq2, dk2, dv2, dout, q, k, v, att, B, T, NH, NKV, HS);
    check("bf16 attention dq", T, NH, NKV, HS, dq1, dq2, nq);
    check("bf16 attention dk", T, NH, NKV, HS, dk1, dk2, nkv);
    check("bf16 attention dv", T, NH, NKV, HS, dv1, dv2, nkv);
    free(q); free(k); free(v); free(dout); free(o1); free(o2); free(att); free(l1); free(l2);
    free(dq1); free(dq2); free(dk1); free(dk2); free(dv1); free(dv2); free(ks);
}

int main(void) {
    keel_kernels_init(1);
    keel_isa level = keel_isa_active();
    printf("bf16 attention at %s: %s\n", keel_isa_name(level),
           level >= KEEL_ISA_AMX           ? "AMX tiles"
           : level >= KEEL_ISA_AVX512_BF16 ? "AVX512_BF16 microkernel"
                                           : "emulated (bf16-rounded operands, OpenBLAS sgemm)");
    keel_kernels_shutdown();
    for (int threads = 1; threads <= 2; threads++) {
        keel_kernels_init(threads);
        test_attention(29, 4, 4, 12, 1.0f, false);   /* one odd block, HS below one vector */
        test_attention(29, 6, 2, 12, 1.0f, false);   /* grouped-query heads */
        test_attention(300, 4, 2, 20, 1.0f, false);  /* several row blocks, ragged last, HS past 16 */
        test_attention(131, 3, 1, 64, 2.0f, false);  /* odd T past one block, sharper softmax */
        test_attention(512, 2, 2, 64, 1.0f, false);  /* the small config's head shape */
        test_attention(256, 2, 1, 16, 1.0f, false);  /* exactly one key tile, two query blocks */
        test_attention(777, 4, 1, 32, 1.0f, false);  /* 7 query blocks, ragged last, group of 4 */
        test_attention(300, 2, 1, 128, 1.0f, false); /* a Llama 2 head: HS past the tile's width */
        test_attention(777, 4, 2, 32, 1.0f, true);   /* document masking */
        test_attention(300, 2, 1, 64, 1.0f, true);
        keel_kernels_shutdown();
    }
    return test_summary("test_attention_bf16");
}
