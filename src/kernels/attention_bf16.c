/* kernels/attention_bf16.c: the tile products of flash attention
 * (attention.c, attention_tiles.h) with bf16 operands and fp32 sums, for
 * fsdp.mixed_precision bf16.
 *
 * Where the active instruction set (isa.c) has AVX512_BF16, an AVX512_BF16
 * microkernel: VDPBF16PS sums 32 bf16 products into 16 fp32 lanes, twice the
 * fp32 FMA rate on Zen 4. oneDNN's matmul (gemm_bf16.c) would need a
 * primitive per shape and memory objects per call for the thousands of
 * small products of a layer; here the operands are packed into the
 * microkernel's layouts in the same pass that rounds them to bf16, which is
 * needed anyway. Elsewhere the same values are rounded to bf16 into fp32
 * operands of OpenBLAS sgemm (bf16 products are exact in fp32, so the sums
 * are fp32 sums of the same products): the same math on every CPU.
 *
 * What is rounded, as product inputs only: Q, K, V, dO, the probabilities and
 * the softmax gradient. The softmax and its backward stay fp32 (softmax.h). */
#include <cblas.h>
#include <stdint.h>
#include <string.h>

#include "keel/kernels.h"
#include "kernels/attention_tiles.h"

#define MR 6 /* microkernel tile: MR rows x NV 16-lane vectors */
#define NV 4

/* The two layouts the microkernel reads (bf16, zero padded):
 *   rows:  X (R, K) row-major, K rounded up to even, so (x[k], x[k+1]) is
 *          one 32-bit pair;
 *   pairs: rows 2p and 2p+1 interleaved, pair p of column n at
 *          [p * ld + 2n]: VDPBF16PS's operand layout, R rounded up to even
 *          and N to 16.
 * A product's A operand is either; its B operand is always pairs. */
static inline int even(int x) { return (x + 1) & ~1; }
static inline int up16(int x) { return (x + 15) & ~15; }

/* Carves 64-byte aligned bf16 arrays out of a product's scratch. */
typedef struct {
    char *at;
} carver;
static size_t carve_size(int64_t elems) {
    return ((size_t)elems * sizeof(keel_bf16) + 63) & ~(size_t)63;
}
static keel_bf16 *carve(carver *c, int64_t elems) {
    keel_bf16 *p = (keel_bf16 *)c->at;
    c->at += carve_size(elems);
    return p;
}

/* A (rows or pairs), B (pairs) and B's rows on the way to pairs of its
 * transpose: each at most even(D) x up16(D) for operands of at most D x D. */
size_t tile_scratch_bf16(int max_dim) {
    return 3 * carve_size((int64_t)even(max_dim) * up16(max_dim));
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))), \
                             apply_to = function)
#endif
#include <immintrin.h>

/* ---- packing: fp32 -> bf16 (round to nearest even) ----------------------- */

/* rows: dst (R, even(K)) with row stride ld from src (R, K) with row stride lds. */
void tile_pack_rows(keel_bf16 *dst, int ld, const float *src, int64_t lds, int R, int K) {
    for (int r = 0; r < R; r++) {
        const float *s = src + r * lds;
        keel_bf16 *d = dst + (int64_t)r * ld;
        int k = 0;
        for (; k + 16 <= K; k += 16) { /* masked stores are slow on Zen 4: only for the tail */
            __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + k));
            _mm256_storeu_si256((__m256i *)(d + k), (__m256i)h);
        }
        if (k < K) {
            __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
            __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + k));
            _mm256_mask_storeu_epi16(d + k, m, (__m256i)h);
        }
        if (K & 1) d[K] = 0;
    }
}

/* pairs: dst (even(R)/2 pair rows of up16(N) pairs, stride ld) from src (R, N). */
void tile_pack_pairs(keel_bf16 *dst, int ld, const float *src, int64_t lds, int R, int N) {
    /* cvtne2ps puts row 2p+1 in the upper 16 halves: interleave with row 2p */
    const __m512i mix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    for (int p = 0; p < even(R) / 2; p++) {
        const float *s0 = src + 2 * p * lds, *s1 = s0 + lds;
        bool odd = 2 * p + 1 == R; /* the last row pairs with zeros */
        keel_bf16 *d = dst + (int64_t)p * ld;
        for (int n = 0; n < N; n += 16) {
            __m512 a, b = _mm512_setzero_ps();
            if (N - n >= 16) {
                a = _mm512_loadu_ps(s0 + n);
                if (!odd) b = _mm512_loadu_ps(s1 + n);
            } else {
                __mmask16 m = (__mmask16)((1u << (N - n)) - 1);
                a = _mm512_maskz_loadu_ps(m, s0 + n);
                if (!odd) b = _mm512_maskz_loadu_ps(m, s1 + n);
            }
            __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a);
            _mm512_storeu_si512(d + 2 * n, _mm512_permutexvar_epi16(mix, h));
        }
    }
}

