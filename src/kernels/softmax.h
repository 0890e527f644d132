/* kernels/softmax.h: the fp32 softmax of flash attention (attention.c), one
 * (query block x key block) tile of scores at a time: the online softmax of
 * forward and its recomputation and gradient in backward (FlashAttention-2,
 * Dao 2023). Every path, fp32 and bf16, runs these same fp32 loops. */
#ifndef KEEL_KERNELS_SOFTMAX_H
#define KEEL_KERNELS_SOFTMAX_H

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/simd.h"

/* x[c] = exp(x[c] - sub) for c in [0, n). */
static inline void exp_minus(float *x, int n, float sub) {
    int c = 0;
    for (; c + 8 <= n; c += 8)
        _mm256_storeu_ps(x + c, keel_expf8(_mm256_sub_ps(_mm256_loadu_ps(x + c), _mm256_set1_ps(sub))));
    for (; c < n; c++) x[c] = keel_expf(x[c] - sub);
}

/* max and sum of x[0, n) over 16 lanes: GCC keeps a serial float reduction
 * scalar (without -ffast-math it may not reorder it), so lanes it is. */
static inline float lanes_max(const float *x, int n) {
    float mx[KEEL_LANES];
    int i = 0;
    for (int j = 0; j < KEEL_LANES; j++) mx[j] = x[0];
    for (; i + KEEL_LANES <= n; i += KEEL_LANES)
        for (int j = 0; j < KEEL_LANES; j++) mx[j] = x[i + j] > mx[j] ? x[i + j] : mx[j];
    for (; i < n; i++) mx[0] = x[i] > mx[0] ? x[i] : mx[0];
    return keel_max(mx, KEEL_LANES);
}
static inline float lanes_sum(const float *x, int n) {
    float acc[KEEL_LANES] = {0}, s = 0;
    int i = 0;
    for (; i + KEEL_LANES <= n; i += KEEL_LANES)
        for (int j = 0; j < KEEL_LANES; j++) acc[j] += x[i + j];
    for (int j = 0; j < KEEL_LANES; j++) s += acc[j];
    for (; i < n; i++) s += x[i];
    return s;
}

/* Keys that row r of a tile sees (the causal mask): the tile's first query is
 * `lead` positions past its first key, so row r sees keys c <= lead + r. */
static inline int keys_seen(int r, int keys, int lead) {
    return lead + r + 1 < keys ? lead + r + 1 : keys;
}

/* The first key of the tile that row r sees: with document masking (from:
 * each row's first visible key, as a key index; NULL: none) the keys before
 * from[r], the tile's first key being k0; clamped to [0, n]. */
static inline int key_from(const int32_t *from, int r, int k0, int n) {
    if (!from) return 0;
    int lo = from[r] - k0;
    return lo < 0 ? 0 : lo > n ? n : lo;
}

/* One key tile of the online softmax of a query block. S (rows, keys), row
 * stride lds, holds scaled scores; on return P = exp(S - m_new), exactly 0
 * where masked. m, l (rows) are each row's running max and sum of
 * exp(score - m) over the tiles so far; corr (rows) gets exp(m_old - m_new),
 * the factor for what was summed against m_old. first: the block's first
 * tile. Without `from` every row sees a key of every tile (the first holds
 * key 0). With it (document masking, key_from) a row may see none of a
 * tile: its P row is 0 and corr 1, m and l unchanged, or on the first tile
 * m = -inf and l = 0 ("nothing seen yet", so that its first keys start m and
 * l and no -inf ever reaches keel_expf, which clamps). */
static inline void online_softmax_tile(float *S, int64_t lds, int rows, int keys, int lead,
                                       bool first, const int32_t *from, int k0, float *m, float *l,
                                       float *corr) {
    for (int r = 0; r < rows; r++) {
        float *s = S + r * lds;
        int n = keys_seen(r, keys, lead), lo = key_from(from, r, k0, n);
        if (lo == n) { /* document masking: no key of this tile */
            memset(s, 0, sizeof(float) * (size_t)keys);
            corr[r] = 1.0f;
            if (first) m[r] = -INFINITY, l[r] = 0.0f;
            continue;
        }
        bool fresh = first || m[r] == -INFINITY;
        float mx = lanes_max(s + lo, n - lo);
        if (!fresh && m[r] > mx) mx = m[r];
        exp_minus(s + lo, n - lo, mx);
        memset(s, 0, sizeof(float) * (size_t)lo);
        memset(s + n, 0, sizeof(float) * (size_t)(keys - n));
        corr[r] = fresh ? 0.0f : keel_expf(m[r] - mx);
        l[r] = (fresh ? 0.0f : l[r] * corr[r]) + lanes_sum(s + lo, n - lo);
        m[r] = mx;
    }
}

/* Backward's P = exp(S - lse) for a tile of scores, in place, exactly 0
 * where masked (causally, and before from[r] with document masking): lse (rows) is each query's log-sum-exp from forward, so P is
 * the normalised probability without a second pass over the keys. */
static inline void softmax_recompute_tile(float *S, int64_t lds, int rows, int keys, int lead,
                                          const int32_t *from, int k0, const float *lse) {
    for (int r = 0; r < rows; r++) {
        float *s = S + r * lds;
        int n = keys_seen(r, keys, lead), lo = key_from(from, r, k0, n);
        exp_minus(s + lo, n - lo, lse[r]);
        memset(s, 0, sizeof(float) * (size_t)lo);
        memset(s + n, 0, sizeof(float) * (size_t)(keys - n));
    }
}

/* dS = scale · P ∘ (dP - D), in place over dP (rows, keys): D (rows) is
 * rowsum(dO ∘ O) = Σ_keys P ∘ dP over all key blocks, so one tile needs no
 * other. Masked entries stay 0 because P is 0 there. */
static inline void softmax_backward_tile(float *dP, const float *P, int64_t ld, int rows, int keys,
                                         const float *D, float scale) {
    for (int r = 0; r < rows; r++) {
        float *d = dP + r * ld;
        const float *p = P + r * ld;
        for (int c = 0; c < keys; c++) d[c] = scale * p[c] * (d[c] - D[r]);
    }
}

#endif
