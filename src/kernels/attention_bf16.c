/* kernels/attention_bf16.c: causal attention whose six GEMMs take bf16 inputs
 * and sum in fp32 (fsdp.mixed_precision bf16).
 *
 * The blocking of attention.c (tasks over (batch, head) on keel's pool, blocks
 * of 128 query rows against only the keys they can see), with the products on
 * an AVX512_BF16 microkernel instead of OpenBLAS sgemm: VDPBF16PS sums 32 bf16
 * products into 16 fp32 lanes, twice the fp32 FMA rate on Zen 4. oneDNN's
 * matmul (gemm_bf16.c) would need a primitive per key count and memory
 * objects per call for ~300 small products per layer; here the operands are
 * packed in the same pass that rounds them to bf16, which is needed anyway,
 * and the products skip what the causal mask zeroes (tiles above the
 * diagonal, sums over masked keys): ~20% of the square blocks' work.
 *
 * What is rounded, as product inputs only: Q, K, V, dO, the probabilities and
 * the softmax gradient. Softmax and its backward stay fp32, bit for bit those
 * of softmax.h, on fp32 scores, and att keeps the fp32 probabilities. Where
 * the active instruction set (isa.c) has no AVX512_BF16, the same values are
 * rounded to bf16 into fp32 operands of OpenBLAS sgemm (bf16 products are
 * exact in fp32, so the sums are fp32 sums of the same products): slower than
 * fp32 attention by the rounding passes, but the same math as the
 * microkernel on every CPU. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "keel/kernels.h"
#include "kernels/softmax.h"

#define ROW_BLOCK 128 /* query rows per block, as attention.c; even */
#define MR 6          /* microkernel tile: MR rows x NV 16-lane vectors */
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

/* Per-task scratch, one slice per pool chunk; grown by the caller before the
 * pool runs, freed by keel_kernels_shutdown. Attention runs from one thread at
 * a time (the model's), like every keel kernel. */
static struct {
    void *mem;
    size_t bytes;
} scratch;

static char *scratch_for(size_t per_chunk, int chunks) {
    size_t want = per_chunk * (size_t)chunks;
    if (want > scratch.bytes) {
        keel_free(scratch.mem);
        scratch.mem = keel_xmalloc(want, "bf16 attention scratch");
        scratch.bytes = want;
    }
    return scratch.mem;
}

void keel_attention_bf16_release(void) {
    keel_free(scratch.mem);
    scratch.mem = NULL;
    scratch.bytes = 0;
}

/* Carves 64-byte aligned bf16 arrays out of one chunk's slice. */
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

