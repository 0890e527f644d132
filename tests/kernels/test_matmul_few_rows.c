/* The few-row GEMMs of decode steps (keel_matmul_few_rows, _bf16) against a
 * double-precision product of the same inputs — M from 1 past the tiles, N
 * and K ragged (K below, at and past the 8-lane vectors, and a Llama width),
 * accumulate or not, 1 and 2 threads — and a row's result bit for bit the
 * same whatever the rows beside it (a sequence decoded in a batch gets what
 * it gets alone). The bf16 form also against keel_gemm_bf16, the path it
 * stands in for. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/kernels.h"

#define TESTLIB_QUIET
#include "../testlib.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* out (M,N) against the double product of x (M,K) and w (N,K) (as given:
 * bf16 inputs are passed widened), relative to the sum of |products|. */
static double worst_error(const float *out, const float *init, const float *x, const float *w, int M, int N, int K,
                          bool accumulate) {
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = accumulate ? init[(int64_t)i * N + j] : 0, mag = fabs(want);
            for (int k = 0; k < K; k++) {
                double p = (double)x[(int64_t)i * K + k] * w[(int64_t)j * K + k];
                want += p;
                mag += fabs(p);
            }
            worst = testlib_worst(worst, fabs(out[(int64_t)i * N + j] - want) / (mag + 1e-30));
        }
    return worst;
}

static void test_shape(int M, int N, int K, bool accumulate) {
    int64_t nx = (int64_t)M * K, nw = (int64_t)N * K, no = (int64_t)M * N;
    float *x = malloc(4 * (size_t)nx), *w = malloc(4 * (size_t)nw), *init = malloc(4 * (size_t)no);
    float *out = malloc(4 * (size_t)no), *alone = malloc(4 * (size_t)N);
    float *x16f = malloc(4 * (size_t)nx), *w16f = malloc(4 * (size_t)nw), *ref16 = malloc(4 * (size_t)no);
    keel_bf16 *x16 = malloc(2 * (size_t)nx), *w16 = malloc(2 * (size_t)nw);
    for (int64_t i = 0; i < nx; i++) x[i] = frand();
    for (int64_t i = 0; i < nw; i++) w[i] = frand();
    for (int64_t i = 0; i < no; i++) init[i] = frand();
    keel_f32_to_bf16(x16, x, nx);
    keel_f32_to_bf16(w16, w, nw);
    keel_bf16_to_f32(x16f, x16, nx);
    keel_bf16_to_f32(w16f, w16, nw);
    int threads = keel_pool_threads();
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        memcpy(out, init, 4 * (size_t)no);
        if (bf16) keel_matmul_few_rows_bf16(out, x16, w16, M, N, K, accumulate);
        else keel_matmul_few_rows(out, x, w, M, N, K, accumulate);
        /* fp32 sums: error ~ K x 2^-24 of the magnitudes */
        double err = bf16 ? worst_error(out, init, x16f, w16f, M, N, K, accumulate)
                          : worst_error(out, init, x, w, M, N, K, accumulate);
        EXPECT(err <= 1e-5, "few rows %s M=%d N=%d K=%d acc=%d threads=%d: err/sum|xw| %.1e", bf16 ? "bf16" : "fp32",
               M, N, K, accumulate, threads, err);
        bool same = true; /* each row alone gives the same bits */
        for (int i = 0; i < M; i++) {
            memcpy(alone, init + (int64_t)i * N, 4 * (size_t)N);
            if (bf16) keel_matmul_few_rows_bf16(alone, x16 + (int64_t)i * K, w16, 1, N, K, accumulate);
            else keel_matmul_few_rows(alone, x + (int64_t)i * K, w, 1, N, K, accumulate);
            same &= memcmp(alone, out + (int64_t)i * N, 4 * (size_t)N) == 0;
        }
        EXPECT(same, "few rows %s M=%d N=%d K=%d acc=%d threads=%d: every row alone = in the batch",
               bf16 ? "bf16" : "fp32", M, N, K, accumulate, threads);
        if (bf16) { /* the GEMM it stands in for, within fp32 rounding of each other */
            memcpy(ref16, init, 4 * (size_t)no);
            keel_gemm_bf16(ref16, x16, false, w16, true, M, N, K, accumulate);
            double d = 0;
            for (int64_t i = 0; i < no; i++) d = testlib_worst(d, fabs(ref16[i] - out[i]) / (1 + fabs(ref16[i])));
            EXPECT(d <= 1e-4 * sqrt(K + 1.0), "few rows bf16 M=%d N=%d K=%d = keel_gemm_bf16 (%.1e)", M, N, K, d);
        }
    }
    free(x); free(w); free(init); free(out); free(alone);
    free(x16f); free(w16f); free(ref16); free(x16); free(w16);
}

int main(void) {
    for (int threads = 1; threads <= 2; threads++) {
        keel_kernels_init(threads);
        int Ms[] = {1, 2, 3, 5, 8, 9, 17}, Ns[] = {1, 3, 4, 67, 300}, Ks[] = {1, 7, 8, 24, 33, 45, 768};
        for (size_t m = 0; m < sizeof Ms / sizeof *Ms; m++)
            for (size_t n = 0; n < sizeof Ns / sizeof *Ns; n++)
                for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++) test_shape(Ms[m], Ns[n], Ks[k], (m + n + k) & 1);
        test_shape(8, 2048, 768, true);  /* a decode step's up-projection, split over threads */
        test_shape(4, 130, 2048, false); /* a down-projection's depth */
        keel_kernels_shutdown();
    }
    return test_summary("test_matmul_few_rows");
}
