/* kernels/attention_amx.c: the tile products of flash attention (attention.c,
 * attention_tiles.h) on AMX, where the active instruction set (isa.c) has it.
 *
 * The same roundings as attention_bf16.c (its packing: A as rows, B as
 * pairs, the layouts TDPBF16PS reads) with the sums on 16 x 16 fp32 tiles:
 * TDPBF16PS multiplies 16 rows x 32 bf16 of A by 16 pairs-rows x 16 pairs of
 * B, 16384 FLOPs, against VDPBF16PS's 64 a cycle. In a bf16 `small` step on
 * a 2-core Xeon the products were 12% of the time, the rest of attention 7%
 * (perf, 2026-12-07). Every operand is padded with zeros to whole tiles (32
 * rows and 32 columns of C a block, sums in steps of 32); the padded part of
 * C is computed and dropped.
 *
 * The tile configuration is per thread and oneDNN's AMX kernels load their
 * own on the same threads, so each product loads it and releases the tiles. */
#include <string.h>

#include "keel/kernels.h"
#include "kernels/attention_tiles.h"

static inline int even(int x) { return (x + 1) & ~1; }
static inline int up16(int x) { return (x + 15) & ~15; }
static inline int up32(int x) { return (x + 31) & ~31; }

/* A rows (up32(M) x up32(K)), B pairs (up32(K)/2 x 2 up32(N)), and either A's
 * pairs (a_t) or B's rows (b_t) on the way: each at most up32(D)² values. */
size_t tile_scratch_amx(int max_dim) {
    size_t d = (size_t)up32(max_dim);
    return 3 * d * d * sizeof(keel_bf16);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16"))), \
                             apply_to = function)
#endif
#include <immintrin.h>

#include "kernels/amx.h"

/* rows (M, ld) of A from its pairs (A stored (K, M) and packed as pairs,
 * stride ldp): row m's pair p is pairs[p * ldp + 2m]. Pairs from even(K)/2 to
 * ld/2 come out zero. */
static void pairs_to_rows(keel_bf16 *rows, int ld, const keel_bf16 *pairs, int ldp, int M, int K) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_mullo_epi32(lane, _mm512_set1_epi32(ldp / 2)); /* in pairs */
    int kp = even(K) / 2;
    for (int m = 0; m < M; m++)
        for (int p = 0; p < ld / 2; p += 16) {
            __mmask16 mask = kp - p >= 16 ? 0xffff : kp > p ? (__mmask16)((1u << (kp - p)) - 1) : 0;
            const void *base = pairs + (int64_t)p * ldp + 2 * m;
            __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, idx, base, 4);
            _mm512_storeu_si512(rows + (int64_t)m * ld + 2 * p, g);
        }
}

void tile_product_amx(const tile_product *g, char *scratch) {
    int M = g->M, N = g->N, K = g->K;
    int Mp = up32(M), Kp = up32(K), ldb = 2 * up32(N);
    keel_bf16 *a = (keel_bf16 *)scratch, *b = a + (size_t)Mp * Kp, *t = b + (size_t)Kp / 2 * ldb;
    /* A: rows, zero from column even(K) and from row M */
    if (!g->a_t) {
        tile_pack_rows(a, Kp, g->a, g->lda, M, K);
        for (int r = 0; r < M; r++) memset(a + (int64_t)r * Kp + even(K), 0, sizeof(keel_bf16) * (size_t)(Kp - even(K)));
    } else {
        int ldp = 2 * up16(M);
        tile_pack_pairs(t, ldp, g->a, g->lda, K, M);
        pairs_to_rows(a, Kp, t, ldp, M, K);
    }
    memset(a + (int64_t)M * Kp, 0, sizeof(keel_bf16) * (size_t)(Mp - M) * (size_t)Kp);
    /* B: pairs, zero from pair 2 up16(N) of a row and from pair row even(K)/2 */
    tile_pack_b(b, ldb, t, g);
    for (int p = 0; p < even(K) / 2; p++)
        memset(b + (int64_t)p * ldb + 2 * up16(N), 0, sizeof(keel_bf16) * (size_t)(ldb - 2 * up16(N)));
    memset(b + (int64_t)even(K) / 2 * ldb, 0, sizeof(keel_bf16) * (size_t)(Kp - even(K)) / 2 * (size_t)ldb);

    _Alignas(64) float out[4][16 * 16];
    amx_load_16x64();
    const __m512 alpha = _mm512_set1_ps(g->alpha);
    for (int m0 = 0; m0 < M; m0 += 32)
        for (int n0 = 0; n0 < N; n0 += 32) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int k0 = 0; k0 < Kp; k0 += 32) {
                const keel_bf16 *a0 = a + (int64_t)m0 * Kp + k0, *a1 = a0 + 16 * (int64_t)Kp;
                const keel_bf16 *b0 = b + (int64_t)k0 / 2 * ldb + 2 * n0, *b1 = b0 + 32;
                _tile_loadd(4, a0, Kp * (int)sizeof(keel_bf16));
                _tile_loadd(5, a1, Kp * (int)sizeof(keel_bf16));
                _tile_loadd(6, b0, ldb * (int)sizeof(keel_bf16));
                _tile_loadd(7, b1, ldb * (int)sizeof(keel_bf16));
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, out[0], 64);
            _tile_stored(1, out[1], 64);
            _tile_stored(2, out[2], 64);
            _tile_stored(3, out[3], 64);
            __asm__ volatile("" : : "r"(out) : "memory");
            for (int q = 0; q < 4; q++) { /* C tile q: rows m0 + 16 (q / 2), columns n0 + 16 (q % 2) */
                int r0 = m0 + 16 * (q / 2), c0 = n0 + 16 * (q % 2), cols = N - c0;
                if (cols <= 0) continue;
                __mmask16 cm = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
                for (int i = 0; i < 16 && r0 + i < M; i++) {
                    float *c = g->c + (int64_t)(r0 + i) * g->ldc + c0;
                    __m512 r = _mm512_mul_ps(_mm512_load_ps(out[q] + 16 * i), alpha);
                    if (g->accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(cm, c));
                    _mm512_mask_storeu_ps(c, cm, r);
                }
            }
        }
    _tile_release();
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#elif defined(__clang__)
#pragma clang attribute pop
#endif
