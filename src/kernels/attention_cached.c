/* kernels/attention_cached.c: attention of new query rows against a KV cache,
 * for generation (keel_attention_cached in keel/kernels.h).
 *
 * Each (row, query head) is one task on keel's pool: its query meets the
 * keys 0..pos of its sequence a tile at a time with an online softmax (a
 * running max and sum, FlashAttention's), so no scores are stored and the
 * context may be as long as the cache. Decoding reads every cached key and
 * value once per head group: memory, not arithmetic, sets its time. Scores
 * come eight keys at a time and their exponentials eight lanes at a time
 * (keel_expf8): one dot product and one libm expf per key were 8% of a
 * batch-8 generation (perf), the most of it in prefill. The bf16 form keeps
 * keys and values in bf16 (rounded as stored, widened exactly as read): half
 * the bytes a decode row reads, and what training's bf16 attention rounds
 * them to as product inputs. */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "keel/kernels.h"
#include "kernels/simd.h"

enum { KEY_TILE = 64 };

typedef struct {
    float *out;
    const float *q;
    const void *kc, *vc; /* float, or keel_bf16 with bf16 */
    bool bf16;
    const int32_t *seq, *pos;
    int NH, NKV, HS, T_max;
    int64_t tasks;
    _Atomic int64_t next; /* the first task no thread has taken */
} cached_ctx;

/* The cache's element i (float, or bf16 widened: exact) */
static inline __attribute__((always_inline)) float cache_at(const void *c, int64_t i, bool bf16) {
    return bf16 ? keel_bf16_to_float(((const keel_bf16 *)c)[i]) : ((const float *)c)[i];
}
static inline __attribute__((always_inline)) __m256 cache8(const void *c, int64_t i, bool bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)c + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const keel_bf16 *)c + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* a · the cache's n elements from b, in eight partial sums the compiler vectorizes */
static inline __attribute__((always_inline)) float dot(const float *a, const void *c, int64_t b, int n, bool bf16) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * cache_at(c, b + i + j, bf16);
    float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) t += a[i] * cache_at(c, b + i, bf16);
    return t;
}

/* score[j] = scale * q · k_j for 8 keys k_j at c[k + j*stride], HS % 8 == 0: one
 * accumulator per key, the eight reduced together (hadd), so a key costs its
 * HS/8 FMAs and an eighth of a reduction, not a reduction of its own. */
static inline __attribute__((always_inline)) void scores8(float *score, const float *q, const void *c, int64_t k,
                                                          int64_t stride, int HS, float scale, bool bf16) {
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int d = 0; d < HS; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
        for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, cache8(c, k + j * stride + d, bf16), acc[j]);
    }
    __m256 s01 = _mm256_hadd_ps(acc[0], acc[1]), s23 = _mm256_hadd_ps(acc[2], acc[3]);
    __m256 s45 = _mm256_hadd_ps(acc[4], acc[5]), s67 = _mm256_hadd_ps(acc[6], acc[7]);
    __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67); /* halves of 0-3, 4-7 */
    __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
    _mm256_storeu_ps(score, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
}

/* w[j] = exp(score[j] - max) for j < n <= KEY_TILE, 8 at a time (keel_expf8,
 * as training's attention); the tail through a padded group. */
static void exps(float *w, const float *score, int n, float max) {
    __m256 m = _mm256_set1_ps(max);
    int j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(w + j, keel_expf8(_mm256_sub_ps(_mm256_loadu_ps(score + j), m)));
    if (j < n) {
        float in[8] = {0}, out[8];
        memcpy(in, score + j, sizeof(float) * (size_t)(n - j));
        _mm256_storeu_ps(out, keel_expf8(_mm256_sub_ps(_mm256_loadu_ps(in), m)));
        memcpy(w + j, out, sizeof(float) * (size_t)(n - j));
    }
}

/* Tasks are taken one at a time, not in fixed shares: a thread that loses its
 * core to other work for a while then takes fewer. */
