/* kernels/adamw.c: AdamW (Loshchilov & Hutter 2019) in PyTorch's formulation,
 * plus the reductions the optimizer needs. */
#include <math.h>

#include "keel/kernels.h"

typedef struct {
    float *param, *m, *v;
    const float *grad;
    const keel_adamw_step *s;
    double partial[64];
} adam_ctx;

static void update_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    adam_ctx *c = p;
    const keel_adamw_step *s = c->s;
    float bc1 = 1.0f - powf(s->beta1, (float)s->t);
    float bc2_sqrt = sqrtf(1.0f - powf(s->beta2, (float)s->t));
    float step_size = s->lr / bc1, decay = 1.0f - s->lr * s->weight_decay;
    for (int64_t i = begin; i < end; i++) {
        float g = c->grad[i] * s->grad_scale;
        float m = c->m[i] = s->beta1 * c->m[i] + (1.0f - s->beta1) * g;
        float v = c->v[i] = s->beta2 * c->v[i] + (1.0f - s->beta2) * g * g;
        c->param[i] = c->param[i] * decay - step_size * m / (sqrtf(v) / bc2_sqrt + s->eps);
    }
}

void keel_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n,
                       const keel_adamw_step *s) {
    adam_ctx c = {.param = param, .m = m, .v = v, .grad = grad, .s = s};
    keel_pool_for(n, 1 << 14, update_range, &c);
}

static void sumsq_range(void *p, int64_t begin, int64_t end, int chunk) {
    adam_ctx *c = p;
    double total = 0;
    for (int64_t i = begin; i < end; i += 4096) { /* fp32 blocks, fp64 across blocks */
        int64_t stop = i + 4096 < end ? i + 4096 : end;
        float acc[16] = {0};
        int64_t j = i;
        for (; j + 16 <= stop; j += 16)
            for (int l = 0; l < 16; l++) acc[l] += c->grad[j + l] * c->grad[j + l];
        for (; j < stop; j++) acc[0] += c->grad[j] * c->grad[j];
        for (int l = 0; l < 16; l++) total += acc[l];
    }
    c->partial[chunk] = total;
}

double keel_sumsq(const float *x, int64_t n) {
    adam_ctx c = {.grad = x};
    keel_pool_for(n, 1 << 14, sumsq_range, &c);
    double s = 0;
    for (int i = 0; i < keel_pool_threads(); i++) s += c.partial[i];
    return s;
}