typedef struct {
    float *out, *att, *dq, *dk, *dv, *datt;
    const float *q, *k, *v, *dout, *att_in;
    int B, T, NH, NKV, HS;
    char *scratch;
    size_t per_chunk;
} attn_ctx;

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
static void pack_rows(keel_bf16 *dst, int ld, const float *src, int64_t lds, int R, int K) {
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
static void pack_pairs(keel_bf16 *dst, int ld, const float *src, int64_t lds, int R, int N) {
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
    /* What the causal mask leaves out; r0 is the block's first query row
     * (queries are block rows, keys are absolute):
     * OUT_MASKED: C is (query, key) and entries with key > r0 + query are
     *   never read (softmax masks them): tiles wholly above are skipped;
     * SUM_TO_DIAGONAL: A is (query, key), zero for key > r0 + query: row m's
     *   sum stops at key r0 + m;
     * SUM_FROM_DIAGONAL: A is (key, query), zero for r0 + query < key: row
     *   m's sum starts at query m - r0. */
    enum { DENSE, OUT_MASKED, SUM_TO_DIAGONAL, SUM_FROM_DIAGONAL } causal;
    int r0;
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
    int p0 = 0, kp = even(g->K) / 2;
    if (g->causal == SUM_TO_DIAGONAL) { /* keys up to r0 + m0 + mr - 1 */
        int k_end = m0 + mr + g->r0;
        kp = even(k_end < g->K ? k_end : g->K) / 2;
    } else if (g->causal == SUM_FROM_DIAGONAL && m0 > g->r0) {
        p0 = (m0 - g->r0) / 2;
    }
    const keel_bf16 *b = g->b + 2 * (int64_t)n0 + p0 * g->ldb;
    for (int p = p0; p < kp; p++, b += g->ldb) {
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
        int m_first = 0; /* OUT_MASKED: the first row tile that reaches column n0 */
        if (g->causal == OUT_MASKED && n0 > g->r0 + MR - 1)
            m_first = (n0 - g->r0 - (MR - 1) + MR - 1) / MR * MR;
        for (int m0 = m_first; m0 < g->M; m0 += MR) switch (nv) {
            case 1: tile(g, m0, n0, 1); break;
            case 2: tile(g, m0, n0, 2); break;
            case 3: tile(g, m0, n0, 3); break;
            default: tile(g, m0, n0, 4); break;
            }
    }
}

/* ---- forward -------------------------------------------------------------- */

/* softmax_block (softmax.h), bit for bit, in separate passes: its fused
 * exp-and-sum loop is one serial float sum that keeps GCC from vectorising
 * exp. Maxima are exact in any order, so they take 16 lanes; each row's sum
 * keeps its serial order, with the sums of SUM_ROWS rows interleaved so that
 * their add latencies overlap. (16 partial sums per row were as fast, but
 * moved the bf16 runs of tests/fsdp/mixed_precision_bf16.sh off their
 * trajectory by more than that test allows: it compares single steps of a
 * 200-step run, where rounding-level changes grow.) */
#define SUM_ROWS 8
static void softmax_block_passes(float *A, int T, int r0, int rows) {
    for (int t0 = r0; t0 < r0 + rows; t0 += SUM_ROWS) {
        int nr = r0 + rows - t0 < SUM_ROWS ? r0 + rows - t0 : SUM_ROWS;
        float *row[SUM_ROWS], sum[SUM_ROWS] = {0};
        for (int r = 0; r < nr; r++) {
            float *a = row[r] = A + (int64_t)(t0 + r) * T, mx[KEEL_LANES];
            int n = t0 + r + 1, i;
            for (int j = 0; j < KEEL_LANES; j++) mx[j] = a[0];
            for (i = 0; i + KEEL_LANES <= n; i += KEEL_LANES)
                for (int j = 0; j < KEEL_LANES; j++) mx[j] = a[i + j] > mx[j] ? a[i + j] : mx[j];
            for (; i < n; i++) mx[0] = a[i] > mx[0] ? a[i] : mx[0];
            float m = keel_max(mx, KEEL_LANES);
            for (int j = 0; j < n; j++) a[j] = keel_expf(a[j] - m);
        }
        int common = t0 + 1; /* every row of the group has at least these */
        if (nr == SUM_ROWS)
            for (int j = 0; j < common; j++)
                for (int r = 0; r < SUM_ROWS; r++) sum[r] += row[r][j];
        for (int r = 0; r < nr; r++) {
            float *a = row[r];
            int n = t0 + r + 1;
            for (int j = nr == SUM_ROWS ? common : 0; j < n; j++) sum[r] += a[j];
            float inv = 1.0f / sum[r];
            for (int j = 0; j < n; j++) a[j] *= inv;
            memset(a + n, 0, sizeof(float) * (size_t)(T - n));
        }
    }
}

static size_t forward_bytes(int T, int HS) {
    int64_t rows = (int64_t)T * even(HS), pt = (int64_t)even(HS) * up16(T);
    int64_t pv = (int64_t)even(T) * up16(HS), p = (int64_t)ROW_BLOCK * even(T);
    return 2 * carve_size(rows) + carve_size(pt) + carve_size(pv) + carve_size(p);
}

static void forward_heads(void *p, int64_t begin, int64_t end, int chunk) {
    const attn_ctx *c = p;
    int T = c->T, HS = c->HS, ldq = c->NH * HS, ldkv = c->NKV * HS, group = c->NH / c->NKV;
    int HSe = even(HS), Te = even(T), ldt = 2 * up16(T), ldh = 2 * up16(HS);
    carver cv = {c->scratch + (size_t)chunk * c->per_chunk};
    keel_bf16 *q16 = carve(&cv, (int64_t)T * HSe), *k16 = carve(&cv, (int64_t)T * HSe);
    keel_bf16 *kt = carve(&cv, (int64_t)HSe * up16(T)), *vp = carve(&cv, (int64_t)Te * up16(HS));
    keel_bf16 *p16 = carve(&cv, (int64_t)ROW_BLOCK * Te);
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t bh = begin; bh < end; bh++) {
        int b = (int)(bh / c->NH), h = (int)(bh % c->NH);
        const float *Q = c->q + (int64_t)b * T * ldq + h * HS;
        const float *K = c->k + (int64_t)b * T * ldkv + (h / group) * HS;
        const float *V = c->v + (int64_t)b * T * ldkv + (h / group) * HS;
        float *O = c->out + (int64_t)b * T * ldq + h * HS;
        float *A = c->att + bh * T * T;
        pack_rows(q16, HSe, Q, ldq, T, HS);
        pack_rows(k16, HSe, K, ldkv, T, HS);
        pack_pairs_t(kt, ldt, k16, HSe, T, HS);
        pack_pairs(vp, ldh, V, ldkv, T, HS);
        for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
            int rows = T - r0 < ROW_BLOCK ? T - r0 : ROW_BLOCK, keys = r0 + rows;
            float *S = A + (int64_t)r0 * T;
            /* S = scale Q Kᵀ */
            run_product(&(product){.a = q16 + (int64_t)r0 * HSe, .a_row = HSe, .a_pair = 2, .b = kt,
                                   .ldb = ldt, .c = S, .ldc = T, .M = rows, .N = keys, .K = HS,
                                   .alpha = scale, .causal = OUT_MASKED, .r0 = r0});
            softmax_block_passes(A, T, r0, rows);
            /* O = P V */
            pack_rows(p16, Te, S, T, rows, keys);
            run_product(&(product){.a = p16, .a_row = Te, .a_pair = 2, .b = vp, .ldb = ldh,
                                   .c = O + (int64_t)r0 * ldq, .ldc = ldq, .M = rows, .N = HS,
                                   .K = keys, .alpha = 1.0f, .causal = SUM_TO_DIAGONAL, .r0 = r0});
        }
    }
}

