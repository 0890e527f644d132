/* keel_attention_cached (generation's attention against a KV cache) against a
 * plain softmax in double: head sizes that are and are not a multiple of the
 * 8-key score groups, contexts past one 64-key tile, grouped-query heads,
 * rows of several sequences at different positions in one call (a prefill
 * chunk and decode rows), 1 and 2 threads, fp32 and bf16 caches; and the
 * cache holds each new row's key and value where it belongs (rounded to bf16
 * in a bf16 cache). */
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

/* S sequences with T_max positions; sequence s already holds filled[s]
 * positions; the call adds rows: a chunk of `chunk` rows of sequence 0 after
 * its filled ones, then one row of every other sequence. */
static float round_bf16(float x) { return keel_bf16_to_float(keel_bf16_from_float(x)); }

static void test_case(int NH, int NKV, int HS, int T_max, const int *filled, int S, int chunk, float qscale,
                      bool bf16) {
    int KVD = NKV * HS, N = chunk + S - 1;
    size_t cache_n = (size_t)S * T_max * KVD;
    float *kc = calloc(cache_n, 4), *vc = calloc(cache_n, 4);
    keel_bf16 *kc16 = calloc(cache_n, 2), *vc16 = calloc(cache_n, 2);
    float *q = malloc(4 * (size_t)N * NH * HS), *k = malloc(4 * (size_t)N * KVD), *v = malloc(4 * (size_t)N * KVD);
    float *out = malloc(4 * (size_t)N * NH * HS);
    int32_t *seq = malloc(4 * (size_t)N), *pos = malloc(4 * (size_t)N);
#define AT(s, h, t) ((((size_t)(s) * NKV + (h)) * T_max + (t)) * HS) /* the cache's (S, NKV, T_max, HS) */
    for (int s = 0; s < S; s++)
        for (int t = 0; t < filled[s]; t++)
            for (int h = 0; h < NKV; h++)
                for (int d = 0; d < HS; d++) {
                    size_t at = AT(s, h, t) + d;
                    kc[at] = bf16 ? round_bf16(frand()) : frand(), vc[at] = bf16 ? round_bf16(frand()) : frand();
                    kc16[at] = keel_bf16_from_float(kc[at]), vc16[at] = keel_bf16_from_float(vc[at]);
                }
    for (int i = 0; i < N; i++) {
        seq[i] = i < chunk ? 0 : i - chunk + 1;
        pos[i] = i < chunk ? filled[0] + i : filled[seq[i]];
        for (int d = 0; d < NH * HS; d++) q[(size_t)i * NH * HS + d] = qscale * frand();
        for (int d = 0; d < KVD; d++) k[(size_t)i * KVD + d] = frand(), v[(size_t)i * KVD + d] = frand();
    }
    if (bf16) {
        keel_attention_cached_bf16(out, q, k, v, kc16, vc16, seq, pos, N, NH, NKV, HS, T_max);
        for (size_t i = 0; i < cache_n; i++) kc[i] = keel_bf16_to_float(kc16[i]), vc[i] = keel_bf16_to_float(vc16[i]);
        for (size_t i = 0; i < (size_t)N * KVD; i++) k[i] = round_bf16(k[i]), v[i] = round_bf16(v[i]);
    } else
        keel_attention_cached(out, q, k, v, kc, vc, seq, pos, N, NH, NKV, HS, T_max);
    bool stored = true;
    for (int i = 0; i < N; i++)
        for (int h = 0; h < NKV; h++)
            stored &= !memcmp(kc + AT(seq[i], h, pos[i]), k + ((size_t)i * NKV + h) * HS, 4 * (size_t)HS) &&
                      !memcmp(vc + AT(seq[i], h, pos[i]), v + ((size_t)i * NKV + h) * HS, 4 * (size_t)HS);
    EXPECT(stored, "NH=%d NKV=%d HS=%d %s: every new row's key and value in the cache", NH, NKV, HS,
           bf16 ? "bf16" : "fp32");
    double worst = 0, *p = malloc(sizeof(double) * (size_t)T_max);
    for (int i = 0; i < N; i++)
        for (int h = 0; h < NH; h++) {
            const float *qi = q + ((size_t)i * NH + h) * HS;
            const float *kb = kc + AT(seq[i], h / (NH / NKV), 0), *vb = vc + AT(seq[i], h / (NH / NKV), 0);
            double max = -INFINITY, sum = 0;
            for (int t = 0; t <= pos[i]; t++) {
                double s = 0;
                for (int d = 0; d < HS; d++) s += (double)qi[d] * kb[(size_t)t * HS + d];
                p[t] = s / sqrt((double)HS);
                max = p[t] > max ? p[t] : max;
            }
            for (int t = 0; t <= pos[i]; t++) sum += p[t] = exp(p[t] - max);
            for (int d = 0; d < HS; d++) {
                double want = 0;
                for (int t = 0; t <= pos[i]; t++) want += p[t] / sum * vb[(size_t)t * HS + d];
                worst = testlib_worst(worst, fabs(out[((size_t)i * NH + h) * HS + d] - want));
            }
        }
    EXPECT(worst <= 2e-5,
           "NH=%d NKV=%d HS=%d chunk=%d, %d sequences, q x%.0f, threads=%d, %s cache: |out - softmax(qk)v| %.1e", NH, NKV,
           HS, chunk, S, qscale, keel_pool_threads(), bf16 ? "bf16" : "fp32", worst);
    free(kc); free(vc); free(kc16); free(vc16); free(q); free(k); free(v); free(out); free(seq); free(pos); free(p);
}

int main(void) {
    for (int threads = 1; threads <= 2; threads++) {
        keel_kernels_init(threads);
        int filled[] = {100, 0, 7, 63, 64, 140};
        int shapes[][3] = {{4, 4, 64}, {4, 2, 16}, {6, 3, 8}, {2, 1, 12}, {3, 3, 5}}; /* NH, NKV, HS */
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int bf16 = 0; bf16 <= 1; bf16++) {
                test_case(shapes[s][0], shapes[s][1], shapes[s][2], 160, filled, 6, 9, 1.0f, bf16);
                test_case(shapes[s][0], shapes[s][1], shapes[s][2], 160, filled, 6, 1, 8.0f, bf16); /* peaked softmax */
                int empty[] = {0};
                test_case(shapes[s][0], shapes[s][1], shapes[s][2], 150, empty, 1, 150, 1.0f, bf16); /* a whole prefill */
            }
        keel_kernels_shutdown();
    }
    return test_summary("test_attention_cached");
}