/* pairs of the transpose: dst (even(K)/2 pair rows of up16(R) pairs) holding
 * Xᵀ for X = src (R, K); rows is X already packed as rows (stride ldr). */
static void pack_pairs_t(keel_bf16 *dst, int ld, const keel_bf16 *rows, int ldr, int R, int K) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_mullo_epi32(lane, _mm512_set1_epi32(ldr / 2)); /* in pairs */
    for (int p = 0; p < even(K) / 2; p++)
        for (int r = 0; r < up16(R); r += 16) {
            __mmask16 m = R - r >= 16 ? 0xffff : (__mmask16)((1u << (R - r)) - 1);
            const void *base = rows + (int64_t)r * ldr + 2 * p;
            __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, base, 4);
            _mm512_storeu_si512(dst + (int64_t)p * ld + 2 * r, g);
        }
}

void tile_pack_b(keel_bf16 *b, int ldb, keel_bf16 *rows, const tile_product *g) {
    if (!g->b_t) { /* B (K, N) */
        tile_pack_pairs(b, ldb, g->b, g->ldb, g->K, g->N);
        return;
    } /* B stored (N, K): rows first, then pairs of the transpose */
    tile_pack_rows(rows, even(g->K), g->b, g->ldb, g->N, g->K);
    pack_pairs_t(b, ldb, rows, even(g->K), g->N, g->K);
}

/* ---- the microkernel ------------------------------------------------------
 * C (M, N) = alpha · A (M, K) · B (K, N), plus C if accumulate. A's pair p of
 * row m is at a + m * a_row + p * a_pair (rows: a_row = ld, a_pair = 2; pairs:
 * a_row = 2, a_pair = ld); B is pairs with stride ldb. */
typedef struct {
    const keel_bf16 *a;
    int64_t a_row, a_pair;
    const keel_bf16 *b;
    int64_t ldb;
    float *c;
    int64_t ldc;
    int M, N, K;
    float alpha;
    bool accumulate;
} product;

/* One MR x nv tile at (m0, n0); rows past M repeat the last row (computed,
 * not stored) so that every tile has the same fixed shape. */
static inline __attribute__((always_inline)) void tile(const product *g, int m0, int n0, int nv) {
    int mr = g->M - m0 < MR ? g->M - m0 : MR;
    const keel_bf16 *ar[MR];
    for (int i = 0; i < MR; i++) ar[i] = g->a + (int64_t)(m0 + (i < mr ? i : mr - 1)) * g->a_row;
    __m512 acc[MR][NV];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < nv; j++) acc[i][j] = _mm512_setzero_ps();
    int kp = even(g->K) / 2;
    const keel_bf16 *b = g->b + 2 * (int64_t)n0;
    for (int p = 0; p < kp; p++, b += g->ldb) {
        __m512bh bv[NV];
        for (int j = 0; j < nv; j++) bv[j] = (__m512bh)_mm512_loadu_si512(b + 32 * j);
        int64_t off = p * g->a_pair;
        for (int i = 0; i < MR; i++) {
            int32_t pair;
            memcpy(&pair, ar[i] + off, sizeof pair);
            __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
            for (int j = 0; j < nv; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
        }
    }
    __m512 alpha = _mm512_set1_ps(g->alpha);
    int last = g->N - n0 - 16 * (nv - 1); /* columns in the last vector, 1..16 */
    for (int i = 0; i < mr; i++) {
        float *c = g->c + (int64_t)(m0 + i) * g->ldc + n0;
        for (int j = 0; j < nv; j++) {
            __m512 r = _mm512_mul_ps(acc[i][j], alpha);
            if (j < nv - 1 || last >= 16) {
                if (g->accumulate) r = _mm512_add_ps(r, _mm512_loadu_ps(c + 16 * j));
                _mm512_storeu_ps(c + 16 * j, r);
            } else { /* masked only at the edge: slow stores on Zen 4 */
                __mmask16 m = (__mmask16)((1u << last) - 1);
                if (g->accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, c + 16 * j));
                _mm512_mask_storeu_ps(c + 16 * j, m, r);
            }
        }
    }
}