/* ---- backward ------------------------------------------------------------- */

static size_t backward_bytes(int T, int HS) {
    int64_t rows = (int64_t)T * even(HS), pt = (int64_t)even(HS) * up16(T);
    int64_t ph = (int64_t)even(T) * up16(HS), blk = (int64_t)ROW_BLOCK * up16(T);
    int64_t blk_rows = (int64_t)ROW_BLOCK * even(T);
    return 2 * carve_size(rows) + carve_size(pt) + 3 * carve_size(ph) + 2 * carve_size(blk) +
           carve_size(blk_rows);
}

/* One task per (batch, kv head): the query heads of a group all add into the
 * same dK and dV, so they stay on one thread. */
static void backward_groups(void *p, int64_t begin, int64_t end, int chunk) {
    const attn_ctx *c = p;
    int T = c->T, HS = c->HS, ldq = c->NH * HS, ldkv = c->NKV * HS, group = c->NH / c->NKV;
    int HSe = even(HS), Te = even(T), ldt = 2 * up16(T), ldh = 2 * up16(HS);
    carver cv = {c->scratch + (size_t)chunk * c->per_chunk};
    keel_bf16 *v16 = carve(&cv, (int64_t)T * HSe), *do16 = carve(&cv, (int64_t)T * HSe);
    keel_bf16 *vt = carve(&cv, (int64_t)HSe * up16(T));
    keel_bf16 *kp = carve(&cv, (int64_t)Te * up16(HS)), *dop = carve(&cv, (int64_t)Te * up16(HS));
    keel_bf16 *qp = carve(&cv, (int64_t)Te * up16(HS));
    keel_bf16 *pp = carve(&cv, (int64_t)ROW_BLOCK * up16(T));
    keel_bf16 *dsp = carve(&cv, (int64_t)ROW_BLOCK * up16(T));
    keel_bf16 *ds16 = carve(&cv, (int64_t)ROW_BLOCK * Te);
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t bg = begin; bg < end; bg++) {
        int b = (int)(bg / c->NKV), g = (int)(bg % c->NKV);
        int64_t kvoff = (int64_t)b * T * ldkv + g * HS;
        for (int t = 0; t < T; t++) {
            memset(c->dk + kvoff + (int64_t)t * ldkv, 0, sizeof(float) * (size_t)HS);
            memset(c->dv + kvoff + (int64_t)t * ldkv, 0, sizeof(float) * (size_t)HS);
        }
        pack_rows(v16, HSe, c->v + kvoff, ldkv, T, HS);
        pack_pairs_t(vt, ldt, v16, HSe, T, HS);
        pack_pairs(kp, ldh, c->k + kvoff, ldkv, T, HS);
        for (int h = g * group; h < (g + 1) * group; h++) {
            int64_t qoff = (int64_t)b * T * ldq + h * HS;
            const float *A = c->att_in + ((int64_t)b * c->NH + h) * T * T;
            float *dA = c->datt + ((int64_t)b * c->NH + h) * T * T;
            pack_rows(do16, HSe, c->dout + qoff, ldq, T, HS);
            pack_pairs(dop, ldh, c->dout + qoff, ldq, T, HS);
            pack_pairs(qp, ldh, c->q + qoff, ldq, T, HS);
            for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
                int rows = T - r0 < ROW_BLOCK ? T - r0 : ROW_BLOCK, keys = r0 + rows;
                const float *Ab = A + (int64_t)r0 * T;
                float *dS = dA + (int64_t)r0 * T;
                /* dA = dO Vᵀ */
                run_product(&(product){.a = do16 + (int64_t)r0 * HSe, .a_row = HSe, .a_pair = 2,
                                       .b = vt, .ldb = ldt, .c = dS, .ldc = T, .M = rows,
                                       .N = keys, .K = HS, .alpha = 1.0f, .causal = OUT_MASKED,
                                       .r0 = r0});
                /* dV += Aᵀ dO: A's pairs of rows are Aᵀ's pairs along the sum */
                pack_pairs(pp, ldt, Ab, T, rows, keys);
                run_product(&(product){.a = pp, .a_row = 2, .a_pair = ldt,
                                       .b = dop + (int64_t)r0 / 2 * ldh, .ldb = ldh,
                                       .c = c->dv + kvoff, .ldc = ldkv, .M = keys,
                                       .N = HS, .K = rows, .alpha = 1.0f, .accumulate = true,
                                       .causal = SUM_FROM_DIAGONAL, .r0 = r0});
                softmax_backward_block(A, dA, T, r0, rows, scale);
                /* dQ = dS K */
                pack_rows(ds16, Te, dS, T, rows, keys);
                run_product(&(product){.a = ds16, .a_row = Te, .a_pair = 2, .b = kp, .ldb = ldh,
                                       .c = c->dq + qoff + (int64_t)r0 * ldq, .ldc = ldq, .M = rows,
                                       .N = HS, .K = keys, .alpha = 1.0f,
                                       .causal = SUM_TO_DIAGONAL, .r0 = r0});
                /* dK += dSᵀ Q */
                pack_pairs(dsp, ldt, dS, T, rows, keys);
                run_product(&(product){.a = dsp, .a_row = 2, .a_pair = ldt,
                                       .b = qp + (int64_t)r0 / 2 * ldh, .ldb = ldh,
                                       .c = c->dk + kvoff, .ldc = ldkv, .M = keys,
                                       .N = HS, .K = rows, .alpha = 1.0f, .accumulate = true,
                                       .causal = SUM_FROM_DIAGONAL, .r0 = r0});
            }
        }
    }
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