static inline __attribute__((always_inline)) void attend_as(cached_ctx *c, bool bf16) {
    int HS = c->HS, group = c->NH / c->NKV;
    float scale = 1.0f / sqrtf((float)HS), score[KEY_TILE], weight[KEY_TILE];
    for (int64_t task; (task = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed)) < c->tasks;) {
        int64_t i = task / c->NH;
        int h = (int)(task % c->NH), kvh = h / group, last = c->pos[i];
        const float *q = c->q + (i * c->NH + h) * HS;
        int64_t base = ((int64_t)c->seq[i] * c->NKV + kvh) * c->T_max * HS; /* the head's keys, one after another */
        float *o = c->out + (i * c->NH + h) * HS;
        memset(o, 0, sizeof(float) * (size_t)HS);
        float run_max = -INFINITY, run_sum = 0;
        for (int j0 = 0; j0 <= last; j0 += KEY_TILE) {
            int n = last + 1 - j0 < KEY_TILE ? last + 1 - j0 : KEY_TILE, j = 0;
            int64_t k = base + (int64_t)j0 * HS;
            if (HS % 8 == 0)
                for (; j + 8 <= n; j += 8) scores8(score + j, q, c->kc, k + (int64_t)j * HS, HS, HS, scale, bf16);
            for (; j < n; j++) score[j] = scale * dot(q, c->kc, k + (int64_t)j * HS, HS, bf16);
            float tile_max = -INFINITY;
            for (j = 0; j < n; j++) tile_max = fmaxf(tile_max, score[j]);
            float new_max = fmaxf(run_max, tile_max), rescale = expf(run_max - new_max);
            if (rescale != 1.0f) {
                run_sum *= rescale;
                for (int d = 0; d < HS; d++) o[d] *= rescale;
            }
            exps(weight, score, n, new_max);
            for (j = 0; j < n; j++) {
                float w = weight[j];
                run_sum += w;
                int64_t v = base + (int64_t)(j0 + j) * HS;
                for (int d = 0; d < HS; d++) o[d] += w * cache_at(c->vc, v + d, bf16);
            }
            run_max = new_max;
        }
        float inv = 1.0f / run_sum;
        for (int d = 0; d < HS; d++) o[d] *= inv;
    }
}

static void attend(void *p, int64_t begin, int64_t end, int chunk) {
    (void)begin, (void)end, (void)chunk;
    cached_ctx *c = p;
    if (c->bf16) attend_as(c, true);
    else attend_as(c, false);
}

/* Every row's key and value into the cache first (a later row may read an
 * earlier one's), rounded to bf16 in a bf16 cache; then the rows attend. */
static void store_and_attend(float *out, const float *q, const float *k, const float *v, void *kcache, void *vcache,
                             bool bf16, const int32_t *seq, const int32_t *pos, int N, int NH, int NKV, int HS,
                             int T_max) {
    for (int i = 0; i < N; i++)
        for (int h = 0; h < NKV; h++) {
            size_t at = (((size_t)seq[i] * NKV + h) * T_max + (size_t)pos[i]) * HS, from = ((size_t)i * NKV + h) * HS;
            if (!bf16) {
                memcpy((float *)kcache + at, k + from, sizeof(float) * HS);
                memcpy((float *)vcache + at, v + from, sizeof(float) * HS);
            } else
                for (int d = 0; d < HS; d++) {
                    ((keel_bf16 *)kcache)[at + d] = keel_bf16_from_float(k[from + d]);
                    ((keel_bf16 *)vcache)[at + d] = keel_bf16_from_float(v[from + d]);
                }
        }
    cached_ctx c = {out, q, kcache, vcache, bf16, seq, pos, NH, NKV, HS, T_max, (int64_t)N * NH, 0};
    keel_pool_for(c.tasks < keel_pool_threads() ? c.tasks : keel_pool_threads(), 1, attend, &c);
}

void keel_attention_cached(float *out, const float *q, const float *k, const float *v, float *kcache, float *vcache,
                           const int32_t *seq, const int32_t *pos, int N, int NH, int NKV, int HS, int T_max) {
    store_and_attend(out, q, k, v, kcache, vcache, false, seq, pos, N, NH, NKV, HS, T_max);
}

void keel_attention_cached_bf16(float *out, const float *q, const float *k, const float *v, keel_bf16 *kcache,
                                keel_bf16 *vcache, const int32_t *seq, const int32_t *pos, int N, int NH, int NKV,
                                int HS, int T_max) {
    store_and_attend(out, q, k, v, kcache, vcache, true, seq, pos, N, NH, NKV, HS, T_max);
}