/* Column panels of NV vectors outside, row tiles inside: the panel of B
 * stays in cache across the rows. */
static void run_product(const product *g) {
    for (int n0 = 0; n0 < g->N; n0 += 16 * NV) {
        int nv = (g->N - n0 + 15) / 16;
        nv = nv < NV ? nv : NV;
        for (int m0 = 0; m0 < g->M; m0 += MR) switch (nv) {
            case 1: tile(g, m0, n0, 1); break;
            case 2: tile(g, m0, n0, 2); break;
            case 3: tile(g, m0, n0, 3); break;
            default: tile(g, m0, n0, 4); break;
            }
    }
}

/* ---- one tile product: pack, then the microkernel ------------------------ */

void tile_product_bf16(const tile_product *g, char *scratch) {
    carver cv = {scratch};
    int Ke = even(g->K), ldb = 2 * up16(g->N);
    product p = {.c = g->c, .ldc = g->ldc, .M = g->M, .N = g->N, .K = g->K, .alpha = g->alpha,
                 .accumulate = g->accumulate, .ldb = ldb};
    if (!g->a_t) { /* A (M, K): rows */
        keel_bf16 *a = carve(&cv, (int64_t)g->M * Ke);
        tile_pack_rows(a, Ke, g->a, g->lda, g->M, g->K);
        p.a = a, p.a_row = Ke, p.a_pair = 2;
    } else { /* A stored (K, M): pairs of its rows are pairs along the sum */
        int lda = 2 * up16(g->M);
        keel_bf16 *a = carve(&cv, (int64_t)Ke / 2 * lda);
        tile_pack_pairs(a, lda, g->a, g->lda, g->K, g->M);
        p.a = a, p.a_row = 2, p.a_pair = lda;
    }
    keel_bf16 *b = carve(&cv, (int64_t)Ke / 2 * ldb);
    tile_pack_b(b, ldb, carve(&cv, (int64_t)g->N * Ke), g);
    p.b = b;
    run_product(&p);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#elif defined(__clang__)
#pragma clang attribute pop
#endif

/* ---- emulation: the same roundings, fp32 products (no AVX512_BF16) -------- */

/* dst (R, C), row stride C, = src (R, C) with row stride lds, each value
 * rounded to the nearest bf16 (kept as fp32). */
static void round_rows(float *dst, const float *src, int64_t lds, int R, int C) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            dst[(int64_t)r * C + c] = keel_bf16_to_float(keel_bf16_from_float(src[r * lds + c]));
}

size_t tile_scratch_bf16_emulated(int max_dim) {
    return 2 * sizeof(float) * (size_t)max_dim * max_dim;
}

/* X as stored (rows, cols), rounded into dst unless its values are bf16's
 * already; returns where the product reads it and sets *ld. */
static const float *rounded(float *dst, const float *x, int64_t ldx, bool is_bf16, int rows,
                            int cols, int64_t *ld) {
    if (is_bf16) return *ld = ldx, x;
    round_rows(dst, x, ldx, rows, cols);
    return *ld = cols, dst;
}

void tile_product_bf16_emulated(const tile_product *g, char *scratch) {
    float *a16 = (float *)scratch, *b16 = a16 + (int64_t)g->M * g->K;
    int64_t lda, ldb;
    const float *a = g->a_t ? rounded(a16, g->a, g->lda, g->a_bf16, g->K, g->M, &lda)
                            : rounded(a16, g->a, g->lda, g->a_bf16, g->M, g->K, &lda);
    const float *b = g->b_t ? rounded(b16, g->b, g->ldb, g->b_bf16, g->N, g->K, &ldb)
                            : rounded(b16, g->b, g->ldb, g->b_bf16, g->K, g->N, &ldb);
    cblas_sgemm(CblasRowMajor, g->a_t ? CblasTrans : CblasNoTrans, g->b_t ? CblasTrans : CblasNoTrans,
                g->M, g->N, g->K, g->alpha, a, (int)lda, b, (int)ldb, g->accumulate ? 1.0f : 0.0f,
                g->c, (int)g->ldc);
}