static size_t emulated_bytes(int T, int HS) {
    return sizeof(float) * ((size_t)4 * T * HS + (size_t)2 * ROW_BLOCK * T);
}

static void forward_heads_emulated(void *p, int64_t begin, int64_t end, int chunk) {
    const attn_ctx *c = p;
    int T = c->T, HS = c->HS, ldq = c->NH * HS, ldkv = c->NKV * HS, group = c->NH / c->NKV;
    float *q16 = (float *)(c->scratch + (size_t)chunk * c->per_chunk);
    float *k16 = q16 + (int64_t)T * HS, *v16 = k16 + (int64_t)T * HS, *p16 = v16 + (int64_t)T * HS;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t bh = begin; bh < end; bh++) {
        int b = (int)(bh / c->NH), h = (int)(bh % c->NH);
        float *O = c->out + (int64_t)b * T * ldq + h * HS;
        float *A = c->att + bh * T * T;
        round_rows(q16, c->q + (int64_t)b * T * ldq + h * HS, ldq, T, HS);
        round_rows(k16, c->k + (int64_t)b * T * ldkv + (h / group) * HS, ldkv, T, HS);
        round_rows(v16, c->v + (int64_t)b * T * ldkv + (h / group) * HS, ldkv, T, HS);
        for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
            int rows = T - r0 < ROW_BLOCK ? T - r0 : ROW_BLOCK, keys = r0 + rows;
            float *S = A + (int64_t)r0 * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, HS, scale,
                        q16 + (int64_t)r0 * HS, HS, k16, HS, 0.0f, S, T);
            softmax_block(A, T, r0, rows);
            round_rows(p16, S, T, rows, keys);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, keys, 1.0f, p16, keys,
                        v16, HS, 0.0f, O + (int64_t)r0 * ldq, ldq);
        }
    }
}

