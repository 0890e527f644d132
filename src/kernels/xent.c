/* kernels/xent.c: softmax cross-entropy over the vocabulary, fused with its gradient. */
#include <math.h>

#include "keel/kernels.h"
#include "kernels/simd.h"

typedef struct {
    float *logits;
    const int32_t *targets;
    int V;
    float dscale;
    double partial[64];
} xent_ctx;

static void rows(void *p, int64_t begin, int64_t end, int chunk) {
    xent_ctx *c = p;
    double loss = 0;
    for (int64_t i = begin; i < end; i++) {
        float *z = c->logits + i * c->V;
        float mx = keel_max(z, c->V);
        int32_t y = c->targets[i];
        float zy = z[y];
        /* With a gradient wanted, keep e^(z - max) in place for the second pass. */
        float acc[KEEL_LANES] = {0};
        int j = 0;
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
