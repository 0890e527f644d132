/* kernels/xent.c: softmax cross-entropy over the vocabulary, fused with its gradient. */
#include <math.h>
#include <string.h>

#include "keel/kernels.h"
#include "kernels/simd.h"

typedef struct {
    float *logits;
    const int32_t *targets;
    int V;
    float dscale;
    double partial[64];
} xent_ctx;

/* The largest logit as keel_max finds it: max_ps(x, m) is x > m ? x : m,
 * keel_max's comparison, so NaNs behave the same. */
static float row_max(const float *z, int V) {
#ifdef __AVX2__
    if (V >= 8) {
        __m256 m = _mm256_loadu_ps(z);
        int j = 8;
        for (; j + 8 <= V; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(z + j), m);
        float lanes[8];
        _mm256_storeu_ps(lanes, m);
        float mx = keel_max(lanes, 8);
        for (; j < V; j++) mx = z[j] > mx ? z[j] : mx;
        return mx;
    }
#endif
    return keel_max(z, V);
}

/* exp of every logit vectorised (keel_expf8) on AVX2: scalar, the softmax
 * was 1.5% of a `small` step. */
static void rows(void *p, int64_t begin, int64_t end, int chunk) {
    xent_ctx *c = p;
    double loss = 0;
    for (int64_t i = begin; i < end; i++) {
        float *z = c->logits + i * c->V;
        int32_t y = c->targets[i];
        if (y < 0) { /* ignored (a masked target): no loss, no gradient */
            if (c->dscale != 0.0f) memset(z, 0, sizeof(float) * (size_t)c->V);
            continue;
        }
        float mx = row_max(z, c->V);
        float zy = z[y];
        /* With a gradient wanted, keep e^(z - max) in place for the second pass. */
        float acc[KEEL_LANES] = {0};
        int j = 0;
#ifdef __AVX2__
        /* lanes as the scalar loops below: acc[l] sums j = l mod 16 */
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps(), m8 = _mm256_set1_ps(mx);
        for (; j + KEEL_LANES <= c->V; j += KEEL_LANES) {
            __m256 e0 = keel_expf8(_mm256_sub_ps(_mm256_loadu_ps(z + j), m8));
            __m256 e1 = keel_expf8(_mm256_sub_ps(_mm256_loadu_ps(z + j + 8), m8));
            if (c->dscale != 0.0f) _mm256_storeu_ps(z + j, e0), _mm256_storeu_ps(z + j + 8, e1);
            lo = _mm256_add_ps(lo, e0), hi = _mm256_add_ps(hi, e1);
        }
        _mm256_storeu_ps(acc, lo);
        _mm256_storeu_ps(acc + 8, hi);
#endif
        if (c->dscale != 0.0f) {
            for (; j + KEEL_LANES <= c->V; j += KEEL_LANES)
                for (int l = 0; l < KEEL_LANES; l++) acc[l] += (z[j + l] = keel_expf(z[j + l] - mx));
            for (; j < c->V; j++) acc[0] += (z[j] = keel_expf(z[j] - mx));
        } else {
            for (; j + KEEL_LANES <= c->V; j += KEEL_LANES)
                for (int l = 0; l < KEEL_LANES; l++) acc[l] += keel_expf(z[j + l] - mx);
            for (; j < c->V; j++) acc[0] += keel_expf(z[j] - mx);
        }
        double sum = 0;
        for (int l = 0; l < KEEL_LANES; l++) sum += acc[l];
        loss += log(sum) + mx - zy;
        if (c->dscale != 0.0f) {
            float k = c->dscale / (float)sum;
            for (j = 0; j < c->V; j++) z[j] *= k;
            z[y] -= c->dscale;
        }
    }
    c->partial[chunk] += loss;
}

double keel_xent_forward_backward(float *logits, const int32_t *targets, int N, int V,
                                  float dscale) {
    xent_ctx c = {.logits = logits, .targets = targets, .V = V, .dscale = dscale};
    keel_pool_for(N, 8, rows, &c);
    double loss = 0;
    for (int i = 0; i < keel_pool_threads(); i++) loss += c.partial[i];
    return loss;
}