static void backward_groups_emulated(void *p, int64_t begin, int64_t end, int chunk) {
    const attn_ctx *c = p;
    int T = c->T, HS = c->HS, ldq = c->NH * HS, ldkv = c->NKV * HS, group = c->NH / c->NKV;
    float *k16 = (float *)(c->scratch + (size_t)chunk * c->per_chunk);
    float *v16 = k16 + (int64_t)T * HS, *q16 = v16 + (int64_t)T * HS, *do16 = q16 + (int64_t)T * HS;
    float *p16 = do16 + (int64_t)T * HS, *ds16 = p16 + (int64_t)ROW_BLOCK * T;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t bg = begin; bg < end; bg++) {
        int b = (int)(bg / c->NKV), g = (int)(bg % c->NKV);
        int64_t kvoff = (int64_t)b * T * ldkv + g * HS;
        for (int t = 0; t < T; t++) {
            memset(c->dk + kvoff + (int64_t)t * ldkv, 0, sizeof(float) * (size_t)HS);
            memset(c->dv + kvoff + (int64_t)t * ldkv, 0, sizeof(float) * (size_t)HS);
        }
        round_rows(k16, c->k + kvoff, ldkv, T, HS);
        round_rows(v16, c->v + kvoff, ldkv, T, HS);
        for (int h = g * group; h < (g + 1) * group; h++) {
            int64_t qoff = (int64_t)b * T * ldq + h * HS;
            const float *A = c->att_in + ((int64_t)b * c->NH + h) * T * T;
            float *dA = c->datt + ((int64_t)b * c->NH + h) * T * T;
            round_rows(q16, c->q + qoff, ldq, T, HS);
            round_rows(do16, c->dout + qoff, ldq, T, HS);
            for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
                int rows = T - r0 < ROW_BLOCK ? T - r0 : ROW_BLOCK, keys = r0 + rows;
                float *dS = dA + (int64_t)r0 * T;
                /* dA = dO Vᵀ ; dV += Aᵀ dO */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, HS, 1.0f,
                            do16 + (int64_t)r0 * HS, HS, v16, HS, 0.0f, dS, T);
                round_rows(p16, A + (int64_t)r0 * T, T, rows, keys);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, HS, rows, 1.0f, p16, keys,
                            do16 + (int64_t)r0 * HS, HS, 1.0f, c->dv + kvoff, ldkv);
                softmax_backward_block(A, dA, T, r0, rows, scale);
                /* dQ = dS K ; dK += dSᵀ Q */
                round_rows(ds16, dS, T, rows, keys);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, keys, 1.0f, ds16,
                            keys, k16, HS, 0.0f, c->dq + qoff + (int64_t)r0 * ldq, ldq);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, HS, rows, 1.0f, ds16, keys,
                            q16 + (int64_t)r0 * HS, HS, 1.0f, c->dk + kvoff, ldkv);
            }
        }
    }
}

static bool have_bf16(void) { return keel_isa_active() >= KEEL_ISA_AVX512_BF16; }

void keel_attention_forward_bf16(float *out, float *att, const float *q, const float *k,
                                 const float *v, int B, int T, int NH, int NKV, int HS) {
    bool native = have_bf16();
    size_t per = native ? forward_bytes(T, HS) : emulated_bytes(T, HS);
    attn_ctx c = {.out = out, .att = att, .q = q, .k = k, .v = v, .B = B, .T = T, .NH = NH,
                  .NKV = NKV, .HS = HS, .per_chunk = per};
    c.scratch = scratch_for(per, keel_pool_threads());
    keel_pool_for((int64_t)B * NH, 1, native ? forward_heads : forward_heads_emulated, &c);
}

void keel_attention_backward_bf16(float *dq, float *dk, float *dv, float *datt, const float *dout,
                                  const float *q, const float *k, const float *v, const float *att,
                                  int B, int T, int NH, int NKV, int HS) {
    bool native = have_bf16();
    size_t per = native ? backward_bytes(T, HS) : emulated_bytes(T, HS);
    attn_ctx c = {.dq = dq, .dk = dk, .dv = dv, .datt = datt, .dout = dout, .q = q, .k = k,
                  .v = v, .att_in = att, .B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS,
                  .per_chunk = per};
    c.scratch = scratch_for(per, keel_pool_threads());
    keel_pool_for((int64_t)B * NKV, 1, native ? backward_groups : backward_groups_emulated, &c);
}
